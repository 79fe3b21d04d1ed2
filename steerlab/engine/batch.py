"""``Batch``: the rows of a call still decoding, and every column fed to the model.

The local engine's decode loop steps it; the compiled step prefills through it eagerly
before its static cache takes over. Both use it, so it sits in the engine, below them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from steerlab.backends.base import Backend
from steerlab.backends.cache import KVCache
from steerlab.core.prompts import Batch as PromptBatch
from steerlab.core.request import Request
from steerlab.engine.context import ForwardContext
from steerlab.engine.guard import Call


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
        self.sampled = False  # a token was appended: forwards no longer feed the prompt
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
        self.prompt_len = self.mask.sum(1)  # [batch]: real tokens before decoding starts

    def forward(self, call: Call, *, last_only: bool = True, grad: bool = False,
                keep: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """Feed the columns not yet in the cache (every column without one).

        Returns logits ``[batch, new_pos or 1, vocab]`` (with ``keep``, a bool ``[batch,
        new_pos]``: the positions it marks, packed ``[kept, vocab]``); with ``grad`` (training a steer on
        the frozen model) outside inference mode, so gradients reach the hooks' parameters.
        """
        start = self.fed if self.use_cache else 0
        device = self.backend.input_device
        context = ForwardContext.for_mask(torch.tensor(self.rows), self.mask,
                                          self.generated[:, start:], self.prompt_len,
                                          prefill=not self.sampled)  # fmt: skip
        call.context = context
        try:
            with torch.inference_mode(not grad):
                logits = self.backend.forward(
                    self.tokens[:, start:].to(device), self.mask.to(device), self.data,
                    positions=context.position_ids.to(device), last_only=last_only,
                    keep=keep,
                )  # fmt: skip
        finally:
            call.context = None
        self.fed = self.tokens.shape[1]
        return logits

    def append(self, tokens: torch.Tensor, live: torch.Tensor) -> None:
        """One new column: ``tokens`` [batch], real where ``live`` [batch] bool."""
        self.sampled = True
        self.tokens = torch.cat([self.tokens, tokens.cpu()[:, None]], 1)
        self.mask = torch.cat([self.mask, live.long()[:, None]], 1)
        self.generated = torch.cat([self.generated, live[:, None]], 1)

    def keep(self, index: list[int]) -> None:
        """Keep only the batch rows at ``index``: finished rows leave, their cache with them."""
        picked = torch.tensor(index, dtype=torch.long)
        self.rows = [self.rows[i] for i in index]
        self.tokens, self.mask = self.tokens[picked], self.mask[picked]
        self.generated, self.prompt_len = self.generated[picked], self.prompt_len[picked]
        if self.data is not None:
            self.data = self.backend.cache_ops.select(self.data, picked)

    def context(self) -> list[list[int]]:
        """Each row's real tokens so far, a continued cache's included (its whole prompt,
        before decoding starts): what the repetition penalty counts as the prompt."""
        return [row[real.bool()].tolist() for row, real in zip(self.tokens, self.mask)]

    def cache(self) -> KVCache:
        """The cache as it stands, with the tokens it holds."""
        return KVCache(self.data, self.backend.cache_ops, self.tokens, self.mask, self.generated)
