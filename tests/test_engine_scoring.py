"""The engine scores prompts and sampled tokens (``Sampling.prompt_logprobs`` / ``logprobs``):
left-padded rows, steered rows and rows that also generate, against plain transformers."""

from __future__ import annotations

import pytest
import torch
from reference import RefSteer, logprobs

from steerlab.core.request import Request, Sampling
from steerlab.core.steer import Steer
from steerlab.engine.scoring import score_prompts
from steerlab.vectors.scoring import completion_logprobs

SITE = "blocks.2.hook_resid_post"


def _ids(lm, text: str) -> list[int]:
    return lm.tokenizer(text)["input_ids"]


def test_prompts_of_different_lengths_score_as_transformers_does(toy_lm, toy_hf):
    prompts = [_ids(toy_lm, "Once upon a time the fox"), _ids(toy_lm, "The sea")]
    scores = score_prompts(toy_lm.engine, prompts, top=3)
    for ids, row in zip(prompts, scores):
        want = logprobs(toy_hf, ids, [])
        assert row[0] is None and len(row) == len(ids)
        for t in range(1, len(ids)):
            assert row[t].token == ids[t]
            assert row[t].logprob == pytest.approx(float(want[t - 1, ids[t]]), abs=1e-4)
            top = want[t - 1].topk(3)
            assert [k for k, _ in row[t].top] == top.indices.tolist()


def test_steered_scores_and_generating_rows_share_one_call(toy_lm, toy_hf):
    v = torch.randn(128, generator=torch.Generator().manual_seed(11))
    steer = Steer.of(Steer(SITE, v, 3.0), 3.0)
    ids = _ids(toy_lm, "The happy fox ran")
    scored = Request(tuple(ids), (steer,), Sampling(max_new_tokens=0, prompt_logprobs=0))
    both = Request(tuple(ids), (steer,), Sampling(max_new_tokens=3, logprobs=2, prompt_logprobs=1))
    plain = Request(tuple(_ids(toy_lm, "Hi")), (), Sampling(max_new_tokens=4))
    first, second, third = toy_lm.engine.run([scored, both, plain])
    want = logprobs(toy_hf, ids + second.tokens, [RefSteer(SITE, v, 3.0)])
    assert first.tokens == [] and first.scores == []
    assert [s.logprob for s in first.prompt_scores[1:]] == pytest.approx(
        [float(want[t - 1, ids[t]]) for t in range(1, len(ids))], abs=1e-4)  # fmt: skip
    assert [s.logprob for s in second.prompt_scores[1:]] == pytest.approx(
        [s.logprob for s in first.prompt_scores[1:]], abs=1e-5)  # fmt: skip
    full = ids + second.tokens
    for k, score in enumerate(second.scores):
        at = len(ids) + k - 1
        assert score.token == full[at + 1] == int(want[at].argmax())  # greedy, steered
        assert score.logprob == pytest.approx(float(want[at, full[at + 1]]), abs=1e-4)
        assert len(score.top) == 2
    assert len(third.tokens) == 4 and third.prompt_scores == [] and third.scores == []


def test_completion_logprobs_goes_through_the_engine(toy_lm, toy_hf):
    prompt, completion = _ids(toy_lm, "Once upon"), [toy_lm.tokenizer(" a time")["input_ids"][-1]]
    (got,) = completion_logprobs(toy_lm, [prompt], [completion])
    want = logprobs(toy_hf, prompt + completion, [])
    assert got == pytest.approx([float(want[len(prompt) - 1, completion[0]])], abs=1e-4)


def test_scoring_settings_are_checked():
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        Sampling(max_new_tokens=0)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        Sampling(prompt_logprobs=-1)
    with pytest.raises(ValueError, match="logprobs"):
        Sampling(logprobs=True)  # type: ignore[arg-type]
    assert Sampling(max_new_tokens=0, prompt_logprobs=0).max_new_tokens == 0


def test_scoring_cannot_continue_a_cache(toy_lm):
    ids = _ids(toy_lm, "Once")
    cache = toy_lm.engine.prefill([Request(tuple(ids))])
    request = Request((5,), sampling=Sampling(max_new_tokens=1, prompt_logprobs=0))
    with pytest.raises(ValueError, match="cannot continue a cache"):
        toy_lm.engine.stream([request], cache=cache)


def test_forward_keeps_only_the_last_positions_asked_for_as_transformers_computes_them(
    toy_lm, toy_hf
):
    # engine.forward(last=...) packs each row's last n positions' logits, row by row; the
    # HF backend multiplies the head only there. Against plain transformers, steered, with
    # rows of different lengths (so the shorter is left-padded).
    v = torch.randn(128, generator=torch.Generator().manual_seed(5))
    steer = Steer.of(Steer(SITE, v, 2.0), 2.0)
    prompts = [_ids(toy_lm, "Once upon a time the fox ran"), _ids(toy_lm, "The sea")]
    last = [4, 1]
    packed = toy_lm.engine.forward([Request(tuple(p), (steer,)) for p in prompts], last=last)[0]
    assert packed.shape[0] == sum(last)
    want = torch.cat([logprobs(toy_hf, p, [RefSteer(SITE, v, 2.0)])[-n:]
                      for p, n in zip(prompts, last)])  # fmt: skip
    assert torch.allclose(packed.float().log_softmax(-1), want, atol=1e-4)


def test_forward_last_equals_the_full_logits_cut_on_every_backend(lm):
    # The TransformerLens backends have no head to skip: they cut the full logits the same way.
    prompts = [tuple(lm.tokenizer.encode("a b c d e")), tuple(lm.tokenizer.encode("a"))]
    requests = [Request(p) for p in prompts]
    full = lm.engine.forward(requests)[0]
    packed = lm.engine.forward(requests, last=[3, 1])[0]
    assert torch.allclose(packed, torch.cat([full[0, -3:], full[1, -1:]]), atol=1e-5)
