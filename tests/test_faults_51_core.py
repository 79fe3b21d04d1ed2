"""Issue 51, the core's part: one rule for boolean options; ``lm.explain`` refusing what
``generate`` refuses; trainers that never return a steer with a value that is not finite;
the toy's ``concept_data(n=...)``; GGUF tensor names and provenance; the README's GGUF
section."""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

import steerlab as sl
from steerlab.core.errors import SamplingError, SiteError
from steerlab.core.request import Sampling
from steerlab.core.scalars import as_flag, flag
from steerlab.toy import ToyJudge, concept_data
from steerlab.train.loop import TrainingError, check_finite
from steerlab.vectors.io import VectorFileError

SITE = "blocks.2.hook_resid_pre"
PAIRS = [sl.Preference("The day was", " happy and bright.", " sad and cold.")]
NOT_FLAGS = ["no", "yes", "False", 0, 1, 1.0, None, np.int64(1), torch.tensor(1)]


# --- one rule for boolean options -------------------------------------------------------


@pytest.mark.parametrize("value", [True, False, np.bool_(True), np.bool_(False),
                                   torch.tensor(True), torch.tensor(False)])  # fmt: skip
def test_true_and_false_are_flags_in_every_form_and_come_back_plain(value):
    read = flag(value, "chat")
    assert type(read) is bool and read == bool(value)


@pytest.mark.parametrize("value", NOT_FLAGS)
def test_strings_and_numbers_are_never_read_by_their_truth_value(value):
    assert as_flag(value) is None
    with pytest.raises(sl.SteerError, match="chat must be True or False") as caught:
        flag(value, "chat")
    assert caught.value.field == "chat"


DOORS = {
    "generate": lambda lm, **kw: lm.generate("Once", max_new_tokens=2, **kw),
    "stream": lambda lm, **kw: next(lm.stream("Once", max_new_tokens=2, **kw)),
    "explain": lambda lm, **kw: lm.explain("Once", max_new_tokens=2, **kw),
}


@pytest.mark.parametrize("door", sorted(DOORS))
@pytest.mark.parametrize("option", ["chat", "use_cache", "keep_cache"])
@pytest.mark.parametrize("value", ["no", "yes", 0, 1])
def test_generate_stream_and_explain_refuse_a_flag_that_is_not_a_bool(toy_lm, door, option,
                                                                      value):  # fmt: skip
    with pytest.raises(sl.SteerError, match=f"{option} must be True or False"):
        DOORS[door](toy_lm, **{option: value})
    assert toy_lm.hook_count() == 0


def test_the_other_doors_refuse_a_flag_that_is_not_a_bool(toy_lm):
    with pytest.raises(sl.SteerError, match="last_only must be True or False"):
        toy_lm.logits("Once", last_only="no")
    for call in (lambda: toy_lm.logits("Once", chat="no"),
                 lambda: toy_lm.run_with_cache("Once", [SITE], chat=0),
                 lambda: sl.extract(toy_lm, ["a"], ["b"], sites=[SITE], chat="no"),
                 lambda: sl.train.preference_pairs(toy_lm, ["Hi"], [" there"], chat="yes")):  # fmt: skip
        with pytest.raises(sl.SteerError, match="chat must be True or False"):
            call()
    with pytest.raises(SamplingError, match="stop_at_eos must be True or False"):
        toy_lm.generate("Once", max_new_tokens=2, stop_at_eos="no")
    assert Sampling(stop_at_eos=np.bool_(False)).stop_at_eos is False  # read, and plain
    with pytest.raises(sl.SteerError, match="adaptive must be True or False"):
        sl.Rotate(90.0, torch.ones(toy_lm.d_model), adaptive="yes")
    with pytest.raises(sl.SteerError, match="compact must be True or False"):
        sl.stats.describe(torch.ones(3), compact="no")


def test_numpy_and_tensor_bools_read_as_the_bool_they_hold(toy_lm):
    plain = toy_lm.generate("Once", max_new_tokens=3, temperature=0.0, use_cache=False)
    numpy = toy_lm.generate("Once", max_new_tokens=3, temperature=0.0, use_cache=np.bool_(False),
                            chat=np.bool_(False), keep_cache=torch.tensor(False))  # fmt: skip
    assert numpy.text == plain.text and numpy.cache is None


def test_the_benchmark_takes_chat_true_false_or_none_only(toy_lm, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("computed before refusing")

    monkeypatch.setattr(type(toy_lm), "generate", never)
    data = sl.evals.ConceptData("happiness", positives=["Mia smiled."], negatives=["Mia cried."],
                                instructions=[f"Tell me story {k}." for k in range(4)])  # fmt: skip
    with pytest.raises(sl.SteerError, match="chat must be True or False; got the str 'no'"):
        sl.evals.benchmark(toy_lm, [data], ["random"], site=SITE, judge=ToyJudge(),
                           chat="no", progress=False)  # fmt: skip


# --- lm.explain refuses what generate refuses -------------------------------------------


@pytest.mark.parametrize(("options", "error", "names"), [
    ({"capture": 5}, SiteError, "capture"),
    ({"max_new_tokens": "8"}, SamplingError, "max_new_tokens"),
    ({"cache": 5}, TypeError, "cache must be a KVCache"),
    ({"compact": True}, TypeError, "'compact'"),
    ({"capture": [SITE], "use_cache": False}, ValueError, "capture needs use_cache=True"),
])  # fmt: skip
def test_explain_refuses_exactly_what_generate_refuses(options, error, names):
    fast = sl.load("steerlab-tiny", backend="hf").compile()  # compiles on first use only
    refusals = []
    for call in (fast.generate, fast.explain):
        with pytest.raises(error) as caught:
            call("Once", **options)
        refusals.append(str(caught.value).replace("stream()", "explain()"))
    assert names in refusals[0] and refusals[0] == refusals[1]
    assert fast.hook_count() == 0


def test_explain_of_engine_rows_runs_the_engines_own_checks(toy_lm):
    [request] = toy_lm._call("Once", None, {}, where="explain", chat=False, capture=(),
                             use_cache=True, cache=None, keep_cache=False, monitor=None)[1]  # fmt: skip
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        toy_lm.engine.explain([request], cache=5)
    with pytest.raises(sl.SteerError, match="compact must be True or False"):
        toy_lm.engine.explain([request], compact="no")
    with pytest.raises(TypeError, match="'temperature' belongs in the rows"):
        toy_lm.explain(request, temperature=0.5)


# --- trainers -----------------------------------------------------------------------------


@pytest.mark.parametrize("train", [
    lambda lm, **kw: sl.train.reps(lm, PAIRS, site=SITE, epochs=1, progress=False, **kw),
    lambda lm, **kw: sl.train.reft(lm, PAIRS, site=SITE, objective="reps", epochs=1,
                                   progress=False, **kw),
])  # fmt: skip
def test_suppress_no_is_refused_not_read_as_true(toy_lm, train):
    with pytest.raises(sl.SteerError, match="suppress must be True or False; got the str 'no'"):
        train(toy_lm, suppress="no")
    assert toy_lm.hook_count() == 0


def test_a_numpy_false_trains_without_suppression(toy_lm):
    def trained(suppress):
        vec, _ = sl.train.reps(toy_lm, PAIRS, site=SITE, epochs=1, progress=False,
                               suppress=suppress)  # fmt: skip
        return vec[SITE]

    assert torch.equal(trained(np.bool_(False)), trained(False))
    assert not torch.equal(trained(False), trained(True))


@pytest.mark.parametrize("train", [
    lambda lm: sl.train.reps(lm, PAIRS, site=SITE, epochs=1, lr=1e30, progress=False),
    lambda lm: sl.train.bipo(lm, PAIRS, site=SITE, epochs=1, lr=1e30, progress=False),
    lambda lm: sl.train.reft(lm, PAIRS, site=SITE, objective="reps", epochs=1, lr=1e30,
                             progress=False),
    lambda lm: sl.train.reft(lm, [sl.Example("Once upon a time", " there was a boat.")],
                             site=SITE, epochs=1, lr=1e30, progress=False),
])  # fmt: skip
def test_no_trainer_returns_a_steer_whose_norm_is_not_finite(toy_lm, train):
    """lr=1e30 leaves every value finite (1e30 < float32's max) and the norm inf."""
    with pytest.raises(TrainingError, match="norm past float32.*smaller lr"):
        train(toy_lm)
    assert toy_lm.hook_count() == 0


def test_reps_loss_refuses_a_zero_length():
    z = torch.zeros(2)
    for lengths in ((torch.tensor([0.0, 3.0]), torch.ones(2)), (torch.ones(2), torch.zeros(2)),
                    (torch.tensor([float("nan"), 1.0]), torch.ones(2))):  # fmt: skip
        with pytest.raises(sl.SteerError, match=r"length_[wl] must be token counts >= 1"):
            sl.train.reps_loss(z, z, z, z, *lengths)


@pytest.mark.parametrize(("factors", "match"), [
    ([1e308], r"factors holds 1e\+308, past float32's range"),
    ([2.0, -1e39], r"past float32's range"),
    ([1e20], r"factors up to 1e\+20 scale the starting vector .* past float32"),
])  # fmt: skip
def test_reps_refuses_factors_that_overflow_by_name_not_as_an_lr(toy_lm, factors, match):
    with pytest.raises(sl.SteerError, match=match) as caught:
        sl.train.reps(toy_lm, PAIRS, site=SITE, epochs=1, factors=factors, progress=False)
    assert "lr" not in str(caught.value)


def test_a_first_loss_that_is_not_finite_does_not_blame_the_lr():
    with pytest.raises(TrainingError, match="before any update, so not the lr") as caught:
        check_finite(torch.tensor(float("nan")), step=1, epoch=1)
    assert "smaller lr" not in str(caught.value)
    with pytest.raises(TrainingError, match="Try a smaller lr"):
        check_finite(torch.tensor(float("inf")), step=2, epoch=1)


# --- the toy's concept data -------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"n": 0}, "n"), ({"n": -1}, "n"), ({"n": 1.5}, "n"), ({"n": True}, "n"), ({"n": "3"}, "n"),
    ({"seed": "x"}, "seed"), ({"seed": 1.5}, "seed"),
])  # fmt: skip
def test_concept_data_refuses_a_bad_count_or_seed_by_name(toy_lm, kwargs, name):
    with pytest.raises(sl.SteerError, match=rf"^{name} must be an int") as caught:
        concept_data("sentiment", lm=toy_lm, **kwargs)
    assert caught.value.field == name


def test_concept_data_takes_a_numpy_count(toy_lm):
    data = concept_data("setting", lm=toy_lm, n=np.int64(2))
    assert len(data.positives) == len(data.negatives) == len(data.pairs) == 2


# --- GGUF -------------------------------------------------------------------------------


def _gguf_file(path: Path, tensors: dict[str, np.ndarray], **strings: str) -> Path:
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(path, "controlvector")
    writer.add_string("controlvector.model_hint", "steerlab-tiny")
    writer.add_uint32("controlvector.layer_count", len(tensors))
    for key, value in strings.items():
        writer.add_string(key, value)
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("name", ["direction.²", "direction.١", "direction.1x", "direction.",
                                  "direction.-1", "layer.1"])  # fmt: skip
def test_a_malformed_tensor_name_is_refused_naming_the_file_and_the_tensor(tmp_path, name):
    path = _gguf_file(tmp_path / "odd.gguf", {name: np.ones(128, np.float32)})
    with pytest.raises(VectorFileError) as caught:
        sl.SteeringVector.load(path)
    assert "odd.gguf" in str(caught.value) and repr(name) in str(caught.value)


def test_a_gguf_keeps_the_provenance_steerlab_wrote(toy_lm, tmp_path):
    gguf = pytest.importorskip("gguf")
    vec = sl.extract(toy_lm, ["The day was happy."], ["The day was sad."],
                     sites=[SITE, "blocks.3.hook_resid_post"], progress=False)  # fmt: skip
    trained = sl.SteeringVector(vec.directions, 1.0, sl.vectors.Provenance(
        **{**asdict(vec.provenance), "method": "reps", "training": '{"lr": 0.04, "steps": 3}'}))  # fmt: skip
    for original in (vec, trained):
        path = original.save(tmp_path / "v.gguf")
        back = sl.SteeringVector.load(path, model=toy_lm)
        assert asdict(back.provenance) == asdict(original.provenance)
        assert all(torch.equal(back[s], original[s]) for s in original.directions)
        reader = gguf.GGUFReader(path)  # the file still reads as llama.cpp's layout
        assert reader.get_field("general.architecture").contents() == "controlvector"
        assert sorted(t.name for t in reader.tensors) == ["direction.1", "direction.3"]
        assert reader.get_field("steerlab.method").contents() == original.provenance.method


@pytest.mark.parametrize(("strings", "match"), [
    ({"steerlab.colour": "red"}, r"'steerlab.colour', which steerlab does not write"),
    ({"steerlab.chat": "maybe"}, r"steerlab.chat: Expected true or false"),
    ({"steerlab.method": "__import__('os')"}, r"steerlab.method: Refusing metadata value"),
])  # fmt: skip
def test_steerlab_keys_that_steerlab_would_not_write_are_refused_by_name(tmp_path, strings,
                                                                       match):  # fmt: skip
    path = _gguf_file(tmp_path / "k.gguf", {"direction.1": np.ones(128, np.float32)}, **strings)
    with pytest.raises(VectorFileError, match=match):
        sl.SteeringVector.load(path)


# --- the README ---------------------------------------------------------------------------


def test_the_readmes_gguf_section_opens_with_a_call_that_works_and_llama_cpps_flag():
    text = (Path(__file__).parents[1] / "README.md").read_text()
    section = text[text.index("## Control vectors for llama.cpp") :]
    section = section[: section.index("\n## ", 5)]
    opening = re.search(r"`([^`]*\.save\(\"happy\.gguf\"\))`", section)
    assert opening is not None and opening.group(1).startswith('vec.at("blocks.2.hook_resid_pre")')
    assert "--control-vector-scaled FNAME:SCALE" in section and "FILE SCALE" not in section
