"""The engine seam: what turns requests into results.

Two levels sit under ``SteerableModel``. An *engine* takes ``Request`` rows (token ids,
steers as data, sampling settings) and decodes them; the in-process ``LocalEngine`` is
the decode loop plus hooks on a *backend* (a module-level hook table), and an engine that
owns its own loop and cache (vLLM) fills the same seam.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from steerlab.engine.request import Completion, Request


class Engine(Protocol):
    kind: str
    n_layers: int
    d_model: int
    n_ctx: int | None

    def sites(self) -> list[str]: ...

    def eos_ids(self) -> set[int]: ...

    def hook_count(self) -> int: ...

    def remove_hooks(self) -> int: ...

    def run(self, requests: Sequence[Request], *, wait: float = 0.0) -> list[Completion]:
        """Decode every request; one ``Completion`` per request, in order."""
        ...

    def stream_completions(
        self, requests: Sequence[Request], *, wait: float = 0.0
    ) -> Iterator[tuple[int, list[Completion]]]:
        """After each step, ``(step, completions so far)``; rows end independently."""
        ...
