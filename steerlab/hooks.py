"""Scoped hook registration: every hook steerlab adds comes off in ``finally``.

Hooks are tagged, so ``count_hooks`` reads the real state of the model rather
than a counter that could drift; the model's own hooks are never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

_TAG = "__steerlab_hook__"


def tag(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` as a steerlab hook, so ``count_hooks`` can find it."""
    setattr(fn, _TAG, True)
    return fn


def count_hooks(model: nn.Module) -> int:
    """How many steerlab hooks are registered anywhere on ``model``.

    >>> count_hooks(nn.Linear(2, 2))
    0
    """
    total = 0
    for module in model.modules():
        for hooks in (module._forward_hooks, module._forward_pre_hooks):
            total += sum(1 for fn in hooks.values() if getattr(fn, _TAG, False))
    return total


class HookSet:
    """Handles collected while hooks are attached; ``remove`` is idempotent."""

    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []

    def add(self, handles: RemovableHandle | list[RemovableHandle]) -> None:
        self._handles += handles if isinstance(handles, list) else [handles]

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()

    def __len__(self) -> int:
        return len(self._handles)


@contextmanager
def scoped_hooks() -> Iterator[HookSet]:
    """Yield a ``HookSet`` whose hooks are removed on any exit.

    That covers a normal exit, an exception raised inside a hook, a
    KeyboardInterrupt and a generator closed halfway (GeneratorExit).
    """
    hooks = HookSet()
    try:
        yield hooks
    finally:
        hooks.remove()
