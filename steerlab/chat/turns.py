"""What each turn of a chat session cost: tokens fed, tokens reused, time."""

from __future__ import annotations

import html
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class TurnStats:
    """One turn of a session (turn 0 is the system prompt, fed when the session starts).

    Attributes:
        turn: 0 for the system prompt, then 1, 2, ...
        prefilled: prompt tokens fed this turn (the new message and the template's tokens
            around it, plus anything recomputed).
        reused: tokens taken from the cache instead of being fed again.
        generated: tokens the model produced (its EOS included).
        cache_length: tokens in the cache after the turn.
        seconds: wall time of the turn.
        finish_reason: how the reply ended ("eos", "stop", "length", "cancelled").
        dropped: old exchanges dropped to fit the context window.
    """

    turn: int
    prefilled: int
    reused: int
    generated: int
    cache_length: int
    seconds: float
    finish_reason: str = ""
    dropped: int = 0


class TurnLog:
    """Every turn's ``TurnStats``, in order: a list with a table for a repr.

    >>> chat = lm.chat()
    >>> for text in ["Hi!", "Tell me more."]:
    ...     _ = chat.say(text, max_new_tokens=4)
    >>> chat.stats.to_dict()["prefilled"]
    [9, 11]
    """

    def __init__(self, turns: list[TurnStats] | None = None) -> None:
        self._turns = list(turns or [])

    def append(self, turn: TurnStats) -> None:
        self._turns.append(turn)

    def copy(self) -> TurnLog:
        return TurnLog(self._turns)

    def __len__(self) -> int:
        return len(self._turns)

    def __iter__(self) -> Iterator[TurnStats]:
        return iter(self._turns)

    def __getitem__(self, index: int) -> TurnStats:
        return self._turns[index]

    def to_dict(self) -> dict[str, list]:
        """Column name -> values, one per turn (for pandas or a figure)."""
        return {f.name: [getattr(t, f.name) for t in self._turns] for f in fields(TurnStats)}

    def records(self) -> list[dict]:
        return [asdict(t) for t in self._turns]

    def __repr__(self) -> str:
        head = (
            f"{'turn':>4} {'prefilled':>9} {'reused':>7} {'generated':>9} {'cache':>6} {'time':>8}"
        )
        rows = [
            f"{t.turn:>4} {t.prefilled:>9} {t.reused:>7} {t.generated:>9} {t.cache_length:>6} "
            f"{t.seconds:>6.2f} s" + (f"  dropped {t.dropped}" if t.dropped else "")
            for t in self._turns
        ]
        return "\n".join([head, *rows])

    def _repr_html_(self) -> str:
        names = [f.name for f in fields(TurnStats)]
        head = "".join(f"<th>{n}</th>" for n in names)
        body = "".join(
            "<tr>"
            + "".join(f"<td>{html.escape(_cell(getattr(t, n)))}</td>" for n in names)
            + "</tr>"
            for t in self._turns
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
