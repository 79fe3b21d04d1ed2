"""The steering-aware cache key: what a cached position was computed from.

A cached key and value at position ``i`` depend on the model, the token ids up to ``i`` and
every intervention applied at positions up to ``i``. So the key of a cache is the model
(name and revision), the token ids, and, per position, the steers that touched it: each
steer's ``fingerprint()`` (site, vector, positions, op) with its alpha. Two keys agree on a
prefix exactly when that prefix of the cache can be reused; the first position where they
differ is where recomputing starts.

Which positions a steer touches follows ``steerlab.core.position_mask``: ``"all"``
every token, ``"prompt"`` tokens the user or system supplied, ``"generated"`` tokens the
model produced (in any turn, the EOS that ended a reply included), ``k`` tokens from
index ``k`` on, counted from the conversation's first token, a span (``"first:k+last:k"``)
the first and last ``k`` tokens of the turn's prompt (the conversation before the reply).
Hence:

- a steer with ``positions="generated"`` leaves the system prompt and the first user
  message valid, but not the first reply: changing it recomputes from the first
  generated token in the cache;
- a steer from ``k`` on leaves everything before ``k`` valid, all of a cache shorter than ``k``;
- a steer with ``positions="all"`` or ``"prompt"`` invalidates the whole cache;
- a span's last tokens move with each turn's prompt, so a new turn recomputes from the
  previous turn's last ``k`` prompt tokens (its first ``k`` stay valid);
- an alpha of 0 touches nothing (it leaves activations bit-identical).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from steerlab.core.positions import position_mask
from steerlab.core.steer import Steer
from steerlab.core.turns import prompt_gated

Touches = tuple[str, ...]  # the steers that touched one position, as "fingerprint@alpha"


def touches(steers: Sequence[Steer], generated: Sequence[bool],
            start: int = 0, prompt_len: int | None = None,
            fired: Sequence[frozenset[str]] = ()) -> list[Touches]:  # fmt: skip
    """Per position from ``start`` on, which of ``steers`` touch it, in the order applied.

    A steer with a prompt condition (``when=``, read once per turn) touches a position
    only where its turn's condition fired: ``fired[i]`` holds the marks (``Steer.mark``) of the conditioned steers that fired
    in the turn of position ``i`` (none past its end). So the key holds each turn's decision.

    Args:
        steers: one row's steers, each with its alpha.
        generated: per position of the conversation, True where the model produced it.
        start: first position to report.
        prompt_len: the turn's prompt length, for a span; all of ``generated`` when None.
        fired: per position, the conditioned steers that fired in its turn.

    >>> touches([], [False, True])
    [(), ()]
    """
    flags = torch.tensor(list(generated), dtype=torch.bool)[None]  # [1, seq]
    pos = torch.arange(flags.shape[1])[None]  # [1, seq]
    n_prompt = flags.shape[1] if prompt_len is None else prompt_len
    masks = [(s.mark(),
              position_mask(s.positions, pos, flags, n_prompt)[0])
             for s in steers if s.alpha[0] != 0]  # fmt: skip
    gated = prompt_gated(steers)

    def decided(name: str, i: int) -> bool:
        return name not in gated or (i < len(fired) and name in fired[i])

    return [tuple(name for name, mask in masks if bool(mask[i]) and decided(name, i))
            for i in range(start, flags.shape[1])]  # fmt: skip


@dataclass(frozen=True)
class CacheKey:
    """What a cache holds: model, revision, token ids and per-position steering.

    Attributes:
        model: the model's name.
        revision: the revision it was loaded at (None when unknown).
        tokens: the token ids cached, in order.
        touches: per position, the steers that touched it (``touches``).
    """

    model: str
    revision: str | None
    tokens: tuple[int, ...]
    touches: tuple[Touches, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.touches):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.touches)} touch sets.")

    def __len__(self) -> int:
        return len(self.tokens)

    def valid_prefix(self, other: CacheKey) -> int:
        """How many leading positions ``other`` can reuse from a cache keyed by ``self``."""
        if (self.model, self.revision) != (other.model, other.revision):
            return 0
        n = min(len(self), len(other))
        return next((i for i in range(n) if self.tokens[i] != other.tokens[i]
                     or self.touches[i] != other.touches[i]), n)  # fmt: skip

    def crop(self, length: int) -> CacheKey:
        """The key of the first ``length`` positions."""
        return CacheKey(self.model, self.revision, self.tokens[:length], self.touches[:length])

    def __repr__(self) -> str:
        steered = sum(bool(t) for t in self.touches)
        return f"CacheKey({self.model!r}, {len(self)} tokens, {steered} steered)"
