"""Conditions (CAST) and monitors on vLLM, compiled (read inside the graph, handed over
after each forward) and eager (hooks on vLLM's modules): decided and read inside its
workers, against IBM's CAST as plain hooks, plain transformers' hidden states, and the
local engine."""

from __future__ import annotations

import pytest
import torch
from engine_parity import direction
from reads_parity import (
    NEW,
    PROMPTS,
    cast,
    check_cast_rows,
    check_monitors_against_hf,
    condition,
    median_threshold,
    steer_of,
)

import steerlab as sl


@pytest.fixture(scope="module")
def local():
    return sl.load("steerlab-tiny", backend="hf")


@pytest.mark.parametrize("mode", ["mean", "last"])
@pytest.mark.parametrize("compare", ["above", "below"])
def test_batch_of_8_with_mixed_rows_equals_ibm_cast_row_by_row(each, hf, mode, compare):
    check_cast_rows(each, hf, mode, compare)


def test_monitors_equal_plain_transformers_hidden_states_of_the_steered_text(each, hf):
    check_monitors_against_hf(each, hf)


def test_rows_that_did_not_fire_are_identical_to_unsteered_rows(each, hf):
    lm = each
    ref = cast(median_threshold(lm, hf))
    gated = lm.generate(PROMPTS, steer=steer_of(ref, condition(ref)), max_new_tokens=NEW,
                        stop_at_eos=False)  # fmt: skip
    plain = lm.generate(PROMPTS, max_new_tokens=NEW, stop_at_eos=False)
    quiet = [r for r in range(len(PROMPTS)) if not gated.fired[r]]
    assert 0 < len(quiet) < len(PROMPTS)
    for r in quiet:
        assert gated.tokens[r] == plain.tokens[r]
        assert gated.logprobs[r] == plain.logprobs[r]  # bit for bit
    assert any(gated.tokens[r] != plain.tokens[r] for r in range(len(PROMPTS)) if r not in quiet)


def _same(got, want) -> None:
    assert got.tokens == want.tokens
    assert (got.fired is None) == (want.fired is None)  # None: no row has a prompt gate
    if want.fired is not None:
        assert got.fired.tolist() == want.fired.tolist()
        torch.testing.assert_close(got.condition_scores, want.condition_scores, atol=1e-5,
                                   rtol=1e-4, equal_nan=True)  # fmt: skip
    assert set(got.monitors) == set(want.monitors)
    for name in want.monitors:
        for part in ("prompt", "generated"):
            torch.testing.assert_close(getattr(got.monitors[name], part),
                                       getattr(want.monitors[name], part), atol=1e-4,
                                       rtol=1e-4, equal_nan=True)  # fmt: skip


def test_every_kind_of_gate_and_monitor_equals_the_local_engine(each, hf, local):
    """Prompt gates (mean, last, any_of), a steer on the prompt gated by an earlier site,
    a per-token gate, a sweep whose alpha-0 rows still report their decision, and two
    monitors: the same tokens, decisions, scores and traces as the in-process engine.
    Compiled, the gate on the prompt and the per-token gate need their decision inside the
    forward that reads it: those forwards run uncompiled (counted by the worker, with
    why), and the rest inside the graph."""
    lm = each
    t = median_threshold(lm, hf)
    above, below = cast(t, "above"), cast(t, "below")
    last = cast(median_threshold(lm, hf, "last"), "above", "last")
    site = "blocks.2.hook_resid_pre"
    monitor = {"happy": ("blocks.2.hook_resid_post", direction(60)),
               "sea": ("blocks.0.hook_resid_pre", direction(61))}  # fmt: skip
    token = sl.Condition("blocks.1.hook_resid_post", direction(30), threshold=0.0,
                         read="token", score="projection")  # fmt: skip
    cases = [
        dict(steer=steer_of(above, sl.any_of(condition(last, "last"), condition(below)))),
        dict(steer=sl.Steer(site, above.vector, 6.0, positions="all", when=condition(above))),
        dict(steer=sl.Steer(site, above.vector, 4.0, when=token)),
        dict(steer=sl.Steer(site, above.vector, [0.0, 8.0], positions="generated",
                            when=condition(above))),
        dict(steer=steer_of(above, condition(above)), monitor=monitor),
        dict(monitor=monitor),
    ]  # fmt: skip
    uncompiled = {1: "prompt it reads", 2: "per-token"} if lm.engine.graph else {}
    for k, case in enumerate(cases):
        kwargs = dict(max_new_tokens=NEW, stop_at_eos=False, **case)
        before = _uncompiled(lm)
        got, want = lm.generate(PROMPTS, **kwargs), local.generate(PROMPTS, **kwargs)
        _same(got, want)
        ran = {why: n - before.get(why, 0) for why, n in _uncompiled(lm).items()}
        ran = {why: n for why, n in ran.items() if n}
        if k in uncompiled:
            assert uncompiled[k] in lm.explain(PROMPTS, case["steer"])
            # the prompt gate: its prefill only; the per-token gate: every forward
            ((why, n),) = ran.items()
            assert uncompiled[k] in why, ran
            assert 1 <= n <= len(PROMPTS) if k == 1 else n >= NEW - 1, ran
        else:
            assert ran == {}, k
    assert lm.hook_count() == 0


def _uncompiled(lm) -> dict[str, int]:
    """The forwards the compiled model ran uncompiled so far, by reason (eager: none)."""
    return lm.engine.rpc("steerlab_uncompiled")[0]


def test_explain_says_where_conditions_are_decided(lm, eager, hf):
    ref = cast(median_threshold(lm, hf))
    why = eager.explain(PROMPTS, steer_of(ref, condition(ref)))
    assert why.startswith("vllm eager (loaded with vllm_args={'enforce_eager': True}): the "
                          "vLLM engine decodes every call eagerly")  # fmt: skip
    assert "conditions are decided" in why
    why = lm.explain(PROMPTS, steer_of(ref, condition(ref)))
    assert why.startswith("vllm compiled (loaded with") and "read inside the graph" in why
    on_prompt = sl.Steer("blocks.2.hook_resid_pre", ref.vector, 4.0, when=condition(ref))
    why = lm.explain(PROMPTS, on_prompt)  # compiled: its prefill runs uncompiled, with why
    assert why.startswith("vllm compiled (loaded with") and "run uncompiled" in why
    assert "a whole-prompt condition gates a steer on the prompt it reads" in why


@pytest.fixture(scope="module")
def chunked():
    """An engine that feeds at most 32 tokens a forward: longer prompts come in chunks.
    Eager: the compiled graph's sums across chunks go to the same ``GateState`` (tested
    without vLLM in ``tests/test_vllm_graph.py``), and a compiled start costs minutes."""
    model = sl.load("steerlab-tiny", backend="vllm", max_model_len=128,
                    vllm_args={"block_size": 32, "max_num_batched_tokens": 32,
                               "max_num_seqs": 8, "enable_chunked_prefill": True,
                               "enforce_eager": True})  # fmt: skip
    yield model
    model.engine.close()


LONG = [
    " ".join(PROMPTS[i:] + PROMPTS[:i]) for i in range(4)
]  # 40-50 tokens each: two chunks or more


def test_a_prompt_fed_in_chunks_is_read_whole(chunked, local, hf):
    """A mean condition sums the prompt across chunks: decisions, scores, tokens and
    monitor traces equal the local engine's, which feeds each prompt in one forward."""
    lengths = [len(chunked.tokenizer(p)["input_ids"]) for p in LONG]
    assert min(lengths) > 32 and chunked.engine.chunks_prompts
    ref = cast(median_threshold(chunked, hf))
    monitor = {"m": ("blocks.1.hook_resid_post", direction(62))}
    kwargs = dict(steer=steer_of(ref, condition(ref)), monitor=monitor, max_new_tokens=NEW,
                  stop_at_eos=False)  # fmt: skip
    got, want = chunked.generate(LONG, **kwargs), local.generate(LONG, **kwargs)
    _same(got, want)
    # A steer on the prompt needs its decision before it acts: refused, with why, even for
    # a short prompt (vLLM may split any prompt when a step's budget is shared).
    prompt_steer = sl.Steer("blocks.2.hook_resid_pre", ref.vector, 4.0, when=condition(ref))
    assert chunked.explain(LONG, prompt_steer).startswith("refused:")
    assert chunked.explain(PROMPTS[:1], prompt_steer).startswith("refused:")
    with pytest.raises(sl.SteerError, match="enable_chunked_prefill"):
        chunked.generate(LONG, steer=prompt_steer, max_new_tokens=2)
    assert chunked.hook_count() == 0
