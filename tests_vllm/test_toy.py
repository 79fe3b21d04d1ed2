"""steerlab-tiny (GPT-2) on vLLM (the session's engine, from conftest): parity with plain
HF, steering in one continuous batch, the prefix cache, the no-silent-no-op guard, and refusals."""

from __future__ import annotations

from collections import deque

import pytest
import torch
from reference import RefSteer, greedy

import steerlab as sl
from steerlab.core.prompts import PromptError
from steerlab.engine import CallInFlightError, Request, Sampling, Steer
from steerlab.engine.vllm import SteerHookError
from steerlab.engine.vllm import params as vllm_params
from steerlab.engine.vllm.load import _check_eager

PROMPTS = ["Once upon a time", "The sea was", "Tell me a story about the forest.", "A cat"]
NEW = 16


def _vec(seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(128, generator=torch.Generator().manual_seed(seed)) * scale


def _ids(lm, text: str) -> tuple[int, ...]:
    return tuple(lm.tokenizer(text)["input_ids"])


def test_greedy_equals_hf_token_for_token(lm, hf):
    out = lm.generate(PROMPTS, max_new_tokens=NEW)
    for row, prompt in enumerate(out.prompt_tokens):
        assert out.tokens[row] == greedy(hf, prompt, [], NEW, lm.eos_ids), row
    assert lm.hook_count() == 0


def test_alpha_list_rows_equal_hf(lm, hf):
    v = _vec(0, 0.5)
    steer = sl.Steer("blocks.1.hook_resid_pre", v, alpha=[0.0, 2.0, 4.0])
    out = lm.generate(PROMPTS[:2], steer, max_new_tokens=NEW)
    assert len(out) == 6 and out.alphas[:3] == [(0.0,), (2.0,), (4.0,)]
    for row, prompt in enumerate(out.prompt_tokens):
        ref = [RefSteer("blocks.1.hook_resid_pre", v, out.alphas[row][0])]
        assert out.tokens[row] == greedy(hf, prompt, ref, NEW, lm.eos_ids), row
    assert out.tokens[1] != out.tokens[0]  # the steer does something here


# One continuous batch whose rows carry different steers: every site kind, the three ops,
# positions all / prompt / generated / k, and two steers on one row.
ROWS = [
    [],
    [RefSteer("blocks.1.hook_resid_pre", _vec(1, 0.4), 2.0)],
    [RefSteer("blocks.2.hook_resid_post", _vec(2, 0.4), 3.0, "prompt")],
    [RefSteer("blocks.0.hook_mlp_out", _vec(3, 0.4), 3.0, "generated")],
    [RefSteer("blocks.3.hook_attn_out", _vec(4, 0.4), 4.0, 3)],
    [RefSteer("blocks.1.hook_resid_mid", _vec(5), 1.0, "all", "ablate")],
    [RefSteer("blocks.2.hook_resid_mid", _vec(6), 1.0, "generated", "clamp", 5.0)],
    [RefSteer("blocks.3.hook_resid_pre", _vec(7), 0.5, "all", "clamp", -4.0)],
    [RefSteer("hook_embed", _vec(8, 0.4), 2.0)],
    [
        RefSteer("blocks.0.hook_resid_pre", _vec(9, 0.4), 2.0),
        RefSteer("blocks.2.hook_resid_post", _vec(10), 1.0, "all", "ablate"),
    ],
]


def _row_steer(s: RefSteer) -> Steer:
    op = {"add": sl.Add(), "ablate": sl.Ablate(), "clamp": sl.Clamp(s.value)}[s.op]
    return Steer(s.site, s.vector, s.alpha, s.positions, op)


def test_mixed_steers_in_one_batch_equal_hf(lm, hf):
    prompts = [_ids(lm, PROMPTS[i % len(PROMPTS)]) for i in range(len(ROWS))]
    requests = [
        Request(p, tuple(_row_steer(s) for s in steers), Sampling(max_new_tokens=NEW), str(i))
        for i, (p, steers) in enumerate(zip(prompts, ROWS))
    ]
    done = lm.engine.run(requests)
    plain = {p: greedy(hf, list(p), [], NEW, lm.eos_ids) for p in set(prompts)}
    changed = 0
    for i, (p, steers) in enumerate(zip(prompts, ROWS)):
        assert done[i].tokens == greedy(hf, list(p), steers, NEW, lm.eos_ids), i
        changed += done[i].tokens != plain[p]
    assert changed >= 6  # most steers change their row's text (ablating a random direction may not)
    assert lm.hook_count() == 0


def test_stream_matches_generate_and_closing_early_releases(lm):
    steer = sl.Steer("blocks.2.hook_resid_pre", _vec(11, 0.4), alpha=[0.0, 3.0])
    whole = lm.generate(PROMPTS[:2], steer, max_new_tokens=8)
    steps = list(lm.stream(PROMPTS[:2], steer, max_new_tokens=8))
    assert steps[-1].result().tokens == whole.tokens
    assert "".join(s.new_text[1] for s in steps) == whole.text[1]
    paused = lm.stream(PROMPTS[:2], steer, max_new_tokens=8)
    next(paused)
    with pytest.raises(CallInFlightError):
        lm.generate(PROMPTS[0], max_new_tokens=2)
    paused.close()
    assert lm.hook_count() == 0
    assert lm.generate(PROMPTS[:2], steer, max_new_tokens=8).tokens == whole.tokens


def test_requests_added_to_a_running_call_equal_hf(lm, hf):
    v, w = _vec(17, 0.4), _vec(18, 0.4)
    first = Request(_ids(lm, PROMPTS[0]), (Steer("blocks.1.hook_resid_pre", v, 2.0, "all",
                                                    sl.Add()),), Sampling(max_new_tokens=NEW))  # fmt: skip
    joining = [
        Request(_ids(lm, PROMPTS[1]), (Steer("blocks.3.hook_mlp_out", w, 3.0, "generated",
                                                sl.Add()),), Sampling(max_new_tokens=8)),
        Request(_ids(lm, PROMPTS[3]), (), Sampling(max_new_tokens=8)),
    ]  # fmt: skip
    steps = lm.engine.stream([first])
    next(steps)
    next(steps)
    rows = steps.add(joining)  # a new site: the workers re-hook between steps
    assert list(rows) == [1, 2]
    (last,) = deque(steps, maxlen=1)
    tokens = last.states.tokens
    assert tokens[0] == greedy(hf, list(first.prompt), [RefSteer("blocks.1.hook_resid_pre", v,
                                                                 2.0)], NEW, lm.eos_ids)  # fmt: skip
    ref = [RefSteer("blocks.3.hook_mlp_out", w, 3.0, "generated")]
    assert tokens[1] == greedy(hf, list(joining[0].prompt), ref, 8, lm.eos_ids)
    assert tokens[2] == greedy(hf, list(joining[1].prompt), [], 8, lm.eos_ids)
    assert lm.hook_count() == 0
    with pytest.raises(RuntimeError, match="only while it runs"):
        steps.add(joining)


def test_a_failed_add_leaves_the_call_whole(lm, hf, monkeypatch):
    first = Request(_ids(lm, PROMPTS[0]), (Steer("blocks.1.hook_resid_pre", _vec(19, 0.4),
                                                    2.0, "all", sl.Add()),), Sampling(max_new_tokens=NEW))  # fmt: skip
    steps = lm.engine.stream([first])
    next(steps)
    real, calls = lm.engine.llm.llm_engine.add_request, []

    def second_fails(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 2:
            raise RuntimeError("vLLM refused the request")
        return real(*args, **kwargs)

    monkeypatch.setattr(lm.engine.llm.llm_engine, "add_request", second_fails)
    more = [Request(_ids(lm, p), (), Sampling(max_new_tokens=4)) for p in PROMPTS[1:3]]
    with pytest.raises(RuntimeError, match="refused"):
        steps.add(more)
    monkeypatch.undo()
    (last,) = deque(steps, maxlen=1)
    assert last.states.reasons[1:] == ["cancelled", "cancelled"]  # both added rows, not one
    ref = [RefSteer("blocks.1.hook_resid_pre", _vec(19, 0.4), 2.0)]
    assert last.states.tokens[0] == greedy(hf, list(first.prompt), ref, NEW, lm.eos_ids)
    assert lm.hook_count() == 0


def test_seed_makes_sampling_reproducible(lm):
    kwargs = {"max_new_tokens": 12, "temperature": 1.0, "top_p": 0.95, "seed": 7}
    steer = sl.Steer("blocks.1.hook_resid_pre", _vec(12, 0.4), alpha=[0.0, 2.0])
    a = lm.generate(PROMPTS, steer, **kwargs)
    b = lm.generate(PROMPTS, steer, **kwargs)
    c = lm.generate(PROMPTS, steer, **{**kwargs, "seed": 8})
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens


LONG = " ".join(["The little cat walked to the sea and saw the waves."] * 6)


def _long_rows(lm, steer) -> list[int]:
    return lm.generate(LONG, steer, max_new_tokens=8).tokens[0]


def test_steered_prefix_is_never_served_to_an_unsteered_request(lm):
    assert len(_ids(lm, LONG)) > 64  # several full KV blocks to cache
    steer = sl.Steer("blocks.0.hook_resid_pre", _vec(13), alpha=4.0)
    plain = _long_rows(lm, None)
    steered = _long_rows(lm, steer)
    assert steered != plain
    assert _long_rows(lm, None) == plain  # after a steered request on the same prompt
    assert _long_rows(lm, steer) == steered  # a repeat may reuse its own steered blocks


def test_without_the_salt_the_cache_would_be_stale(lm, monkeypatch):
    """The test above can fail: with no salt, steered blocks reach an unsteered request."""
    steer = sl.Steer("blocks.0.hook_resid_pre", _vec(13), alpha=4.0)
    plain = _long_rows(lm, None)
    lm.engine.llm.reset_prefix_cache()
    monkeypatch.setattr(vllm_params, "cache_salt", lambda request, revision: None)
    _long_rows(lm, steer)
    stale = _long_rows(lm, None)
    monkeypatch.undo()
    lm.engine.llm.reset_prefix_cache()
    assert stale != plain


def test_the_workers_keep_no_request_past_a_call_steered_or_not(lm):
    """The workers read each request's plan when vLLM first schedules it: a steered call
    drops them at its end, and an unsteered request (a call that never ends on the
    workers) leaves none behind."""
    for steers in ((), sl.Steer("blocks.1.hook_resid_pre", _vec(22), alpha=2.0), ()):
        lm.generate(PROMPTS, steers, max_new_tokens=3)
        (worker,) = lm.engine.rpc("steerlab_describe")
        assert worker["plans"] == 0 and lm.hook_count() == 0


def test_hooks_that_never_ran_fail_the_call(lm):
    assert all(lm.engine.rpc("steerlab_attach", False))  # as if compiled first: no hook runs
    try:
        with pytest.raises(SteerHookError, match="did not run"):
            lm.generate(PROMPTS[0], sl.Steer("blocks.1.hook_resid_pre", _vec(14), alpha=2.0),
                        max_new_tokens=4)  # fmt: skip
        assert not lm.engine.proven  # every site is checked at its first token again
    finally:
        assert not any(lm.engine.rpc("steerlab_attach"))
    assert lm.generate(PROMPTS[0], max_new_tokens=4).tokens  # the engine still works
    steered = lm.generate(PROMPTS[0], sl.Steer("blocks.1.hook_resid_pre", _vec(14), alpha=2.0),
                          max_new_tokens=4)  # fmt: skip
    assert steered.tokens and lm.hook_count() == 0  # the workers hook again, and unhook


def test_a_hook_error_fails_the_request(each):
    """A vector the workers never got: eagerly the hook fails, compiled the write before
    the forward does; either way the request fails, naming the vector."""
    lm = each
    v = _vec(15)
    key = Steer("hook_embed", v, 1.0, "all", sl.Add()).vector_key
    lm.engine._sent.add(key)
    with pytest.raises(SteerHookError, match=f"{key} was never sent"):
        lm.generate(PROMPTS[0], sl.Steer("blocks.1.hook_resid_pre", v, alpha=2.0),
                    max_new_tokens=4)  # fmt: skip
    assert lm.hook_count() == 0


def _reports(lm, monkeypatch, fail_at_finish: bool = False) -> list[tuple[list, list]]:
    """Record every check the engine makes: (rows asked, rows forgotten as finished)."""
    rpc, calls = lm.engine.llm.collective_rpc, []

    def recorded(method, *args, **kwargs):
        out = rpc(method, *args, **kwargs)
        if method == "steerlab_report":
            rows, forget, _ = kwargs["args"]
            calls.append((list(rows), list(forget)))
            if fail_at_finish and forget:
                out[0]["rows"][forget[0]][1] = "injected: a hook failed after the first token"
        return out

    monkeypatch.setattr(lm.engine.llm, "collective_rpc", recorded)
    return calls


def _staggered(lm) -> list[Request]:
    """8 steered rows (one site) that end at different steps, and 2 unsteered ones."""
    ids = _ids(lm, PROMPTS[0])
    steer = (Steer("blocks.1.hook_resid_pre", _vec(16, 0.4), 2.0, "all", sl.Add()),)
    rows = [Request(ids, steer, Sampling(max_new_tokens=2 + k, stop_at_eos=False), f"s{k}")
            for k in range(8)]  # fmt: skip
    return rows + [Request(ids, (), Sampling(max_new_tokens=3), f"u{k}") for k in range(2)]


def test_finished_steered_rows_are_checked_together_before_they_show_as_done(lm, monkeypatch):
    calls = _reports(lm, monkeypatch)
    requests = _staggered(lm)
    checked: set[int] = set()
    for progress in lm.engine.stream(requests):
        for forget in (f for _, f in calls):
            checked |= {int(row.rsplit("-", 1)[1]) for row in forget}
        shown_done = {i for i, d in enumerate(progress.done) if d}
        assert shown_done & set(range(8)) <= checked  # no steered row ends unchecked
    assert progress.states.done == [True] * 10
    assert [len(t) for t in progress.states.tokens[:8]] == [2 + k for k in range(8)]
    # At most one check when the site first steers (none once the engine has proven it),
    # then the finished rows in one or two checks (each check waits for a step in flight);
    # one check per finishing step would be 8.
    assert len(calls) <= 3, calls
    assert sorted(r for _, f in calls for r in f) == sorted(
        r for r in {r for rows, _ in calls for r in rows}
    )


def test_a_site_proven_on_the_engine_is_checked_once_a_row(lm, monkeypatch):
    """Once a hook at a site has steered on the engine, a later row there skips the check
    at its first token: one check a call, when the row ends, which also ends the hooks."""
    site = "blocks.1.hook_resid_pre"
    steer = sl.Steer(site, _vec(17, 0.4), alpha=2.0)
    first = lm.generate(PROMPTS[0], steer, max_new_tokens=4)
    assert site in lm.engine.proven
    calls = _reports(lm, monkeypatch)
    again = lm.generate(PROMPTS[0], steer, max_new_tokens=4)
    assert len(calls) == 1 and len(calls[0][1]) == 1, calls  # the row, as it ends
    assert again.tokens == first.tokens and lm.hook_count() == 0


def test_a_hook_failure_found_at_the_finish_check_fails_the_call(lm, monkeypatch):
    _reports(lm, monkeypatch, fail_at_finish=True)
    shown_done = []
    with pytest.raises(SteerHookError, match="injected"):
        for progress in lm.engine.stream(_staggered(lm)):
            shown_done += [i for i, d in enumerate(progress.done[:8]) if d]
    assert shown_done == []  # no steered row was ever reported finished
    assert lm.hook_count() == 0


def test_workers_drop_their_vectors_past_the_limit(lm, hf, monkeypatch):
    monkeypatch.setattr(lm.engine, "max_vectors", 1)
    steers = [sl.Steer("blocks.1.hook_resid_pre", _vec(20, 0.4), alpha=2.0),
              sl.Steer("blocks.2.hook_resid_pre", _vec(21, 0.4), alpha=2.0)]  # fmt: skip
    out = lm.generate(PROMPTS[0], steers, max_new_tokens=8)
    (worker,) = lm.engine.llm.collective_rpc("steerlab_describe")
    assert worker["vectors"] == 0 and not lm.engine._sent  # two held: over the limit
    again = lm.generate(PROMPTS[0], steers, max_new_tokens=8)  # sent again, same tokens
    ref = [RefSteer("blocks.1.hook_resid_pre", _vec(20, 0.4), 2.0),
           RefSteer("blocks.2.hook_resid_pre", _vec(21, 0.4), 2.0)]  # fmt: skip
    assert out.tokens[0] == again.tokens[0]
    assert out.tokens[0] == greedy(hf, out.prompt_tokens[0], ref, 8, lm.eos_ids)


def test_compiled_engines_are_refused():
    class Compiled:
        def collective_rpc(self, method):
            return [{"compilation_mode": 3, "enforce_eager": False}]

    with pytest.raises(RuntimeError, match="compiles its model"):
        _check_eager(Compiled())


def test_a_compiled_engine_captured_whole_in_cuda_graphs_is_refused(lm):
    """A whole-model CUDA graph replays without the pre-hook that writes each forward's
    steers: stale steering. steerlab asks for piecewise graphs; a worker that reports full
    ones anyway is refused. The session's engine reports none (no CUDA graphs on a CPU)."""
    (worker,) = lm.engine.rpc("steerlab_describe")
    assert worker["graph"] and worker["full_cudagraphs"] is False
    _check_eager(lm.engine.llm, eager=False)  # the real engine passes

    class Full:
        def collective_rpc(self, method):
            return [{**worker, "full_cudagraphs": True}]

    with pytest.raises(RuntimeError, match="PIECEWISE"):
        _check_eager(Full(), eager=False)


def test_an_eager_engine_runs_eager(eager):
    (worker,) = eager.engine.llm.collective_rpc("steerlab_describe")
    assert worker["enforce_eager"] and worker["compilation_mode"] == 0 and not worker["graph"]


class _Custom:
    def __call__(self, act, direction, alpha):
        return act


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda lm: lm.generate("Hi", sl.Steer("blocks.9.hook_resid_pre", _vec(0))), sl.SiteError),
        (
            lambda lm: lm.generate("Hi", sl.Steer("blocks.1.hook_resid_pre", torch.ones(7))),
            sl.SteerError,
        ),
        (
            lambda lm: lm.generate(
                "Hi", sl.Steer("blocks.1.hook_resid_pre", _vec(0), op=_Custom())
            ),
            sl.SteerError,
        ),
        (lambda lm: lm.generate("Hi " * 200), PromptError),
        (lambda lm: lm.generate("Hi", capture=["blocks.1.hook_resid_pre"]), ValueError),
        (lambda lm: lm.generate("Hi", keep_cache=True), ValueError),
        (lambda lm: lm.generate("Hi", temperature=-1.0), ValueError),
        (lambda lm: lm.generate("Hi", max_new_tokens=0), ValueError),
        (lambda lm: lm.logits("Hi"), NotImplementedError),
        (lambda lm: lm.run_with_cache("Hi"), NotImplementedError),
        (lambda lm: sl.amplify(lm, lm, beta=1.0), ValueError),
        (lambda lm: lm.model, AttributeError),
    ],
)
def test_bad_input_is_refused_before_any_request_is_sent(lm, monkeypatch, call, error):
    sent = []
    monkeypatch.setattr(lm.engine.llm.llm_engine, "add_request", lambda *a, **k: sent.append(a))
    with pytest.raises(error):
        call(lm)
    assert sent == []


def test_amplify_says_why_and_what_to_use(lm):
    with pytest.raises(ValueError, match="backend='hf'"):
        sl.amplify(lm, lm, beta=1.0)
