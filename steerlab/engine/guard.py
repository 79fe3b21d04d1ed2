"""One call at a time per model, and the per-forward context its hooks read.

Every engine call, steered or not, holds its models' locks from its first forward to its
end, a paused stream included. A second call is refused with a message naming the call in
flight, or waits (``wait`` seconds) where the caller asked to queue, as the panel and the
server do. Hooks act only while their own call has a forward running (``Call.context``):
any other forward through the model, even the user's own, passes them untouched.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from steerlab.core.tagging import remove_hooks
from steerlab.engine.context import ForwardContext

_REGISTRY_LOCK = threading.Lock()
_GUARDS: weakref.WeakKeyDictionary[nn.Module, _Guard] = weakref.WeakKeyDictionary()
_CALL_IDS = itertools.count(1)


class CallInFlightError(RuntimeError):
    """Another steerlab call holds this model."""


# What a hook does within its call's forward: (act, context, (rows, pos, generated)) -> the new
# activation, or None to leave it.
HookBody = Callable[[torch.Tensor, ForwardContext, tuple[torch.Tensor, ...]], torch.Tensor | None]


@dataclass
class Call:
    """One engine call: what it is, and the forward it is running now (None between)."""

    description: str
    id: int = field(default_factory=lambda: next(_CALL_IDS))
    thread: str = field(default_factory=lambda: threading.current_thread().name)
    started: float = field(default_factory=time.monotonic)
    context: ForwardContext | None = None

    def hook(self, fn: HookBody) -> Callable[[torch.Tensor], torch.Tensor | None]:
        """The one hook preamble: ``fn(act, context, (rows, pos, generated))`` runs only
        while this call has a forward running (a forward of another call, or none, leaves
        the activation alone), the context's row tensors moved to ``act``'s device once
        per forward."""

        def run(act: torch.Tensor) -> torch.Tensor | None:
            context = self.context
            if context is None:
                return None
            return fn(act, context, context.on(act.device))

        return run

    def __str__(self) -> str:
        age = time.monotonic() - self.started
        return f"call {self.id} ({self.description}, thread {self.thread!r}, {age:.1f} s ago)"


@dataclass
class _Guard:
    lock: threading.Lock = field(default_factory=threading.Lock)
    call: Call | None = None


def _guard(model: nn.Module) -> _Guard:
    with _REGISTRY_LOCK:
        if model not in _GUARDS:
            _GUARDS[model] = _Guard()
        return _GUARDS[model]


def call_in_flight(model: nn.Module) -> Call | None:
    """The call holding ``model`` now, if any."""
    return _guard(model).call


@contextmanager
def calling(models: Sequence[nn.Module], description: str, *, wait: float = 0.0) -> Iterator[Call]:
    """Hold ``models`` for one call; on every exit remove its hooks and let go.

    Args:
        models: every torch module the call runs (two for an amplified pair).
        description: what the call is, for the error a second caller sees.
        wait: seconds to queue behind a call in flight; 0 refuses at once.
    """
    call = Call(description)
    held: list[tuple[nn.Module, _Guard]] = []
    try:
        for model in dict.fromkeys(models):  # each model once, in order
            guard = _guard(model)
            got = guard.lock.acquire(timeout=wait) if wait > 0 else guard.lock.acquire(False)
            if not got:
                raise CallInFlightError(
                    f"Another steerlab call is running on this model: {guard.call}. A paused "
                    "stream counts: finish it or close() it (or use lm.remove_hooks() after an "
                    "abandoned one), then try again."
                )
            held.append((model, guard))
            guard.call = call
        yield call
    finally:
        call.context = None
        try:
            for model, _ in held:
                remove_hooks(model)
        finally:
            for _, guard in held:
                guard.call = None
                guard.lock.release()
