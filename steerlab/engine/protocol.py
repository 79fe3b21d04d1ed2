"""The engine seam: what ``SteerableModel`` needs from an engine, and what each can do.

An engine takes ``Request`` rows (token ids, steers as data, sampling settings) and
decodes them. ``LocalEngine`` is the decode loop plus hooks on an in-process backend (its
step eager, or compiled after ``compile()``); ``VLLMEngine`` hands decoding to vLLM, whose
workers apply the same steers. Every engine checks requests with the core's rules
(``check_steer``, ``check_window``) and yields ``Progress``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from steerlab.core.request import Completion, Request
from steerlab.engine.progress import Progress

if TYPE_CHECKING:
    from steerlab.backends.cache import KVCache


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do beyond decoding steers of ``core/ops/`` as data.

    Attributes:
        custom_ops: any Python callable steers (in-process hooks), not only data ops.
        cache_reuse: ``KVCache`` objects continue across calls (``cache=``, ``prefill``).
        capture: activations are recorded during a call (``capture=``).
        forward: full logits of one forward pass (``logits``, ``run_with_cache``).
        join: a running stream takes more requests (``stream(...).add``).
        compile: it can decode through a compiled step (``compile()``).
    """

    custom_ops: bool = False
    cache_reuse: bool = False
    capture: bool = False
    forward: bool = False
    join: bool = False
    compile: bool = False


class Engine(Protocol):
    kind: str
    n_layers: int
    d_model: int
    n_ctx: int | None
    n_vocab: int  # logits per position: what ``Sampling.logit_bias`` ids must be below
    capabilities: Capabilities

    def sites(self) -> list[str]: ...

    def eos_ids(self) -> set[int]: ...

    def hook_count(self) -> int: ...

    def remove_hooks(self) -> int: ...

    def sweep_hooks(self) -> int:
        """Remove hooks that no call in flight owns (none while one runs); how many."""
        ...

    def check(self, requests: Sequence[Request], capture: Sequence[str] = ()) -> object:
        """Everything about ``requests`` that can fail, before any compute."""
        ...

    def compile(self, *, mode: str | None = None, backend: str = "inductor") -> None:
        """Decode through a compiled step from now on (``capabilities.compile`` engines)."""
        ...

    def explain(self, requests: Sequence[Request], *, capture: Sequence[str] = (),
                cache: KVCache | None = None, keep_cache: bool = False,
                use_cache: bool = True) -> str:  # fmt: skip
        """One line: which path these requests take with these call options (``stream``'s),
        and why; a call ``stream`` refuses is refused."""
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
    ) -> Iterator[Progress]: ...

    def run(self, requests: Sequence[Request], *, wait: float = 0.0) -> list[Completion]: ...

    def forward(
        self,
        requests: Sequence[Request],
        *,
        capture: Sequence[str] = (),
        last_only: bool = False,
        last: Sequence[int] | None = None,
        wait: float = 0.0,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]: ...
