"""Scoring on vLLM (``Sampling.prompt_logprobs`` / ``logprobs``, from vLLM's own
``prompt_logprobs`` and ``logprobs``): the session's vLLM engine against the local engine on
the same weights and against plain transformers (``reference.logprobs``), unsteered and
steered, in fp32; the in-process helpers and the server's echo go through it too."""

from __future__ import annotations

import pytest
import torch
from reference import RefSteer, logprobs
from server_helpers import post, served

import steerlab as sl
from steerlab.core.errors import ContextError
from steerlab.core.request import Request, Sampling, Steer
from steerlab.engine.scoring import score_prompts
from steerlab.engine.vllm import decoding as vllm_decoding
from steerlab.engine.vllm import params as vllm_params
from steerlab.vectors.scoring import completion_logprobs, next_token_logprobs

SITE = "blocks.1.hook_resid_pre"
TOL = 1e-4
TEXTS = ["Once upon a time the fox", "The sea", "A cat sat on the mat and looked at the moon."]


@pytest.fixture(scope="module")
def local():
    """The same weights on the local engine (plain transformers backend)."""
    return sl.load("steerlab-tiny", backend="hf")


def _vec(seed: int = 0) -> torch.Tensor:
    return torch.randn(128, generator=torch.Generator().manual_seed(seed))


def _ids(lm, text: str) -> list[int]:
    return lm.tokenizer(text)["input_ids"]


def _gap(got: list, want: list) -> float:
    """The largest difference between two rows of prompt scores, ids checked on the way."""
    assert len(got) == len(want) and got[0] is None and want[0] is None
    worst = 0.0
    for g, w in zip(got[1:], want[1:]):
        assert g.token == w.token and len(g.top) == len(w.top)
        worst = max(worst, abs(g.logprob - w.logprob))
        for (gi, gv), (wi, wv) in zip(g.top, w.top):
            assert gi == wi or abs(gv - wv) < TOL  # a tie may list either token first
            worst = max(worst, abs(gv - wv))
    return worst


@pytest.mark.parametrize("positions", [None, "all", "prompt"])
def test_prompt_scores_equal_the_local_engine_and_transformers(lm, local, hf, positions):
    prompts = [_ids(lm, t) for t in TEXTS]
    steers = () if positions is None else (Steer(SITE, _vec(), 4.0, positions, sl.Add()),)
    ref = [] if positions is None else [RefSteer(SITE, _vec(), 4.0, positions)]
    got = score_prompts(lm.engine, prompts, top=3, steers=steers)
    want = score_prompts(local.engine, prompts, top=3, steers=steers)
    for ids, g, w in zip(prompts, got, want):
        assert len(g) == len(ids) and _gap(g, w) < TOL
        hf_logprobs = logprobs(hf, ids, ref)
        for t in range(1, len(ids)):
            assert g[t].logprob == pytest.approx(float(hf_logprobs[t - 1, ids[t]]), abs=TOL)
            top = hf_logprobs[t - 1].topk(3).values.tolist()
            assert [v for _, v in g[t].top] == pytest.approx(top, abs=TOL)
    if positions is not None:  # the steer changed the scores
        plain = score_prompts(lm.engine, prompts[:1], top=0)[0]
        assert max(abs(a.logprob - b.logprob) for a, b in zip(plain[1:], got[0][1:])) > 0.01
    assert lm.hook_count() == 0


def test_sampled_and_prompt_scores_in_one_call_equal_the_local_engine(lm, local, hf):
    ids = tuple(_ids(lm, "The happy fox ran"))
    steer = Steer(SITE, _vec(1), 3.0, "all", sl.Add())
    requests = [
        Request(ids, (steer,), Sampling(max_new_tokens=6, logprobs=4, prompt_logprobs=2)),
        Request(ids, (steer,), Sampling(max_new_tokens=0, prompt_logprobs=0)),  # scores only
        Request(ids, (), Sampling(max_new_tokens=5, logprobs=0)),
        Request(tuple(_ids(lm, "Hi")), (), Sampling(max_new_tokens=4)),
    ]
    got, want = lm.engine.run(requests), local.engine.run(requests)
    for g, w in zip(got, want):
        assert (g.tokens, g.finish_reason) == (w.tokens, w.finish_reason)
        assert g.logprobs == pytest.approx(w.logprobs, abs=TOL)
        assert len(g.scores) == len(w.scores)
        for a, b in zip(g.scores, w.scores):
            assert a.token == b.token and len(a.top) == len(b.top)
            assert [a.logprob, *(v for _, v in a.top)] == pytest.approx(
                [b.logprob, *(v for _, v in b.top)], abs=TOL)  # fmt: skip
        assert len(g.prompt_scores) == len(w.prompt_scores)
        if g.prompt_scores:
            assert _gap(g.prompt_scores, w.prompt_scores) < TOL
    steered, scored_only, plain, quiet = got
    assert scored_only.tokens == scored_only.scores == [] and scored_only.finish_reason == "length"
    assert all(s.top == () for s in scored_only.prompt_scores[1:])
    assert [len(s.top) for s in steered.prompt_scores[1:]] == [2] * (len(ids) - 1)
    assert [len(s.top) for s in plain.scores] == [0] * len(plain.tokens)
    assert quiet.scores == [] and quiet.prompt_scores == []
    full = list(ids) + steered.tokens
    want_hf = logprobs(hf, full, [RefSteer(SITE, _vec(1), 3.0, "all")])
    for k, score in enumerate(steered.scores):
        at = len(ids) + k - 1
        assert score.token == full[at + 1] == int(want_hf[at].argmax())  # greedy, steered
        assert score.logprob == pytest.approx(float(want_hf[at, score.token]), abs=TOL)
    assert lm.hook_count() == 0


def test_a_sampled_token_outside_the_top_keeps_its_own_logprob(lm, hf):
    ids = _ids(lm, "Once upon a time")
    sampling = Sampling(max_new_tokens=12, temperature=1.5, seed=3, logprobs=1)
    (c,) = lm.engine.run([Request(tuple(ids), (), sampling)])
    full = ids + c.tokens
    want = logprobs(hf, full, [])
    outside = 0
    for k, score in enumerate(c.scores[: len(c.tokens)]):
        at = len(ids) + k - 1
        (best,) = score.top
        assert best[0] == int(want[at].argmax())
        assert best[1] == pytest.approx(float(want[at].max()), abs=TOL)
        assert score.logprob == pytest.approx(float(want[at, score.token]), abs=TOL)
        outside += score.token != best[0]
    assert outside > 0  # the case this test is for happened


def test_a_scored_prompt_is_never_served_from_the_prefix_cache(lm, hf, monkeypatch):
    """A prompt of two full KV blocks, decoded first steered and then unsteered (so both
    are cached), still scores every position from its own forward. Were the cache read,
    vLLM would report stale buffers (the last scored prompt's, once): that fails the call."""
    ids = (_ids(lm, "The sea was calm and the sky was blue. " * 3) * 2)[:70]
    steer = Steer(SITE, _vec(2), 5.0, "all", sl.Add())
    lm.engine.run([Request(tuple(ids), (steer,), Sampling(max_new_tokens=2))])
    lm.engine.run([Request(tuple(ids), (), Sampling(max_new_tokens=2))])
    for steers, ref in (((), []), ((steer,), [RefSteer(SITE, _vec(2), 5.0, "all")])):
        (row,) = score_prompts(lm.engine, [ids], steers=steers)
        want = logprobs(hf, ids, ref)
        assert len(row) == len(ids)
        assert [s.logprob for s in row[1:]] == pytest.approx(
            [float(want[t - 1, ids[t]]) for t in range(1, len(ids))], abs=TOL)  # fmt: skip

    def reading(*args, **kwargs):
        request = vllm_params.to_vllm(*args, **kwargs)
        request.sampling["skip_reading_prefix_cache"] = False
        return request

    monkeypatch.setattr(vllm_decoding, "to_vllm", reading)
    with pytest.raises(RuntimeError, match="came from the prefix cache"):
        score_prompts(lm.engine, [ids])
    assert lm.hook_count() == 0


def test_the_in_process_helpers_run_on_vllm(lm, local):
    """``next_token_logprobs`` and ``completion_logprobs`` (a sweep's KL and perplexity)
    read the engine's scores, so vLLM gives what the local engine gives."""
    steers = [sl.Steer(SITE, _vec(3), alpha=[0.0, 4.0])]
    got = next_token_logprobs(lm, TEXTS[:2], steers)
    want = next_token_logprobs(local, TEXTS[:2], steers)
    assert got.shape == want.shape == (4, want.shape[1])
    assert (got - want).abs().max() < TOL
    assert got.exp().sum(-1) == pytest.approx([1.0] * 4, abs=1e-4)
    prompts = [_ids(lm, t) for t in TEXTS]
    completions = [_ids(lm, " and then")[1:], [], _ids(lm, " it rained")[1:]]
    assert completion_logprobs(lm, prompts, completions) == [
        pytest.approx(row, abs=TOL) for row in completion_logprobs(local, prompts, completions)
    ]


def test_what_vllm_cannot_score_is_refused_before_anything_is_sent(lm, monkeypatch):
    (row,) = score_prompts(lm.engine, [[0] + [57] * 126])  # the window less vLLM's one token
    assert len(row) == 127
    sent = []
    monkeypatch.setattr(lm.engine.llm.llm_engine, "add_request", lambda *a, **k: sent.append(a))
    with pytest.raises(ContextError, match="samples one token even where only the prompt"):
        score_prompts(lm.engine, [[0] + [57] * 127])
    monkeypatch.setattr(lm.engine, "max_logprobs", 5)
    with pytest.raises(ValueError, match="max_logprobs"):
        score_prompts(lm.engine, [_ids(lm, "Hi there")], top=6)
    assert sent == []


@pytest.mark.parametrize("steered", [False, True])
def test_the_server_echoes_prompt_scores_with_max_tokens_0(lm, hf, steered):
    prompts = [_ids(lm, "Once upon a time"), _ids(lm, "The happy fox ran")]
    body = {"model": "steerlab-tiny", "prompt": prompts, "max_tokens": 0, "echo": True,
            "logprobs": 3, "temperature": 0}  # fmt: skip
    ref = []
    if steered:
        body["steering"] = [{"site": SITE, "vector": _vec(4).tolist(), "alpha": 4.0}]
        ref = [RefSteer(SITE, _vec(4), 4.0)]
    with served(lm) as url:
        response = post(url, "/v1/completions", body)
    assert response.status_code == 200, response.text
    for ids, choice in zip(prompts, response.json()["choices"]):
        want = logprobs(hf, ids, ref)
        got = choice["logprobs"]
        assert choice["token_ids"] == [] and got["token_logprobs"][0] is None
        assert len(got["tokens"]) == len(ids) == len(got["token_logprobs"])
        for t in range(1, len(ids)):
            assert got["token_logprobs"][t] == pytest.approx(float(want[t - 1, ids[t]]), abs=TOL)
            top = want[t - 1].topk(3)
            for i, value in zip(top.indices.tolist(), top.values.tolist()):
                assert got["top_logprobs"][t][lm.tokenizer.decode([i])] == pytest.approx(
                    value, abs=TOL)  # fmt: skip


def test_steerability_on_vllm_equals_the_local_engine(lm, local):
    """``sl.evals.steerability`` on vLLM: the same completions (greedy), and the same
    perplexity and first-token KL within fp32 tolerance, as on the local engine."""
    from steerlab.evals import steerability

    steer = sl.Steer(SITE, _vec(3), alpha=1.0)
    options = dict(max_new_tokens=8, temperature=0.0, n_boot=50, progress=False)
    ours = steerability(lm, steer, TEXTS[:2], [-4.0, 0.0, 4.0], **options)
    theirs = steerability(local, steer, TEXTS[:2], [-4.0, 0.0, 4.0], **options)
    assert [r["text"] for r in ours.rows] == [r["text"] for r in theirs.rows]
    for a, b in zip(ours.rows, theirs.rows):
        assert a["nll"] == pytest.approx(b["nll"], abs=TOL * max(1, a["tokens"]))
        assert a["kl"] == pytest.approx(b["kl"], abs=TOL)
    assert [r["kl"] for r in ours.summary][1] == pytest.approx(0.0, abs=TOL)
