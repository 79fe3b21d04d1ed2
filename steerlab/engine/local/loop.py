"""The decode loop: prefill once, then one token per step through the KV cache.

Steering is not in here: hooks attached around the loop see every forward pass through
the call's per-forward context. The loop samples, records, and drops finished rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import torch

from steerlab.backends.base import Backend
from steerlab.backends.cache import KVCache
from steerlab.core.prompts import Batch as PromptBatch
from steerlab.core.request import Request, TokenScore
from steerlab.core.sampling import adjust_logits, adjusts, check_finite, sample
from steerlab.engine.context import ForwardContext
from steerlab.engine.guard import Call
from steerlab.engine.scoring import prompt_scores, token_scores
from steerlab.engine.state import RandomStreams, RowStates


class Batch:
    """The rows of a call still decoding, and every column fed: ids, mask, generated flags.

    With a ``cache`` the new columns follow the cached ones (a row's new tokens are
    left-padded within the new segment, so pads may sit mid-sequence; the mask covers
    them). A cache with no new tokens recomputes its last position to get logits.
    """

    def __init__(self, backend: Backend, requests: Sequence[Request], cache: KVCache | None,
                 pad_id: int, use_cache: bool) -> None:  # fmt: skip
        self.backend, self.use_cache = backend, use_cache
        self.rows = list(range(len(requests)))  # call rows still in the batch
        new = [list(r.prompt) for r in requests]
        first_generated = [False] * len(new)  # is each row's first new token a generated one
        if cache is not None and not all(new):
            if not bool(cache.mask[:, -1].all()):
                raise ValueError(
                    "A row of this cache finished before the cache's end, so it cannot "
                    "continue without new tokens: give every row a prompt."
                )
            first_generated = cache.generated[:, -1].tolist()
            new = [[int(cache.tokens[i, -1]), *row] for i, row in enumerate(new)]
            cache.crop(cache.length - 1)
        padded = PromptBatch.left_pad(new, pad_id)
        ids, mask = padded.input_ids, padded.attention_mask
        generated = torch.zeros_like(ids, dtype=torch.bool)
        for i, row in enumerate(new):
            if row:
                generated[i, ids.shape[1] - len(row)] = first_generated[i]
            if requests[i].generated:  # earlier replies fed again stay "generated"
                flags = torch.tensor(requests[i].generated, dtype=torch.bool)
                generated[i, ids.shape[1] - len(flags) :] = flags
        if cache is None:
            self.data = backend.new_cache(len(new)) if use_cache else None
            self.tokens, self.mask, self.generated, self.fed = ids, mask, generated, 0
        else:
            self.data = cache.data
            self.tokens = torch.cat([cache.tokens, ids], 1)  # [batch, seq]
            self.mask = torch.cat([cache.mask, mask], 1)  # [batch, seq]
            self.generated = torch.cat([cache.generated, generated], 1)  # [batch, seq]
            self.fed = cache.length

    def forward(self, call: Call, *, last_only: bool = True) -> torch.Tensor:
        """Feed the columns not yet in the cache (every column without one).

        Returns logits ``[batch, new_pos or 1, vocab]``.
        """
        start = self.fed if self.use_cache else 0
        device = self.backend.input_device
        context = ForwardContext.for_mask(torch.tensor(self.rows), self.mask,
                                          self.generated[:, start:])  # fmt: skip
        call.context = context
        try:
            with torch.inference_mode():
                logits = self.backend.forward(
                    self.tokens[:, start:].to(device), self.mask.to(device), self.data,
                    positions=context.position_ids.to(device), last_only=last_only,
                )  # fmt: skip
        finally:
            call.context = None
        self.fed = self.tokens.shape[1]
        return logits

    def append(self, tokens: torch.Tensor, live: torch.Tensor) -> None:
        """One new column: ``tokens`` [batch], real where ``live`` [batch] bool."""
        self.tokens = torch.cat([self.tokens, tokens.cpu()[:, None]], 1)
        self.mask = torch.cat([self.mask, live.long()[:, None]], 1)
        self.generated = torch.cat([self.generated, live[:, None]], 1)

    def keep(self, index: list[int]) -> None:
        """Keep only the batch rows at ``index``: finished rows leave, their cache with them."""
        picked = torch.tensor(index, dtype=torch.long)
        self.rows = [self.rows[i] for i in index]
        self.tokens, self.mask = self.tokens[picked], self.mask[picked]
        self.generated = self.generated[picked]
        if self.data is not None:
            self.data = self.backend.cache_ops.select(self.data, picked)

    def context(self) -> list[list[int]]:
        """Each row's real tokens so far, a continued cache's included (its whole prompt,
        before decoding starts): what the repetition penalty counts as the prompt."""
        return [row[real.bool()].tolist() for row, real in zip(self.tokens, self.mask)]

    def cache(self) -> KVCache:
        """The cache as it stands, with the tokens it holds."""
        return KVCache(self.data, self.backend.cache_ops, self.tokens, self.mask, self.generated)


class Stepper(Protocol):
    """What ``decode`` needs of a batch: ``Batch`` here, or the compiled step's static one."""

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
) -> Iterator[int]:
    """Decode every row to its end, yielding the step index after each step.

    Forward passes run under ``torch.inference_mode``, but never across a ``yield``: the
    caller's code between steps keeps autograd. With ``compact``, finished rows leave the
    batch once half of it has finished; with ``keep_cache`` the last tokens are fed too,
    so the cache ends exactly at the end of the text. Rows whose sampling scores the prompt
    get their scores from the prefill's logits (the batch must start without a cache).
    Penalties, bias and ``min_tokens`` adjust the logits a row samples from, never its
    reported logprobs.
    """
    streams = RandomStreams(states.requests)
    requests = states.requests
    # every token before the output, per call row (the batch has all rows at the start)
    prompts = batch.context() if any(adjusts(r.sampling) for r in requests) else None
    tops = [r.sampling.prompt_logprobs for r in requests]
    if any(top is not None for top in tops):
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
