"""The decode loop: prefill once, then one token per step through the KV cache.

Steering is not in here: hooks attached around the loop see every forward pass through
the call's per-forward context. The loop samples, records, and drops finished rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch

from steerlab.core.request import TokenScore
from steerlab.core.sampling import adjust_logits, adjusts, check_finite, sample
from steerlab.engine.batch import Batch
from steerlab.engine.guard import Call
from steerlab.engine.scoring import prompt_scores, token_scores
from steerlab.engine.state import RandomStreams, RowStates


class Stepper(Protocol):
    """What ``decode`` needs of a batch: the eager ``Batch``, or the compiled step's static one."""

    rows: list[int]

    def forward(self, call: Call, *, last_only: bool = True) -> torch.Tensor: ...

    def append(self, tokens: torch.Tensor, live: torch.Tensor) -> None: ...

    def keep(self, index: list[int]) -> None: ...

    def context(self) -> list[list[int]]: ...


def decode(
    batch: Stepper,
    states: RowStates,
    call: Call,
    *,
    eos_ids: set[int],
    pad_id: int,
    compact: bool,
    keep_cache: bool,
    first: tuple[torch.Tensor, list[list[TokenScore | None]]] | None = None,
) -> Iterator[int]:
    """Decode every row to its end, yielding the step index after each step.

    Forward passes run under ``torch.inference_mode``, but never across a ``yield``: the
    caller's code between steps keeps autograd. With ``compact``, finished rows leave the
    batch once half of it has finished; with ``keep_cache`` the last tokens are fed too,
    so the cache ends exactly at the end of the text. Rows whose sampling scores the prompt
    get their scores from the prefill's logits (the batch must start without a cache).
    Penalties, bias and ``min_tokens`` adjust the logits a row samples from, never its
    reported logprobs. ``first`` hands over the first step's logits [batch, vocab] and the
    prompts' scores, computed already (``scored.prefill_scored``).
    """
    streams = RandomStreams(states.requests)
    requests = states.requests
    # every token before the output, per call row (the batch has all rows at the start)
    prompts = batch.context() if any(adjusts(r.sampling) for r in requests) else None
    tops = [r.sampling.prompt_logprobs for r in requests]
    if first is not None:
        logits, states.prompt_scores = first
    elif any(top is not None for top in tops):
        if not isinstance(batch, Batch) or batch.fed:
            raise ValueError("Scoring a prompt needs the whole prompt fed in this call.")
        every = batch.forward(call, last_only=False)  # [batch, seq, vocab]
        real = batch.mask.bool().to(every.device)[..., None]  # pads' logits are never read
        check_finite(every.float().masked_fill(~real, 0).sum(1), 0, requests)
        scored = prompt_scores(every, batch.tokens, [len(r.prompt) for r in requests], tops)
        states.prompt_scores = scored
        logits = every[:, -1]
    else:
        logits = batch.forward(call)[:, -1]  # [batch, vocab]
    if all(states.done):  # every row only scores its prompt
        yield 0
        return
    for step in range(max(r.sampling.max_new_tokens for r in requests)):
        rows = [requests[r] for r in batch.rows]
        check_finite(logits, step, rows)
        live = torch.tensor([not states.done[r] for r in batch.rows])  # [batch]
        adjusted = logits  # [batch, vocab]: what the rows sample from
        if prompts is not None:
            adjusted = adjust_logits(logits, [r.sampling for r in rows],
                                     [prompts[r] for r in batch.rows],
                                     [states.tokens[r] for r in batch.rows], eos_ids)  # fmt: skip
        token = sample(adjusted, streams.draw(batch.rows), rows)
        logprobs = logits.float().log_softmax(-1)  # [batch, vocab]: the scores, unadjusted
        top = max((requests[r].sampling.logprobs or 0) for r in batch.rows)
        scores = token_scores(logprobs, token, top)
        token = token.cpu().masked_fill(~live, pad_id)  # [batch]
        for row, t, score, alive in zip(batch.rows, token.tolist(), scores, live):
            if alive:
                n = requests[row].sampling.logprobs or 0
                states.add(row, t, score.logprob, eos_ids,
                           TokenScore(t, score.logprob, score.top[:n]))  # fmt: skip
        batch.append(token, live)
        finished = all(states.done[r] for r in batch.rows)
        if finished and keep_cache:
            batch.forward(call)  # the cache ends exactly at the end of the text
        yield step
        done = [states.done[r] for r in batch.rows]
        if finished or all(done):  # all(done): the caller cancelled the last rows
            return
        if compact and 2 * sum(done) >= len(done):
            batch.keep([i for i, d in enumerate(done) if not d])
        logits = batch.forward(call)[:, -1]
