"""``sl.evals.benchmark`` on vLLM: a method and concept's rows (instructions x factors, per-row
alphas) are one vLLM call, and give the hf backend's texts, greedy."""

from __future__ import annotations

import pytest

import steerlab as sl
import steerlab.toy as toy
from steerlab.evals.methods import BUILT_IN

SITE = "blocks.2.hook_resid_pre"


def test_the_benchmark_generates_on_vllm_as_on_hf(lm):
    hf = sl.load("steerlab-tiny", backend="hf")
    data = toy.concept_data("sentiment", lm=hf, n=8)
    vec = sl.extract(hf, list(data.positives), list(data.negatives), [SITE], token="mean",
                     progress=False).normalized() * 8.0  # fmt: skip
    method = sl.evals.Method("fixed", make=lambda lm, d, site: vec, factors=[0.0, 0.5, 1.0])
    judge = toy.ToyJudge(hf)
    runs = [sl.evals.benchmark(model, data, [method, sl.evals.Prompting("Tell me a happy story.")],
                               site=SITE, judge=judge, max_new_tokens=16, temperature=0.0,
                               progress=False)
            for model in (hf, lm)]  # fmt: skip
    texts = [[(s["method"], s["factor"], s["instruction"], s["text"]) for s in r.samples]
             for r in runs]  # fmt: skip
    assert texts[0] == texts[1]
    assert len(texts[0]) == 10 * 3 + 10
    assert [r["score"] for r in runs[0].table] == [r["score"] for r in runs[1].table]
    assert len(runs[1].detection) == 0 and "not measured" in runs[1].detection.title


def test_methods_that_read_activations_or_train_are_refused_up_front_on_vllm(lm):
    data = toy.concept_data("sentiment", lm=sl.load("steerlab-tiny", backend="hf"), n=4)
    with pytest.raises(sl.SteerError, match=r"\['mean_diff', 'reps'\].*in-process"):
        sl.evals.benchmark(lm, data, ["mean_diff", "reps", "prompt"], site=SITE,
                           judge=toy.ToyJudge(), progress=False)  # fmt: skip


def test_every_built_in_method_made_in_process_generates_on_vllm_as_on_hf(lm):
    """``make_on=``: each built-in method (extraction, BiPO, RePS, both LoReFTs, random)
    makes its steer on the hf backend and generates on vLLM: the texts, the tables and the
    detection equal an all-hf run's, greedy."""
    hf = sl.load("steerlab-tiny", backend="hf")
    data = toy.concept_data("sentiment", lm=hf, n=4)
    judge = toy.ToyJudge(hf)
    methods = list(BUILT_IN)
    runs = [sl.evals.benchmark(model, data, methods, site=SITE, judge=judge, max_new_tokens=8,
                               temperature=0.0, n_boot=50, progress=False, **extra)
            for model, extra in ((hf, {}), (lm, {"make_on": hf}))]  # fmt: skip
    texts = [[(s["method"], s["factor"], s["instruction"], s["text"]) for s in r.samples]
             for r in runs]  # fmt: skip
    assert texts[0] == texts[1]
    assert list(runs[0].table) == list(runs[1].table)
    assert list(runs[0].detection) == list(runs[1].detection) and len(runs[1].detection) > 0
    # every steer acted: at its largest factor, some text differs from the unsteered one
    plain = dict(zip(data.instructions, hf.generate(list(data.instructions), max_new_tokens=8,
                                                    temperature=0.0).text))  # fmt: skip
    for method in (m for m in methods if m != "prompt"):
        top = max(s["factor"] for s in runs[1].samples if s["method"] == method)
        assert any(s["text"] != plain[s["instruction"]] for s in runs[1].samples
                   if s["method"] == method and s["factor"] == top), method  # fmt: skip


def test_make_on_a_model_with_other_weights_is_refused_on_vllm(lm):
    from transformers import AutoModelForCausalLM

    hf = sl.load("steerlab-tiny", backend="hf")
    other = AutoModelForCausalLM.from_config(hf.model.config).eval()  # the config, new weights
    data = toy.concept_data("sentiment", lm=hf, n=4)
    with pytest.raises(sl.SteerError, match=r"make_on has other weights"):
        sl.evals.benchmark(lm, data, ["mean_diff"], site=SITE, judge=toy.ToyJudge(),
                           make_on=sl.wrap(other, hf.tokenizer), progress=False)  # fmt: skip
