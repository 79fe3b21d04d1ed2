"""Steerlab's hooks on a model: tagged, counted and removed by reading the model itself.

Removal never goes through ``RemovableHandle``: a handle holds only a weak reference to
its module's hook dict, and the cyclic garbage collector clears weak references before it
runs a dead stream's ``finally``. Scanning the modules' own dicts for the tag removes
every steerlab hook, including one registered an instant before a KeyboardInterrupt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

_TAG = "__steerlab_hook__"
_DICTS = ("_forward_hooks", "_forward_pre_hooks")
_SIDE_DICTS = ("_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_forward_pre_hooks_with_kwargs")  # fmt: skip


def tag(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` as a steerlab hook before it is registered."""
    setattr(fn, _TAG, True)
    return fn


def is_tagged(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is one of steerlab's hooks (``tag``)."""
    return bool(getattr(fn, _TAG, False))


def _tagged(module: nn.Module) -> list[tuple[dict, int]]:
    found = []
    for name in _DICTS:
        hooks = getattr(module, name, {})
        found += [(hooks, key) for key, fn in list(hooks.items()) if is_tagged(fn)]
    return found


def count_hooks(model: nn.Module) -> int:
    """How many steerlab hooks are registered anywhere on ``model``.

    >>> count_hooks(nn.Linear(2, 2))
    0
    """
    return sum(len(_tagged(module)) for module in model.modules())


def remove_hooks(model: nn.Module) -> int:
    """Remove every steerlab hook from ``model``; the model's own hooks stay. Returns how many.

    A KeyboardInterrupt arriving mid-way does not stop the removal: it is re-raised once
    every hook is off.
    """
    removed, interrupted = 0, False
    while True:
        try:
            for module in model.modules():
                for hooks, key in _tagged(module):
                    hooks.pop(key, None)
                    for side in _SIDE_DICTS:
                        getattr(module, side, {}).pop(key, None)
                    removed += 1
            break
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        raise KeyboardInterrupt
    return removed
