"""Scoring calls feed each shared start once (``engine/local/scored.py``) and continue from
prompts scored before (``PromptStore``): multiple choice scores as plain transformers does,
on every backend, in one call or one row at a time, steered or not, for fewer tokens fed."""

from __future__ import annotations

import pytest
import torch
from reference import RefSteer, logprobs

import steerlab as sl
from steerlab.core.request import Request, Sampling
from steerlab.core.steer import Steer

SITE = "blocks.2.hook_resid_post"
CONTEXTS = ["Once upon a time the little fox", "The sea was calm and the boat", "Mia had a dog"]
CHOICES = [" ran away.", " smiled.", " cried a lot that day.", " went home"]


def _rows(lm: sl.SteerableModel, steers: tuple[Steer, ...] = ()) -> list[Request]:
    sampling = Sampling(max_new_tokens=1, temperature=0.0, prompt_logprobs=1)
    rows = []
    for context in CONTEXTS:
        ids = lm.tokenizer(context)["input_ids"]
        for choice in CHOICES:
            more = lm.tokenizer(choice, add_special_tokens=False)["input_ids"]
            rows.append(Request(tuple(ids + more), steers, sampling))
    return rows


def _check(done, rows, toy_hf, steers: list[RefSteer]) -> None:
    for completion, row in zip(done, rows):
        ids = list(row.prompt)
        want = logprobs(toy_hf, ids, steers)
        scores = completion.prompt_scores
        assert scores[0] is None and [s.token for s in scores[1:]] == ids[1:]
        got = [s.logprob for s in scores[1:]]
        assert got == pytest.approx([float(want[t - 1, ids[t]]) for t in range(1, len(ids))],
                                    abs=1e-4)  # fmt: skip
        assert [s.top[0][0] for s in scores[1:]] == want[:-1].argmax(-1).tolist()
        assert completion.tokens == [int(want[-1].argmax())]  # greedy, from the last logits


def _fed(lm: sl.SteerableModel) -> list[int]:
    """Counts the token positions every forward of ``lm`` feeds (pads included)."""
    fed: list[int] = []
    embed = lm.backend.model.get_input_embeddings()
    embed.register_forward_hook(lambda m, args, out: fed.append(args[0].numel()))
    return fed


@pytest.mark.parametrize("backend", ["hf", "bridge", "hooked"])
def test_multiple_choice_scores_as_transformers_in_one_call_and_one_row_at_a_time(backend, toy_hf):
    lm = sl.load("steerlab-tiny", backend=backend)
    rows = _rows(lm)
    _check(lm.engine.run(rows), rows, toy_hf, [])
    lm.engine.prompt_store.clear()
    done = [lm.engine.run([row])[0] for row in rows]  # each context computed once, then reused
    _check(done, rows, toy_hf, [])
    assert lm.engine.prompt_store.hits >= len(rows) - len(CONTEXTS)


def test_shared_contexts_are_fed_once(toy_hf):
    lm = sl.load("steerlab-tiny", backend="hf")
    rows = _rows(lm)
    fed = _fed(lm)
    lm.engine.run(rows)
    # one forward of every row, left-padded, feeds 12 x 15 positions; the contexts once
    # (3 x 12, padded) and the choices (12 x 8, padded) feed 132
    assert sum(fed) < sum(len(r.prompt) for r in rows) == 165
    fed.clear()
    lm.engine.run(rows[:1])  # its context is stored: the choice and one context token are fed
    context = lm.tokenizer(CONTEXTS[0])["input_ids"]
    assert sum(fed) == len(rows[0].prompt) - len(context) + 1


def test_steered_rows_share_only_with_the_same_steer(toy_hf):
    lm = sl.load("steerlab-tiny", backend="hf")
    v = torch.randn(128, generator=torch.Generator().manual_seed(5))
    steer = Steer.of(Steer(SITE, v, 1.0), 4.0)
    plain, steered = _rows(lm), _rows(lm, (steer,))
    mixed = [r for pair in zip(plain, steered) for r in pair]
    done = lm.engine.run(mixed)
    _check(done[0::2], plain, toy_hf, [])
    _check(done[1::2], steered, toy_hf, [RefSteer(SITE, v, 4.0)])
    half = Steer.of(Steer(SITE, v, 1.0), 2.0)
    again = _rows(lm, (half,))[:2]  # stored under alpha 4 and 0, never reused at alpha 2
    _check(lm.engine.run(again), again, toy_hf, [RefSteer(SITE, v, 2.0)])


def test_the_store_forgets_a_model_changed_in_place(toy_hf):
    lm = sl.load("steerlab-tiny", backend="hf")
    rows = _rows(lm)[:2]
    lm.engine.run(rows)
    weight = lm.backend.model.get_input_embeddings().weight
    with torch.no_grad():
        weight.mul_(1.5)
        toy_hf.get_input_embeddings().weight.mul_(1.5)
    try:
        _check(lm.engine.run(rows), rows, toy_hf, [])
    finally:
        with torch.no_grad():
            toy_hf.get_input_embeddings().weight.div_(1.5)
