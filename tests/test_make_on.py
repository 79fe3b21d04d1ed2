"""``benchmark(..., make_on=)``: steers made on one model, generated on another with the same
weights; and ``make_on`` with other weights refused before any compute.

On vLLM (``tests_vllm/test_benchmark.py``) the generating model is a vLLM engine; here both
are in-process, so the run without ``make_on`` is the reference: the same steers, texts,
tables and detection."""

from __future__ import annotations

import copy

import pytest
import torch

import steerlab as sl
import steerlab.toy as toy
from steerlab.evals.make_on import check_make_on

SITE = "blocks.2.hook_resid_pre"


@pytest.fixture(scope="module")
def data(toy_lm):
    return toy.concept_data("sentiment", lm=toy_lm, n=4)


def _run(lm, data, **kwargs):
    return sl.evals.benchmark(lm, data, ["mean_diff", "random", "prompt"], site=SITE,
                              judge=toy.ToyJudge(), max_new_tokens=6, temperature=0.0,
                              n_boot=50, progress=False, **kwargs)  # fmt: skip


def test_steers_made_on_another_model_with_the_same_weights_give_the_same_run(toy_lm, data):
    other = sl.load("steerlab-tiny", backend="hf")  # its own copy of the weights
    reference = _run(toy_lm, data)
    made_elsewhere = _run(toy_lm, data, make_on=other)
    assert [s["text"] for s in made_elsewhere.samples] == [s["text"] for s in reference.samples]
    assert list(made_elsewhere.table) == list(reference.table)
    assert list(made_elsewhere.detection) == list(reference.detection)
    assert len(reference.detection) == 2  # mean_diff and random: one direction each
    for key, steer in reference.steers.items():
        if steer is not None:
            assert made_elsewhere.steers[key].sha256 == steer.sha256


def _wrapped(lm, change):
    model = copy.deepcopy(lm.model)
    with torch.no_grad():
        change(model)
    return sl.wrap(model, lm.tokenizer)


def test_make_on_with_other_weights_is_refused_before_any_compute(toy_lm, data, monkeypatch):
    def noise(model):  # one block's MLP re-drawn: the same config, other weights
        fc = model.transformer.h[1].mlp.c_fc.weight
        fc.copy_(torch.randn(fc.shape, generator=torch.Generator().manual_seed(0)) * fc.std())

    other = _wrapped(toy_lm, noise)
    assert other.config_sha256 == toy_lm.config_sha256  # only the weights tell them apart
    monkeypatch.setattr(toy_lm, "generate", lambda *a, **k: pytest.fail("generated"))
    with pytest.raises(sl.SteerError, match=r"make_on has other weights.*probe.*nats"):
        _run(toy_lm, data, make_on=other)


def test_the_same_weights_in_another_object_pass_the_check(toy_lm):
    check_make_on(toy_lm, _wrapped(toy_lm, lambda model: None))


def test_make_on_with_another_config_or_not_a_model_is_refused(toy_lm, tiny_dirs):
    tiny = sl.load(tiny_dirs["gpt2"], backend="hf")
    with pytest.raises(sl.SteerError, match=r"configs differ"):
        check_make_on(toy_lm, tiny)
    with pytest.raises(sl.SteerError, match=r"make_on must be an in-process"):
        check_make_on(toy_lm, "steerlab-tiny")
