"""vLLM's logprobs as steerlab's ``TokenScore`` values, shaped as ``engine/scoring.py`` does.

vLLM reports each scored position as a dict ``token id -> Logprob(logprob, rank, ...)``:
the scored token (sampled, or the prompt's own) first, then the ``top`` most likely tokens
in rank order. Where the scored token is one of them, the dict holds it once, in first
place, with its rank among them. Nothing here imports vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from steerlab.core.request import TokenScore


def token_score(token: int, entry: Mapping[int, Any], top: int) -> TokenScore:
    """``token``'s log-probability at one position, with the ``top`` most likely tokens.

    >>> from types import SimpleNamespace as L
    >>> token_score(5, {5: L(logprob=-3.0, rank=4), 1: L(logprob=-0.1, rank=1)}, 1)
    TokenScore(token=5, logprob=-3.0, top=((1, -0.1),))
    """
    items = list(entry.items())
    if len(items) > top:  # the scored token is not among the top: it is the extra first one
        items = items[1:]
    ranked = sorted(items, key=lambda item: item[1].rank)
    return TokenScore(token, float(entry[token].logprob),
                      tuple((int(t), float(lp.logprob)) for t, lp in ranked))  # fmt: skip


def prompt_scores(prompt: Sequence[int], done: int, chunk: Sequence[Mapping[int, Any] | None],
                  top: int) -> list[TokenScore | None]:  # fmt: skip
    """The scores of prompt positions ``done`` onwards from one chunk of vLLM's
    ``prompt_logprobs`` (None where nothing predicts the token: the first position)."""
    return [None if entry is None else token_score(prompt[p], entry, top)
            for p, entry in enumerate(chunk, done)]  # fmt: skip


def lines_up(prompt: Sequence[int], done: int, chunk: Sequence[Mapping[int, Any] | None], *,
             complete: bool = False) -> bool:  # fmt: skip
    """Whether ``chunk`` scores prompt positions ``done`` onwards (to the prompt's end, when
    ``complete``): None at the first position only, each other holding the prompt's token.

    A check on what vLLM hands back, beside the engine's: a scored prompt must read
    nothing from the prefix cache (``skip_reading_prefix_cache``, vLLM's default for such
    requests), or its cached positions come back as stale buffers.

    >>> lines_up([7, 8], 0, [None, {8: None}], complete=True)
    True
    >>> lines_up([7, 8, 9], 0, [None, {9: None}])
    False
    """
    ends = done + len(chunk)
    if ends > len(prompt) or (complete and ends < len(prompt)):
        return False
    return all((p == 0) == (entry is None) and (entry is None or prompt[p] in entry)
               for p, entry in enumerate(chunk, done))  # fmt: skip
