"""``Progress``: where a call stands after one step, the one type every engine yields.

An engine's ``stream`` is an iterator of ``Progress``; ``run`` is the last item of it
(``last``). The facade turns each into a ``Step`` (``engine/steps.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from steerlab.engine.state import RowStates

if TYPE_CHECKING:
    from steerlab.backends.cache import KVCache
    from steerlab.engine.local.capture import Recorder


@dataclass
class Progress:
    """Each row's tokens after one step, as a snapshot."""

    index: int
    token_ids: list[int]  # [rows]: each row's new token (the pad id for rows without one)
    done: list[bool]
    lengths: list[int]  # new tokens per row after this step
    before: list[int]  # new tokens per row before it
    reasons: list[str]
    states: RowStates
    cache: Callable[[], KVCache | None]
    recorder: Recorder | None

    @classmethod
    def after(cls, index: int, states: RowStates, before: list[int], pad_id: int, *,
              cache: Callable[[], KVCache | None] = lambda: None,
              recorder: Recorder | None = None) -> Progress:  # fmt: skip
        """The snapshot of ``states`` after step ``index``, given each row's length before."""
        lengths = [len(t) for t in states.tokens]
        token_ids = [states.tokens[r][-1] if n > b else pad_id
                     for r, (n, b) in enumerate(zip(lengths, before))]  # fmt: skip
        reasons = [why if d else "length" for why, d in zip(states.reasons, states.done)]
        return cls(index, token_ids, list(states.done), lengths, list(before), reasons, states,
                   cache, recorder)  # fmt: skip


def last(stream: Iterable[Any]) -> Any:
    """The final item of a stream, consuming it: what ``run`` and ``generate`` return.

    >>> last(iter([1, 2, 3]))
    3
    """
    (final,) = deque(stream, maxlen=1)
    return final
