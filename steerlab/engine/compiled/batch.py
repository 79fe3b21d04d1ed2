"""``StaticBatch``: the decode loop's batch, prefilled eagerly, then stepped by a compiled graph.

The prompt goes through the eager path (hooks and all), so the prefill and the first
token are exactly the eager engine's; its cache is copied into the static one, and each
later token is one call of the compiled step. Rows never leave the batch (its size is
the graph's); finished rows feed pads that the mask hides, as in the eager loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from steerlab.backends.base import Backend
from steerlab.core.request import Request
from steerlab.engine.batch import Batch
from steerlab.engine.compiled.runner import StepRunner
from steerlab.engine.guard import Call
from steerlab.engine.plan import Plan
from steerlab.engine.reads import CallReads


def cache_layers(data: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of a HuggingFace ``DynamicCache``."""
    return [(layer.keys, layer.values) for layer in data.layers]


class StaticBatch:
    """What ``engine.local.loop.decode`` needs of a batch: ``rows``, ``forward``, ``append``."""

    def __init__(self, backend: Backend, requests: Sequence[Request], pad_id: int,
                 runner: StepRunner, plan: Plan, reads: CallReads | None = None) -> None:  # fmt: skip
        self.eager = Batch(backend, requests, None, pad_id, use_cache=True)
        self.plan, self.reads = plan, reads
        self.rows = self.eager.rows
        self.runner, self.requests = runner, requests
        self.device = runner.ids.device
        self.column = self.eager.tokens.shape[1]  # the next cache column to write
        self.count = self.eager.mask.sum(1)  # [rows] real tokens so far
        self.last = torch.zeros(len(requests), dtype=torch.long)
        self.live = torch.zeros(len(requests), dtype=torch.bool)
        self.prefilled = False

    def forward(self, call: Call, *, last_only: bool = True) -> torch.Tensor:
        """The prompts eagerly the first time, then one compiled step: logits [rows, 1, vocab]."""
        if not self.prefilled:
            logits = self.eager.forward(call, last_only=True)
            plan = self.reads.gated() if self.reads else self.plan
            self.runner.start(plan, cache_layers(self.eager.data), self.eager.mask)
            self.eager.data, self.prefilled = None, True
            return logits
        pos = torch.where(self.live, self.count - 1, 1)  # pads get 1, as in the eager loop
        logits, read = self.runner.step(self.last.to(self.device), pos.to(self.device),
                                        self.live.to(self.device), self.column)  # fmt: skip
        if self.reads is not None and read.shape[0]:
            self.reads.add_step(read)  # what the eager hooks would have read
        self.column += 1
        return logits[:, None]

    def append(self, tokens: torch.Tensor, live: torch.Tensor) -> None:
        """The tokens just sampled (real where ``live``), to feed at the next step."""
        self.last, self.live = tokens.cpu(), live.cpu()
        self.count = self.count + self.live.long()

    def context(self) -> list[list[int]]:
        return self.eager.context()  # the prompts: decoded tokens are fed, never appended

    def keep(self, index: list[int]) -> None:
        raise RuntimeError("A static batch keeps its rows; decode it with compact=False.")
