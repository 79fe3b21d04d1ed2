"""The shared engine parity suite (``tests/engine_parity.py``) on vLLM, compiled (steering
inside vLLM's graph, the default) and eager: the same cases the local engine runs, each
against plain transformers with torch hooks."""

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


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_position_rule_and_operation_equals_plain_hooks(each, hf, name):
    """Compiled, a case whose operation has no table form (a top-k feature clamp) runs
    its forwards uncompiled (``tests_vllm/test_graph.py`` counts them); every case
    equals the reference on both engines."""
    check_case(each, hf, name)


def test_rows_with_different_steers_in_one_batch_equal_plain_hooks(each, hf):
    check_mixed_rows(each, hf)


def test_feature_clamps_beside_other_rows_equal_plain_hooks(each, hf):
    check_feature_rows(each, hf)


def test_the_context_window_at_its_edge(each, hf):
    check_context_edge(each, hf)


def test_penalties_bias_and_min_tokens_equal_hf_and_the_local_engine(lm, hf):
    """vLLM applies them itself (its SamplingParams): the same tokens as the reference
    and as steerlab's local engine, which applies ``core.sampling.adjust_logits``."""
    check_penalties(lm, hf)
    local = sl.load("steerlab-tiny", backend="hf")
    requests = penalty_requests(lm)
    assert [c.tokens for c in lm.engine.run(requests)] == [
        c.tokens for c in local.engine.run(requests)
    ]


def test_min_p_one_leaves_only_the_likeliest_token_as_on_the_local_engine(lm):
    """min_p reaches vLLM's SamplingParams through core.request.OPTIONS: at min_p 1 a sampled
    row keeps only its likeliest token, so vLLM's sampler gives the greedy completion."""
    local = sl.load("steerlab-tiny", backend="hf")
    prompts = ["Once upon a time", "The sea was"]
    greedy = local.generate(prompts, max_new_tokens=16).tokens
    assert (
        lm.generate(prompts, max_new_tokens=16, temperature=1.5, min_p=1.0, seed=0).tokens == greedy
    )
    assert lm.generate(prompts, max_new_tokens=16, temperature=1.5, seed=0).tokens != greedy
