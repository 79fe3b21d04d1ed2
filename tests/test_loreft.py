"""``sl.LoReFT``: the op against the ReFT formula, as a steer, its files, pyreft import,
the server (inline data and presets) and the bad inputs it refuses before any compute.

Parity with plain hooks at every site kind and position rule is ``engine_parity.py``'s
``loreft-*`` cases, on every engine."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest
import torch
from reference import RefSteer, greedy, logprobs
from server_helpers import post, served

import steerlab as sl
from steerlab.core.ops import op_from_data, op_to_data
from steerlab.core.steer import steer_data, steer_from_data

SITE = "blocks.2.hook_resid_post"
PROMPTS = ["Once upon a time", "The happy fox"]


def parts(seed: int = 0, rank: int = 4, d: int = 128):
    g = torch.Generator().manual_seed(seed)
    R = torch.linalg.qr(torch.randn(d, rank, generator=g))[0].T.contiguous()
    return R, 0.3 * torch.randn(rank, d, generator=g), 8.0 * torch.randn(rank, generator=g)


@pytest.fixture(scope="module")
def reft() -> sl.LoReFT:
    return sl.LoReFT(SITE, *parts(), positions="first:3+last:3")


def test_the_op_is_the_formula_and_alpha_zero_changes_nothing(reft):
    R, W, b = (t.double() for t in parts())
    h = torch.randn(5, 128, dtype=torch.float64)
    want = h + 0.5 * (h @ W.T + b - h @ R.T) @ R  # Φ(h) = h + α·Rᵀ(W h + b − R h)
    op = sl.LoReFT(SITE, R, W, b)
    got = op(h, R[0], torch.full((5, 1), 0.5, dtype=torch.float64))
    assert torch.allclose(got, want, atol=1e-12)
    assert torch.equal(op(h, R[0], torch.zeros(5, 1, dtype=torch.float64)), h)
    outside = h - (h @ R.T) @ R  # the orthogonal complement of R's rows is untouched
    assert torch.allclose(got - (got @ R.T) @ R, outside, atol=1e-5)  # R: float32-orthonormal


def test_it_is_a_steer_and_scaling_scales_its_alpha(toy_lm, toy_hf, reft):
    ids = [toy_lm.tokenizer(p)["input_ids"] for p in PROMPTS]
    for scaled, alpha in ((reft, 1.0), (reft * 0.5, 0.5), (-reft, -1.0)):
        got = toy_lm.generate(PROMPTS, steer=scaled, max_new_tokens=8, stop_at_eos=False).tokens
        ref = RefSteer(SITE, parts()[0][0], alpha, "first:3+last:3", "loreft", reft=parts())
        assert got == [greedy(toy_hf, i, [ref], 8, set()) for i in ids]
    plain = toy_lm.generate(PROMPTS, max_new_tokens=8, stop_at_eos=False).tokens
    assert toy_lm.generate(PROMPTS, steer=reft * 0, max_new_tokens=8, stop_at_eos=False).tokens \
        == plain  # fmt: skip
    assert toy_lm.hook_count() == 0


def test_equality_is_by_content_and_the_data_form_round_trips(reft):
    again = sl.LoReFT(SITE, *(t.clone() for t in parts()), positions="last:3+first:3")
    assert again == reft and hash(again) == hash(reft)
    assert reft * 2 != reft
    assert op_from_data(json.loads(json.dumps(op_to_data(reft)))) == reft
    (steer,) = reft.steers()
    data = steer_from_data(json.loads(json.dumps(steer.to_data())))
    assert data.op == reft and data.positions == "first:3+last:3"


def test_save_and_load_are_safetensors_with_json(tmp_path, toy_lm, reft):
    path = reft.save(tmp_path / "happy.reft.safetensors")
    assert path.read_bytes()[8:9] == b"{"  # a safetensors JSON header, not a pickle
    loaded = sl.LoReFT.load(path, model=toy_lm)
    assert loaded == reft and loaded.positions == reft.positions
    wider = sl.LoReFT(SITE, *parts(d=64))
    wider.save(tmp_path / "wide.reft.safetensors")
    with pytest.raises(sl.SteerError, match="d_model=128"):
        sl.LoReFT.load(tmp_path / "wide.reft.safetensors", model=toy_lm)
    (tmp_path / "junk.reft.safetensors").write_bytes(b"not a file")
    with pytest.raises(sl.SteerError, match="not a safetensors"):
        sl.LoReFT.load(tmp_path / "junk.reft.safetensors")


def _pyreft_folder(tmp_path, payload) -> str:
    folder = tmp_path / "pyreft"
    folder.mkdir(parents=True)
    torch.save(payload, folder / "intkey_layer_2_comp_block_output_unit_pos_nunit_1#0.bin")
    config = {"representations": [{"layer": 2, "component": "block_output"}]}
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_pyreft_checkpoints_need_trust_pickle_and_load_weights_only(tmp_path, toy_lm):
    R, W, b = parts()
    folder = _pyreft_folder(tmp_path, {"weight": W, "bias": b, "rotate_layer": R.T.clone()})
    with pytest.raises(sl.SteerError, match="trust_pickle=True"):
        sl.LoReFT.from_pyreft(folder)
    got = sl.LoReFT.from_pyreft(folder, trust_pickle=True, positions="f3+l3", model=toy_lm)
    assert got.site == SITE and torch.equal(got.R, R) and torch.equal(got.W, W)
    evil = _pyreft_folder(tmp_path / "x", {"weight": W, "payload": Namespace(a=1)})
    with pytest.raises(sl.SteerError, match="not a plain tensor checkpoint"):
        sl.LoReFT.from_pyreft(evil, trust_pickle=True, positions="f3+l3")


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda R, W, b: sl.LoReFT(SITE, R[:0], W[:0], b[:0]), "rank >= 1"),
        (lambda R, W, b: sl.LoReFT(SITE, torch.eye(5, 4), torch.zeros(5, 4), torch.zeros(5)),
         "rank 5 is above d_model 4"),
        (lambda R, W, b: sl.LoReFT(SITE, 1.01 * R, W, b), "orthonormal"),
        (lambda R, W, b: sl.LoReFT(SITE, R, W[:, :64], b), "W must be"),
        (lambda R, W, b: sl.LoReFT(SITE, R, W, b, positions="first:0"), "positions"),
        (lambda R, W, b: sl.LoReFT(SITE, R, W, b * float("nan")), "NaN"),
    ],
)  # fmt: skip
def test_bad_parts_are_refused_by_name(make, match):
    with pytest.raises(sl.SteerError, match=match):
        make(*parts())


def test_a_slightly_off_R_within_the_tolerance_is_accepted():
    R, W, b = parts()
    sl.LoReFT(SITE, R * (1 + 4e-4), W, b)  # R Rᵀ off by ~8e-4 < 1e-3


def test_another_width_or_site_is_refused_before_any_compute(toy_lm):
    narrow = sl.LoReFT(SITE, *parts(d=64))
    with pytest.raises(sl.SteerError, match="d_model=128"):
        toy_lm.generate("Hi", steer=narrow, max_new_tokens=2)
    with pytest.raises(sl.SteerError, match="trained at"):
        sl.Steer("blocks.1.hook_resid_post", parts()[0][0], op=sl.LoReFT(SITE, *parts()))
    assert toy_lm.hook_count() == 0


def test_the_server_takes_it_inline_and_as_a_preset(tmp_path, toy_lm, toy_hf, reft):
    from steerlab.server.cli import _presets

    reft.save(tmp_path / "happy.reft.safetensors")
    (preset,) = _presets(toy_lm, [("happy", str(tmp_path / "happy.reft.safetensors"), 0.5)])
    ids = toy_lm.tokenizer("The happy fox ran to the sea")["input_ids"]
    want = logprobs(toy_hf, ids, [RefSteer(SITE, parts()[0][0], 0.5, "first:3+last:3",
                                           "loreft", reft=parts())])  # fmt: skip
    body = {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0}
    (steer,) = (reft * 0.5).steers()
    inline = {**steer.to_data(), "alpha": 0.5}
    with served(toy_lm, presets=[preset]) as url:
        by_preset = post(url, "/v1/completions", {**body, "model": "happy"}).json()
        by_data = post(
            url, "/v1/completions", {**body, "model": "steerlab-tiny", "steering": [inline]}
        ).json()
    assert "choices" in by_preset and "choices" in by_data, (by_preset, by_data)
    for got in (by_preset, by_data):
        values = got["choices"][0]["logprobs"]["token_logprobs"]
        for t in range(1, len(ids)):
            assert values[t] == pytest.approx(float(want[t - 1, ids[t]]), abs=1e-4)


def test_the_wire_format_carries_a_span(reft):
    data = steer_data(SITE, parts()[0][0], 1.0, "last:2", reft)
    assert steer_from_data(data).positions == "last:2"
