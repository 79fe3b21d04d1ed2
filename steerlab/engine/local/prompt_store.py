"""Prompts scored earlier, kept with their keys and values, so a later prompt that starts the
same way feeds only what is new.

Multiple-choice scoring sends one context with each of its continuations, often in separate
requests. The engine keeps each scored prompt's cache and token scores (bounded by bytes,
least recently used first out), keyed by the row's steers, so the context is computed once
however the requests arrive. Reuse is exact where it applies: the position rule is causal, so
a steer acts on a prompt's first ``n`` tokens the same way whatever follows them, and the
key holds every steer with its alpha.

The store forgets everything when the model changes under it: a parameter written in place
or replaced, a hook of the user's own added or removed, or the model put in training mode.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from types import FunctionType, ModuleType
from typing import Any

import torch
from torch import nn

from steerlab.core.request import Request, TokenScore
from steerlab.core.tagging import is_tagged

RowKey = tuple[str, ...]  # each live steer's mark (``Steer.mark``)


@dataclass(frozen=True)
class Stored:
    """One scored prompt: its one-row cache (real positions only) and each token's score."""

    tokens: tuple[int, ...]
    data: Any
    scores: tuple[TokenScore | None, ...]  # scores[0] is None: nothing predicts it
    top: int  # alternatives kept per score
    nbytes: int  # all of it: the cache's tensors and objects, the tokens, the scores


def stored(tokens: tuple[int, ...], data: Any, scores: tuple[TokenScore | None, ...],
           top: int) -> Stored:  # fmt: skip
    """A ``Stored`` prompt, with the bytes it holds measured (``held_bytes``)."""
    nbytes = held_bytes(data) + held_bytes(tokens) + sys.getsizeof(scores)
    nbytes += sum(score_bytes(s) for s in scores) + _ENTRY_BYTES
    return Stored(tokens, data, scores, top, nbytes)


_PAIR_BYTES = sys.getsizeof((0, 0.0)) + sys.getsizeof(1 << 29) + sys.getsizeof(0.0)
_ENTRY_BYTES = 1024  # the Stored itself, its key and its place in the store's dict, rounded up


def score_bytes(score: TokenScore | None) -> int:
    """The bytes one token's score holds: the object, its fields, and its alternatives as
    (token, logprob) pairs (each a tuple, an int and a float). Shared small ints are
    counted as if they were not, so the figure is never under."""
    if score is None:
        return 0
    own = sys.getsizeof(score) + sys.getsizeof(getattr(score, "__dict__", ()))
    own += sys.getsizeof(score.token) + sys.getsizeof(score.logprob) + sys.getsizeof(score.top)
    return own + len(score.top) * _PAIR_BYTES


def held_bytes(value: Any) -> int:
    """The bytes ``value`` holds: every object reachable through its containers and
    attributes (``sys.getsizeof``), and each tensor storage once, whole (a view holds it
    all). Classes, modules and functions are shared, not held.

    >>> held_bytes(torch.zeros(4, 256)) >= 4 * 256 * 4
    True
    """
    seen: set[int] = set()
    storages: set[tuple[int, str]] = set()
    total, todo = 0, [value]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (type, ModuleType, FunctionType, nn.Module)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if (storage.data_ptr(), str(obj.device)) not in storages:
                storages.add((storage.data_ptr(), str(obj.device)))
                total += storage.nbytes()
        elif isinstance(obj, (tuple, list, set, frozenset)):
            todo.extend(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.keys())
            todo.extend(obj.values())
        elif hasattr(obj, "__dict__"):
            todo.append(vars(obj))
    return total


def row_key(request: Request) -> RowKey:
    """What a prompt's cache depends on besides its tokens: every steer with its alpha."""
    return tuple(s.mark() for s in request.steers if s.alpha[0] != 0)


def model_state(models: Sequence[nn.Module]) -> tuple[Any, ...] | None:
    """A value that changes when the model's outputs may; None when it is training.

    One walk over the modules (every scoring call pays for it): each parameter's version and
    storage, and the forward hooks that are not steerlab's own."""
    params: list[tuple[int, int]] = []
    foreign = 0
    for m in models:
        for module in m.modules():
            if module.training:
                return None
            params += [(p._version, p.data_ptr()) for p in module._parameters.values()
                       if p is not None]  # fmt: skip
            foreign += sum(not is_tagged(fn) for name in ("_forward_hooks", "_forward_pre_hooks")
                           for fn in getattr(module, name).values())  # fmt: skip
    globals_ = len(nn.modules.module._global_forward_hooks)
    globals_ += len(nn.modules.module._global_forward_pre_hooks)
    return tuple(id(m) for m in models), tuple(params), foreign, globals_


def common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens ``a`` and ``b`` share from the start.

    >>> common_length([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PromptStore:
    """Scored prompts by row key, least recently used dropped past ``max_bytes``."""

    def __init__(self, max_bytes: int = 256 << 20) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[RowKey, tuple[int, ...]], Stored] = OrderedDict()
        self._bytes = 0
        self._state: tuple[Any, ...] | None = None
        self.hits = 0  # prompts that started from a stored one, for tests and benchmarks

    def sync(self, state: tuple[Any, ...] | None) -> bool:
        """Forget everything unless the model is as it was; whether the store may be used."""
        if state is None or state != self._state:
            self.clear()
        self._state = state
        return state is not None and self.max_bytes > 0

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def best(self, key: RowKey, tokens: Sequence[int], top: int) -> tuple[Stored, int] | None:
        """The stored prompt sharing the most leading tokens (at least 2) with ``tokens``."""
        found: tuple[Stored, int] | None = None
        for (k, _), entry in self._entries.items():
            if k != key or entry.top < top or entry.tokens[:2] != tuple(tokens[:2]):
                continue
            n = common_length(entry.tokens, tokens)
            if n >= 2 and (found is None or n > found[1]):
                found = (entry, n)
        if found is not None:
            self._entries.move_to_end((key, found[0].tokens))
            self.hits += 1
        return found

    def fits(self, nbytes: int) -> bool:
        """Whether a prompt of ``nbytes`` is worth keeping (at most an eighth of the store)."""
        return 0 < nbytes <= self.max_bytes // 8

    def add(self, key: RowKey, entry: Stored) -> None:
        old = self._entries.pop((key, entry.tokens), None)
        if old is not None:
            self._bytes -= old.nbytes
        self._entries[(key, entry.tokens)] = entry
        self._bytes += entry.nbytes
        while self._bytes > self.max_bytes and self._entries:
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= dropped.nbytes

    def __len__(self) -> int:
        return len(self._entries)
