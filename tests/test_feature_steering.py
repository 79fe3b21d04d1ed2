"""SAE features as steering directions: ``sae.feature(i)`` and ``sae.clamp(i, value)`` on the
TransformerLens backends and through the server, each against plain transformers with torch
hooks (``reference.py``); the clamp's feature read against SAELens's own ``encode``; and the
clamp's bad inputs. The hf backend, eager and compiled, runs the same cases in
``test_engine_parity.py``, vLLM in ``tests_vllm/test_parity.py``."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch
from engine_parity import CASES, NEW, PROMPTS, check_case, prompt_ids, toy_sae
from helpers import load_tiny
from reference import greedy
from server_helpers import KEY, served

import steerlab as sl
from steerlab.core.errors import ModelMismatchWarning
from steerlab.core.ops import (
    FeatureClamp,
    SteerError,
    op_from_data,
    op_tensors,
    op_to_data,
    tensor_fingerprint,
)
from steerlab.features import SAEError
from steerlab.server import Limits

FEATURE_CASES = ["feature-add", "feature-clamp-standard", "feature-clamp-jumprelu",
                 "feature-clamp-topk"]  # fmt: skip


@pytest.fixture(scope="module", params=["hooked", "bridge"])
def lens(request):
    return sl.load("steerlab-tiny", backend=request.param)


@pytest.mark.parametrize("name", FEATURE_CASES)
def test_feature_steers_on_the_lens_backends_equal_plain_hooks(lens, toy_hf, name):
    check_case(lens, toy_hf, name)


@pytest.mark.parametrize("name", FEATURE_CASES)
def test_feature_steers_through_the_server_equal_plain_hooks(toy_lm, toy_hf, name):
    case = CASES[name]
    sae = toy_sae(case.sae or "standard")
    if case.op == "feature_clamp":
        steer = sae.clamp(case.seed, case.value, alpha=case.alpha, positions=case.positions)
    else:
        steer = sl.Steer(sae.site, sae.feature(case.seed), alpha=case.alpha)
    limits = Limits(max_n=4, max_rows=32, max_body_bytes=4 << 20)  # a topk clamp's encoder
    with served(toy_lm, limits=limits) as url:
        remote = sl.connect(url, api_key=KEY)
        got = remote.generate(PROMPTS, steer=steer, max_new_tokens=NEW, stop_at_eos=False)
        assert remote.hook_count() == 0
    want = [greedy(toy_hf, list(prompt_ids(toy_lm, p)), [case.ref()], NEW, set()) for p in PROMPTS]
    assert got.tokens == want


def test_the_toy_feature_clamp_steers_for_real(toy_lm):
    """The cases above would pass on an engine that ignored the clamp if it changed nothing."""
    sae = toy_sae("standard")
    plain = toy_lm.generate(PROMPTS, max_new_tokens=NEW, stop_at_eos=False).tokens
    clamped = toy_lm.generate(PROMPTS, steer=sae.clamp(499, 10.0), max_new_tokens=NEW,
                            stop_at_eos=False).tokens  # fmt: skip
    assert clamped != plain


def test_alpha_zero_is_bit_identical_and_leaves_no_hook(toy_lm):
    sae = toy_sae("topk")
    x = torch.randn(5, sae.d_in, generator=torch.Generator().manual_seed(0))
    steer = sae.clamp(7, 3.0)
    assert torch.equal(steer.op(x, steer.vector, torch.zeros(5, 1)), x)
    caught = toy_lm.run_with_cache(PROMPTS[0], sites=[sae.site])
    again = toy_lm.run_with_cache(PROMPTS[0], sites=[sae.site])
    assert torch.equal(caught[sae.site], again[sae.site])
    assert toy_lm.hook_count() == 0


sae_lens = pytest.importorskip("sae_lens")


def _lens(architecture: str, **extra):
    cfg = {
        "architecture": architecture, "d_in": 16, "d_sae": 40, "dtype": "float32",
        "device": "cpu", "apply_b_dec_to_input": True,
        "metadata": {"hook_name": "blocks.1.hook_resid_pre", "model_name": "tiny"}, **extra,
    }  # fmt: skip
    lens = sae_lens.SAE.from_dict(cfg)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in lens.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(noise.abs() * 0.5 if name == "threshold" else noise)
    return lens


ARCHS = [("standard", {}), ("jumprelu", {}), ("topk", {"k": 6}),
         ("topk", {"k": 6, "rescale_acts_by_decoder_norm": True})]  # fmt: skip


@pytest.mark.parametrize(("architecture", "extra"), ARCHS)
def test_the_clamp_reads_and_sets_the_feature_as_saelens_encodes_and_decodes_it(
    tmp_path, architecture, extra
):
    """With alpha 1 the clamp adds exactly what SAELens's decode changes when the feature
    alone is set to ``value``: ``decode(f with f_i = value) - decode(f)``."""
    lens = _lens(architecture, **extra)
    lens.save_model(tmp_path / "sae")
    sae = sl.load_sae(tmp_path / "sae")
    x = 2 * torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        f = lens.encode(x)
    i = int((f > 0).float().sum(0).argmax())  # a feature active on many rows, and off on some
    steer = sae.clamp(i, 5.0)
    assert isinstance(steer.op, FeatureClamp)
    torch.testing.assert_close(steer.op.feature(x), f[:, i], atol=1e-6, rtol=1e-5)
    set_to = f.clone()
    set_to[:, i] = 5.0
    with torch.no_grad():
        want = x + lens.decode(set_to) - lens.decode(f)
    got = steer.op(x, steer.vector, torch.ones(64, 1))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_data_form_round_trips_and_keys_tensors_once():
    sae = toy_sae("jumprelu")
    op = sae.clamp(3, 2.5).op
    assert op_from_data(op_to_data(op)) == op  # tensors inline, as a request body holds them
    keyed = op_to_data(op, tensor_fingerprint)  # as vLLM's workers get it
    sent = op_tensors(op)
    assert {keyed[n] for n in ("encoder", "bias", "b_dec_in")} == set(sent)
    assert keyed["dtype"] == "float32" and keyed["sae"] == sae.content_hash
    assert keyed["threshold"] == pytest.approx(0.4) and keyed["index"] == 3
    assert op_from_data(keyed, sent) == op
    assert torch.equal(op_from_data(keyed, sent).encoder, sae.W_enc[:, 3])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"value": float("nan")}, "value must be finite"),
        ({"index": -1}, "index must be an int >= 0"),
        ({"architecture": "gated"}, "architecture must be one of"),
        ({"encoder": [[1.0, 2.0]]}, "encoder must be 1-D"),
        ({"encoder": [1.0, float("inf")]}, "encoder has NaN or inf"),
        ({"b_dec_in": [0.0] * 3}, "b_dec_in has 3 entries"),
        ({"encoder": "abc"}, "encoder must be numbers"),
        ({"dtype": "int8"}, "dtype must name a torch floating dtype"),
        ({"k": 4}, "k and decoder_norms are topk settings"),
    ],
)
def test_bad_clamp_data_is_refused_by_name(change, message):
    data = {"name": "feature_clamp", "value": 1.0, "index": 0, "encoder": [1.0, 0.0],
            "bias": 0.0, "b_dec_in": [0.0, 0.0], **change}  # fmt: skip
    with pytest.raises(SteerError, match=message):
        op_from_data(data)


def test_bad_clamp_requests_fail_before_any_compute(toy_lm):
    sae = toy_sae("standard")
    with pytest.raises(SAEError, match="out of range"):
        sae.clamp(sae.d_sae, 1.0)
    with pytest.raises(SteerError, match="value must be a number"):
        sae.clamp(1, "big")  # type: ignore[arg-type]
    with pytest.raises(SteerError, match="positions must be"):
        sae.clamp(1, 1.0, positions="middle")  # type: ignore[arg-type]
    wide = sae.clamp(1, 1.0).op
    with pytest.raises(SteerError, match="the SAE and the vector do not match"):
        sl.Steer(sae.site, torch.ones(64), op=wide)
    with pytest.raises(SteerError, match="SAE trained at blocks.2.hook_resid_pre; it cannot"):
        sl.Steer("blocks.9.hook_resid_pre", sae.W_dec[1], op=wide)
    with pytest.raises(sl.SiteError):
        toy_lm.generate("Hi", steer=sl.Steer("blocks.9.hook_resid_pre", sae.W_dec[1]),
                        max_new_tokens=2)  # fmt: skip
    assert toy_lm.hook_count() == 0


def test_a_feature_clamp_at_another_site_is_refused_everywhere(toy_lm):
    """The op knows its SAE's site: a Steer, a data form and a request elsewhere are refused."""
    sae = toy_sae("standard")
    op = sae.clamp(3, 20.0).op
    assert op.site == sae.site
    for site in ("blocks.1.hook_resid_pre", "blocks.2.hook_resid_post"):
        with pytest.raises(SteerError, match=f"cannot steer at {site}"):
            sl.Steer(site, sae.W_dec[3], op=op)
        with pytest.raises(SteerError, match=f"cannot steer at {site}"):
            sl.Steer(site, sae.W_dec[3], op=op_from_data(op.to_data()))
    assert toy_lm.hook_count() == 0


def test_a_feature_on_a_model_of_another_width_is_refused_before_compute(tiny_dirs):
    other = load_tiny(tiny_dirs, "gpt2", "hf")  # d_model 64; the toy SAE reads 128
    sae = toy_sae("standard")
    for steer in (sae.clamp(1, 1.0), sl.Steer(sae.site, sae.feature(1))):
        with pytest.raises(SteerError, match="d_model=64"):
            other.generate("Hi", steer=steer, max_new_tokens=2)
    assert other.hook_count() == 0


def test_steering_with_a_feature_made_on_another_model_warns(toy_lm):
    sae = toy_sae("standard")
    other = replace(sae, model_name="gpt2-small")
    with pytest.warns(ModelMismatchWarning, match="made on 'gpt2-small'"):
        toy_lm.generate("Hi", steer=other.clamp(1, 1.0), max_new_tokens=2)
    with pytest.warns(ModelMismatchWarning, match="made on 'gpt2-small'"):
        toy_lm.generate("Hi", steer=sl.Steer(other.site, other.feature(1)), max_new_tokens=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the toy SAE on its own model: no word
        toy_lm.generate("Hi", steer=sae.clamp(1, 1.0), max_new_tokens=2)


def test_a_model_mismatch_warning_points_at_the_users_line(toy_lm, tmp_path):
    """Not at steerlab/model.py: at the line that called steerlab, on every path."""
    other = replace(toy_sae("standard"), model_name="gpt2-small")
    calls = {
        "generate": lambda: toy_lm.generate("Hi", steer=other.clamp(1, 1.0), max_new_tokens=2),
        "stream": lambda: list(
            toy_lm.stream("Hi", sl.Steer(other.site, other.feature(1)), max_new_tokens=2)
        ),  # fmt: skip
        "features": lambda: toy_lm.features("Hi", other),
    }
    for name, call in calls.items():
        with pytest.warns(ModelMismatchWarning) as record:
            call()
        assert {w.filename for w in record} == {__file__}, name
    vec = sl.extract(toy_lm, ["I was happy."], ["I was sad."], [other.site], progress=False)
    path = vec.save(tmp_path / "v.safetensors")  # made on steerlab-tiny
    with pytest.warns(ModelMismatchWarning) as record:
        sl.SteeringVector.load(path, model=_renamed(toy_lm, "gpt2-small"))
    assert {w.filename for w in record} == {__file__}


def _renamed(lm, name):
    class Renamed:  # what load checks: name, width and sites
        d_model = lm.d_model

        def sites(self):
            return lm.sites()

    renamed = Renamed()
    renamed.name = name
    return renamed


def test_dataclasses_replace_moves_a_steer_and_keeps_its_source_model(toy_lm):
    sae = replace(toy_sae("standard"), model_name="gpt2-small")
    steer = sl.Steer(sae.site, sae.feature(1), alpha=2.0)
    moved = replace(steer, site="blocks.1.hook_resid_pre")
    assert steer.made_for.name == "gpt2-small"
    assert (moved.site, moved.alpha, moved.made_for) == (
        "blocks.1.hook_resid_pre",
        (2.0,),
        steer.made_for,
    )
    assert torch.equal(moved.vector, steer.vector)
    clamp = toy_sae("standard").clamp(1, 20.0)
    assert replace(clamp, alpha=[0.0, 1.0]).alpha == (0.0, 1.0)
