"""The engine seam: what ``SteerableModel`` needs from an engine.

An engine takes ``Request`` rows (token ids, steers as data, sampling settings) and
decodes them. ``LocalEngine`` is the decode loop plus hooks on an in-process backend (a
module-level hook table); ``CompiledEngine`` runs its decode step compiled; ``VLLMEngine``
hands decoding to vLLM, whose workers apply the same steers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch

from steerlab.backends.cache import KVCache
from steerlab.core.request import Completion, Request


class Engine(Protocol):
    kind: str
    n_layers: int
    d_model: int
    n_ctx: int | None

    def sites(self) -> list[str]: ...

    def eos_ids(self) -> set[int]: ...

    def hook_count(self) -> int: ...

    def remove_hooks(self) -> int: ...

    def check(self, requests: Sequence[Request], capture: Sequence[str] = ()) -> Any:
        """Everything about ``requests`` that can fail, before any compute."""
        ...

    def prefill(
        self, requests: Sequence[Request], *, cache: KVCache | None = None, wait: float = 0.0
    ) -> KVCache: ...

    def stream(
        self,
        requests: Sequence[Request],
        *,
        cache: KVCache | None = None,
        keep_cache: bool = False,
        capture: Sequence[str] = (),
        use_cache: bool = True,
        wait: float = 0.0,
        description: str = "generate",
    ) -> Iterator[Any]:  # Progress
        ...

    def run(self, requests: Sequence[Request], *, wait: float = 0.0) -> list[Completion]: ...

    def forward(
        self,
        requests: Sequence[Request],
        *,
        capture: Sequence[str] = (),
        last_only: bool = False,
        wait: float = 0.0,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]: ...
