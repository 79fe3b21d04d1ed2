"""``KVCache``: a key/value cache that outlives a call, with the tokens it holds.

The cache is what lets a call continue where another ended (a chat turn, a second batch
of tokens). Besides the backend's own cache object it keeps, per row, the token ids it
holds, their attention mask (0 on pads, which may sit in the middle after rows of
different lengths were continued) and which tokens the model generated, so positions and
``positions="prompt"/"generated"`` keep their meaning across calls.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class CacheOps(Protocol):
    """How one backend's cache object is copied, expanded, cropped and compacted."""

    def fork(self, data: Any) -> Any: ...

    def repeat(self, data: Any, n: int) -> Any: ...  # each row n times, interleaved

    def crop(self, data: Any, length: int) -> Any: ...

    def select(self, data: Any, rows: torch.Tensor) -> Any: ...

    # one row's positions at ``keep`` (a new object; pads left out where ``keep`` skips them)
    def take(self, data: Any, row: int, keep: torch.Tensor) -> Any: ...

    # one-row caches (None: no positions) left-padded to ``length`` and stacked as rows
    def stack(self, parts: list[Any], length: int) -> Any: ...


@dataclass
class KVCache:
    """A backend's KV cache plus the tokens it holds.

    Attributes:
        data: the backend's own cache object (HF ``DynamicCache``, TransformerLens's cache,
            or a pair of them for an amplified model).
        tokens: [batch, length] token ids (pads where ``mask`` is 0).
        mask: [batch, length] 1 on real tokens.
        generated: [batch, length] True where the model produced the token.

    >>> out = lm.generate("Once", max_new_tokens=4, keep_cache=True)
    >>> out.text
    [' upon a time,']
    >>> out.cache.tokens.shape
    torch.Size([1, 6])
    >>> lm.generate(None, cache=out.cache, max_new_tokens=4).text
    [' there was a little']
    """

    data: Any
    ops: CacheOps
    tokens: torch.Tensor
    mask: torch.Tensor
    generated: torch.Tensor

    @property
    def length(self) -> int:
        """Positions held (pads included)."""
        return int(self.tokens.shape[1])

    @property
    def batch_size(self) -> int:
        return int(self.tokens.shape[0])

    def fork(self) -> KVCache:
        """An independent copy, to continue in several ways from one point."""
        return KVCache(self.ops.fork(self.data), self.ops, self.tokens.clone(), self.mask.clone(),
                       self.generated.clone())  # fmt: skip

    def repeat(self, n: int) -> KVCache:
        """A new cache with each row repeated ``n`` times (row-major: r0, r0, r1, r1, ...)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"repeat needs an int n >= 1; got {n!r}.")
        data = self.ops.repeat(self.ops.fork(self.data), n)
        return KVCache(data, self.ops, self.tokens.repeat_interleave(n, 0),
                       self.mask.repeat_interleave(n, 0),
                       self.generated.repeat_interleave(n, 0))  # fmt: skip

    def crop(self, length: int) -> KVCache:
        """Keep the first ``length`` positions, in place; returns the cache."""
        if isinstance(length, bool) or not isinstance(length, int) or not 0 < length <= self.length:
            raise ValueError(f"crop length must be in 1..{self.length}; got {length!r}.")
        self.data = self.ops.crop(self.data, length)
        self.tokens, self.mask = self.tokens[:, :length], self.mask[:, :length]
        self.generated = self.generated[:, :length]
        return self

    def select(self, rows: torch.Tensor | list[int]) -> KVCache:
        """Keep only ``rows``, in place (how finished rows leave a batch); returns the cache."""
        index = torch.as_tensor(rows, dtype=torch.long)
        self.data = self.ops.select(self.data, index)
        self.tokens, self.mask = self.tokens[index], self.mask[index]
        self.generated = self.generated[index]
        return self

    def row_tokens(self, row: int) -> list[int]:
        """The real tokens of one row, pads left out."""
        return self.tokens[row][self.mask[row].bool()].tolist()

    def __repr__(self) -> str:
        return f"KVCache(batch={self.batch_size}, length={self.length}, {type(self.data).__name__})"


class DynamicCacheOps:
    """HuggingFace ``DynamicCache`` (the hf and bridge backends)."""

    def fork(self, data: Any) -> Any:
        return copy.deepcopy(data)

    def repeat(self, data: Any, n: int) -> Any:
        data.batch_repeat_interleave(n)
        return data

    def crop(self, data: Any, length: int) -> Any:
        layers = getattr(data, "layers", None)
        if layers is None:  # transformers 4: crop takes the length to keep
            data.crop(length)
            return data
        for layer in layers:  # transformers 5: how many to remove, per layer (their
            extra = layer.get_seq_length() - length  # lengths differ after an interrupted
            if extra > 0:  # forward, so each layer is cut on its own)
                layer.crop(-extra)
        return data

    def select(self, data: Any, rows: torch.Tensor) -> Any:
        data.batch_select_indices(rows.to(_first_device(data)))
        return data

    def take(self, data: Any, row: int, keep: torch.Tensor) -> Any:
        def pick(t: torch.Tensor) -> torch.Tensor:  # [batch, heads, seq, d_head]
            return t[row : row + 1].index_select(2, keep.to(t.device))

        return _with_layers(data, [(pick(layer.keys), pick(layer.values))
                                   for layer in _layers(data)])  # fmt: skip

    def stack(self, parts: list[Any], length: int) -> Any:
        some = next(p for p in parts if p is not None)
        out = []
        for i, layer in enumerate(_layers(some)):
            each = [None if p is None else _layers(p)[i] for p in parts]
            out.append(tuple(_stacked([None if e is None else getattr(e, name) for e in each],
                                      getattr(layer, name), 2, length)
                             for name in ("keys", "values")))  # fmt: skip
        return _with_layers(some, out)  # type: ignore[arg-type]


def _layers(data: Any) -> list[Any]:
    layers = getattr(data, "layers", None)
    if layers is None:
        raise TypeError("Taking rows out of a cache needs transformers 5's DynamicCache.")
    return list(layers)


def _with_layers(data: Any, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """A new cache like ``data`` holding ``tensors`` (keys, values per layer)."""
    new = copy.copy(data)
    new.layers = []
    for layer, (keys, values) in zip(_layers(data), tensors):
        fresh = copy.copy(layer)
        fresh.keys, fresh.values = keys, values
        new.layers.append(fresh)
    return new


def _stacked(rows: list[torch.Tensor | None], like: torch.Tensor, dim: int,
             length: int) -> torch.Tensor:  # fmt: skip
    """One-row tensors (None: no positions yet) right-aligned along ``dim`` in ``length``
    positions, zeros before them, stacked as rows."""
    shape = list(like.shape)
    shape[0], shape[dim] = len(rows), length
    out = like.new_zeros(shape)
    for i, t in enumerate(rows):
        if t is not None and t.shape[dim]:
            out[i : i + 1].narrow(dim, length - t.shape[dim], t.shape[dim]).copy_(t)
    return out


def _first_device(data: Any) -> torch.device:
    layers = getattr(data, "layers", [])
    keys = getattr(layers[0], "keys", None) if layers else None
    return keys.device if isinstance(keys, torch.Tensor) else torch.device("cpu")


class LensCacheOps:
    """TransformerLens's ``TransformerLensKeyValueCache`` (the hooked backend), by hand."""

    def fork(self, data: Any) -> Any:
        return copy.deepcopy(data)

    def _each(self, data: Any, fn: Any) -> Any:
        for entry in data.entries:
            entry.past_keys, entry.past_values = fn(entry.past_keys), fn(entry.past_values)
        data.previous_attention_mask = fn(data.previous_attention_mask)
        return data

    def repeat(self, data: Any, n: int) -> Any:
        return self._each(data, lambda t: t.repeat_interleave(n, 0))

    def crop(self, data: Any, length: int) -> Any:
        return self._each(data, lambda t: t[:, :length])

    def select(self, data: Any, rows: torch.Tensor) -> Any:
        return self._each(data, lambda t: t[rows.to(t.device)])

    def take(self, data: Any, row: int, keep: torch.Tensor) -> Any:
        new = copy.copy(data)
        new.entries = [copy.copy(e) for e in data.entries]
        return self._each(new, lambda t: t[row : row + 1].index_select(1, keep.to(t.device)))

    def stack(self, parts: list[Any], length: int) -> Any:
        some = next(p for p in parts if p is not None)
        new = copy.copy(some)
        new.entries = [copy.copy(e) for e in some.entries]
        for i, entry in enumerate(new.entries):
            for name in ("past_keys", "past_values"):
                setattr(entry, name, _stacked(
                    [None if p is None else getattr(p.entries[i], name) for p in parts],
                    getattr(entry, name), 1, length))  # fmt: skip
        new.previous_attention_mask = _stacked(
            [None if p is None else p.previous_attention_mask for p in parts],
            some.previous_attention_mask, 1, length)  # fmt: skip
        return new


class PairCacheOps:
    """Two caches advanced together (an amplified pair of models)."""

    def __init__(self, first: CacheOps, second: CacheOps) -> None:
        self.first, self.second = first, second

    def fork(self, data: Any) -> Any:
        return self.first.fork(data[0]), self.second.fork(data[1])

    def repeat(self, data: Any, n: int) -> Any:
        return self.first.repeat(data[0], n), self.second.repeat(data[1], n)

    def crop(self, data: Any, length: int) -> Any:
        return self.first.crop(data[0], length), self.second.crop(data[1], length)

    def select(self, data: Any, rows: torch.Tensor) -> Any:
        return self.first.select(data[0], rows), self.second.select(data[1], rows)

    def take(self, data: Any, row: int, keep: torch.Tensor) -> Any:
        return self.first.take(data[0], row, keep), self.second.take(data[1], row, keep)

    def stack(self, parts: list[Any], length: int) -> Any:
        return (self.first.stack([None if p is None else p[0] for p in parts], length),
                self.second.stack([None if p is None else p[1] for p in parts], length))  # fmt: skip
