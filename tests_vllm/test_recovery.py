"""Issue 49, recovery: after any failed call (cancelled, a request refused, a worker that
failed, a steer that overflowed), every later call equals a fresh engine's output token for
token (plain HF, which a fresh engine equals), compiled and eager, and no hook is left.

Each test checks the later calls before it fails one (an engine already poisoned fails
there, not after), then fails a call and checks how it failed."""

from __future__ import annotations

from collections import deque

import pytest
import torch
from failures import LONG, NEW, PROMPTS, SITE, assert_later_calls_exact, expected, request_for
from reads_parity import PROMPTS as READ_PROMPTS
from reads_parity import (
    cast,
    check_cast_rows,
    check_monitors_against_hf,
    condition,
    median_threshold,
    steer_of,
)
from reference import RefSteer, greedy

import steerlab as sl
from steerlab.core.errors import ContextError, NonFiniteError, SiteError, SteerError
from steerlab.engine import Request, Sampling
from steerlab.engine.vllm import SteerHookError


def test_later_calls_are_exact_after_a_stream_closed_mid_call(each, hf):
    """A call closed between steps (a caller that stops iterating, a client gone): a row
    still decoding, a steered row held finished but not yet checked, and a steered row on
    a long prompt, all aborted inside vLLM; the engine is free at once."""
    lm = each
    assert_later_calls_exact(lm, hf)
    requests = [request_for(lm, LONG[1], False, 20), request_for(lm, PROMPTS[0], True, 2),
                request_for(lm, LONG[0], True, 20)]  # fmt: skip
    steps = lm.engine.stream(requests)
    for _ in range(3):
        progress = next(steps)
    assert not all(progress.states.done)
    steps.close()
    with pytest.raises(StopIteration):
        next(steps)
    with pytest.raises(RuntimeError, match="only while it runs"):
        steps.add([request_for(lm, PROMPTS[1], False)])
    assert lm.hook_count() == 0
    assert_later_calls_exact(lm, hf)


def test_later_calls_are_exact_after_a_request_refused_mid_call(each, hf, monkeypatch):
    """Requests joined to a running steered call and refused: by steerlab's checks (a site
    the model lacks, a vector of the wrong width, a prompt past the window), each with its
    own error before anything is sent; then by vLLM itself, the second of two requests
    (one steered at a site the call had not hooked), after the first was sent: both leave
    the call cancelled. The running rows still finish exactly."""
    lm = each
    assert_later_calls_exact(lm, hf)
    running = [request_for(lm, LONG[0], True, 12), request_for(lm, PROMPTS[1], False, 12)]
    steps = lm.engine.stream(running)
    next(steps)
    ids = running[1].prompt
    bad = [
        (SiteError, "blocks.9", sl.Steer("blocks.9.hook_resid_pre", torch.ones(128), 2.0)),
        (SteerError, "size 7", sl.Steer(SITE, torch.ones(7), 2.0)),
    ]
    for error, match, steer in bad:
        with pytest.raises(error, match=match):
            steps.add([Request(ids, (steer,), Sampling(max_new_tokens=4))])
    with pytest.raises(ContextError):
        steps.add([Request(ids * 60, (), Sampling(max_new_tokens=4))])
    real, sent = lm.engine.llm.llm_engine.add_request, []

    def second_refused(*args, **kwargs):
        sent.append(args[0])
        if len(sent) == 2:
            raise RuntimeError("vLLM refused the request")
        return real(*args, **kwargs)

    monkeypatch.setattr(lm.engine.llm.llm_engine, "add_request", second_refused)
    other = sl.Steer.of(sl.Steer("blocks.0.hook_resid_post", torch.ones(128), 2.0), 2.0)
    joining = [Request(ids, (other,), Sampling(max_new_tokens=4)),
               Request(ids, (), Sampling(max_new_tokens=4))]  # fmt: skip
    with pytest.raises(RuntimeError, match="refused"):
        steps.add(joining)
    monkeypatch.undo()
    (last,) = deque(steps, maxlen=1)
    assert last.states.reasons[2:] == ["cancelled", "cancelled"]  # nothing else joined
    assert last.states.tokens[:2] == [expected(hf, lm, r) for r in running]
    assert lm.hook_count() == 0
    assert_later_calls_exact(lm, hf)


def test_later_calls_are_exact_after_a_worker_fails_mid_call(each, hf):
    """The workers forget their vectors between two steps of a steered call (the RPC the
    engine itself sends between calls when it holds too many).

    Eager: the next forward's hook finds no vector (``KeyError`` in the worker), the
    call fails with ``SteerHookError`` naming it. Compiled: the steer's table row was
    written at the first forward from the vector, and a later forward with the same steers
    keeps it (``GraphBuffers.entries``, keyed by the vector's content): the call goes on
    exactly, as it should (the table holds the right numbers); a call that needs the vector
    itself (an ablation along it: a new table row) fails as the eager one does. After the
    failure the engine sends the vectors again: before it did, it took them for held, and
    every later call that needed one failed (eager: every steered call with it)."""
    lm = each
    assert_later_calls_exact(lm, hf)
    requests = [request_for(lm, LONG[0], True, 12), request_for(lm, PROMPTS[1], False, 12)]
    vector = requests[0].steers[0].vector
    ablate = Request(requests[0].prompt, (sl.Steer.of(sl.Steer(SITE, vector, op=sl.Ablate()), 1.0),),
                     Sampling(max_new_tokens=NEW))  # fmt: skip
    steps = lm.engine.stream(requests)
    next(steps)
    assert min(lm.engine.rpc("steerlab_drop_vectors")) >= 1
    if lm.engine.graph:
        (last,) = deque(steps, maxlen=1)
        assert last.states.tokens == [expected(hf, lm, r) for r in requests]
        with pytest.raises(SteerHookError, match="was never sent"):
            lm.engine.run([ablate])
    else:
        with pytest.raises(SteerHookError, match="was never sent"):
            deque(steps, maxlen=0)
    assert lm.hook_count() == 0
    (again,) = lm.engine.run([ablate])  # the vector itself, on the workers again
    ref = [RefSteer(SITE, vector, 1.0, "all", "ablate")]
    assert again.tokens == greedy(hf, list(ablate.prompt), ref, NEW, lm.eos_ids)
    assert_later_calls_exact(lm, hf)


def test_later_calls_are_exact_after_an_overflow_beside_other_rows(each, hf):
    """A steer that overflows in a batch beside a plain row and a steered row: the engine
    fails the whole call (``NonFiniteError`` naming the row and its steer; its other rows
    return nothing). Then once more, the overflowing request joined to a call under way.
    Later calls, on prompts longer than the overflowing one's blocks, are exact."""
    lm = each
    assert_later_calls_exact(lm, hf)
    overflow = request_for(lm, PROMPTS[0] * 4, False, 5, overflow=True)
    beside = [request_for(lm, LONG[1], False, NEW), request_for(lm, LONG[0], True, NEW)]
    with pytest.raises(NonFiniteError, match=r"row 2 .*Add at blocks.1.hook_resid_pre with "
                                             r"alpha=1e\+08"):  # fmt: skip
        lm.engine.run([*beside, overflow])
    assert_later_calls_exact(lm, hf)
    steps = lm.engine.stream(beside)
    next(steps)
    assert steps.add([overflow]) == range(2, 3)
    with pytest.raises(NonFiniteError, match="row 2"):
        deque(steps, maxlen=0)
    assert lm.hook_count() == 0
    assert_later_calls_exact(lm, hf)


def test_later_conditions_and_monitors_are_exact_after_a_gated_call_closed_mid_call(each, hf):
    """A call whose rows carry a CAST condition and a monitor, closed after the prefill that
    decided the condition and a few steps: the workers' reads (compiled: the graph's read
    buffers) hold its decisions when it goes. Later conditioned calls decide afresh and
    equal IBM's CAST reference, and later monitors plain HF's hidden states."""
    lm = each
    check_cast_rows(lm, hf, "mean", "above")
    ref = cast(median_threshold(lm, hf))
    steps = lm.stream(READ_PROMPTS, steer=steer_of(ref, condition(ref)), max_new_tokens=16,
                      stop_at_eos=False, monitor={"m": (SITE, torch.ones(128))})  # fmt: skip
    for _ in range(3):
        next(steps)
    steps.close()
    assert lm.hook_count() == 0
    check_cast_rows(lm, hf, "mean", "above")
    check_monitors_against_hf(lm, hf)
    assert_later_calls_exact(lm, hf)
