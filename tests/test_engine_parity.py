"""The shared engine parity suite (``engine_parity.py``) on the local engine, eager and
compiled; ``tests_vllm/test_parity.py`` runs the same suite on vLLM."""

from __future__ import annotations

import pytest
from engine_parity import (
    CASES,
    check_case,
    check_context_edge,
    check_feature_rows,
    check_mixed_rows,
    check_penalties,
    penalty_requests,
)

import steerlab as sl
from steerlab.core.positions import touches_generated


@pytest.fixture(scope="module")
def hf(toy_hf):
    return toy_hf  # the session's plain transformers copy of steerlab-tiny


# The compiled step is traced once per model (seconds), so make test-fast runs the eager half.
@pytest.fixture(scope="module", params=["eager", pytest.param("compiled", marks=pytest.mark.slow)])
def lm(request):
    model = sl.load("steerlab-tiny", backend="hf")
    if request.param == "compiled":
        model.compile(backend="aot_eager")  # the same graph, traced without codegen (quick)
    return model


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_position_rule_and_operation_equals_plain_hooks(lm, hf, name):
    check_case(lm, hf, name)
    if lm.engine.compiled is not None:  # the suite must exercise the compiled path itself
        requests = _requests(lm, name)
        if CASES[name].sae == "topk":  # no table form: it runs eagerly, and says so
            assert lm.explain(requests).startswith("eager: operation FeatureClamp(")
            assert "has no table form" in lm.explain(requests)
        elif CASES[name].op == "loreft" and touches_generated(CASES[name].positions):
            assert lm.explain(requests).startswith("eager: operation LoReFT(")
            assert "has no table form" in lm.explain(requests)
        else:  # prompt-only steers act in the eager prefill: any operation compiles
            assert lm.explain(requests).startswith("compiled"), lm.explain(requests)


def test_rows_with_different_steers_in_one_batch_equal_plain_hooks(lm, hf):
    check_mixed_rows(lm, hf)


def test_feature_clamps_beside_other_rows_equal_plain_hooks(lm, hf):
    check_feature_rows(lm, hf)


def test_the_context_window_at_its_edge(lm, hf):
    check_context_edge(lm, hf)


def _requests(lm, name):
    from engine_parity import PROMPTS, Request, prompt_ids, sampling

    return [Request(prompt_ids(lm, p), (CASES[name].row_steer(),), sampling()) for p in PROMPTS]


def test_the_suite_steers_for_real(hf):
    """A parity suite of steers that change nothing would pass on a broken engine: most
    cases must change the reference's own greedy tokens."""
    from engine_parity import NEW, PROMPTS, greedy

    tok = sl.load("steerlab-tiny", backend="hf").tokenizer
    changed = 0
    for case in CASES.values():
        for p in PROMPTS:
            ids = tok(p)["input_ids"]
            changed += greedy(hf, ids, [case.ref()], NEW, set()) != greedy(hf, ids, [], NEW, set())
    assert changed >= len(CASES)  # at least half the (case, prompt) pairs


def test_penalties_bias_and_min_tokens_equal_hf_logits_processors(lm, hf):
    check_penalties(lm, hf)
    if lm.engine.compiled is not None:  # sampling is outside the graph: they stay compiled
        assert lm.explain(penalty_requests(lm)).startswith("compiled"), lm.explain(
            penalty_requests(lm)
        )
