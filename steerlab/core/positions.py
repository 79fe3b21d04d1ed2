"""Where in the sequence a steer acts: the positions grammar, and its mask over a forward.

``"all"``, ``"prompt"``, ``"generated"``, an int ``k`` (from position ``k`` on), or a span
of the prompt, ``"first:k"``, ``"last:k"`` or ``"first:k+last:k"``. ``position_mask`` is the
one rule every engine applies; ``position_form`` is the same rule as data for table steps.
"""

from __future__ import annotations

import numbers
import re
from typing import Any, Literal

import torch

from steerlab.core.errors import SteerError

Positions = Literal["all", "prompt", "generated"] | int | str  # str: a span, "first:3+last:3"


# The largest position count the positions grammar takes (an int k, a span's k): more than
# any context holds, and within every engine's integer positions (torch's int64, vLLM's int32).
MAX_POSITION = 2**31 - 1


def _as_positions(positions: Any) -> Positions:
    if isinstance(positions, numbers.Integral) and not isinstance(positions, bool):
        positions = int(positions)  # numpy integers are ints too
        _check_count(positions, f"positions {positions!r:.60}")
    if isinstance(positions, str) and positions not in ("all", "prompt", "generated"):
        span = _parse_span(positions)
        if span is not None:
            for count in span:
                _check_count(count, f"positions {positions!r:.60}")
            return _span_text(*span)
    if isinstance(positions, bool) or not (
        positions in ("all", "prompt", "generated")
        or (isinstance(positions, int) and positions >= 0)
    ):
        raise SteerError(
            "positions must be 'all', 'prompt', 'generated', an int >= 0, or a span of the "
            f"prompt such as 'first:3+last:3' ('first:k', 'last:k', k >= 1); got {positions!r}."
        )
    return positions


def _check_count(count: int, what: str) -> None:
    """Refuse a position count past ``MAX_POSITION``, by name, before it reaches a tensor."""
    if count > MAX_POSITION:
        raise SteerError(f"{what} counts past {MAX_POSITION} (2**31 - 1) tokens, the most a "
                         "positions rule takes: no context holds that many.",
                         "positions")  # fmt: skip


_SPAN_PART = re.compile(r"(first|last):([0-9]+)")


def _parse_span(text: str) -> tuple[int, int] | None:
    """``(first k, last k)`` from ``"first:k"``, ``"last:k"`` or both joined by ``+``; None
    when ``text`` is not a span (each side at most once, k >= 1)."""
    counts: dict[str, int] = {}
    for part in text.replace(" ", "").split("+"):
        match = _SPAN_PART.fullmatch(part)
        if match is None or match[1] in counts or int(match[2]) < 1:
            return None
        counts[match[1]] = int(match[2])
    return counts.get("first", 0), counts.get("last", 0)


def _span_text(first: int, last: int) -> str:
    """The canonical spelling of a span: ``first`` before ``last``, sides of 0 left out."""
    return "+".join(f"{side}:{k}" for side, k in (("first", first), ("last", last)) if k)


def prompt_span(positions: Positions) -> tuple[int, int] | None:
    """A span rule as ``(first k, last k)`` (0 for a side it leaves out); None for the
    other rules.

    >>> prompt_span("first:3+last:3"), prompt_span("last:2"), prompt_span("prompt")
    ((3, 3), (0, 2), None)
    """
    if not isinstance(positions, str) or positions in ("all", "prompt", "generated"):
        return None
    return _parse_span(positions)


def position_form(positions: Positions) -> tuple[bool, bool, int]:
    """A positions rule as data: ``(on prompt tokens, on generated tokens, from index)``.

    A span (``"first:3+last:3"``) is on prompt tokens only, and on only some of them: its
    form here is ``(True, False, 0)``, exact for tokens the model generated (it never
    touches them), while which prompt tokens it touches needs the prompt lengths that
    ``position_mask`` takes. An engine that feeds only generated tokens through this form
    (the compiled decode step) honours a span exactly.

    >>> position_form("generated"), position_form(5)
    ((False, True, 0), (True, True, 5))
    """
    if positions == "all":
        return True, True, 0
    if positions == "prompt" or prompt_span(positions) is not None:
        return True, False, 0
    if positions == "generated":
        return False, True, 0
    return True, True, int(positions)


def touches_prompt(positions: Positions) -> bool:
    """Whether the rule can touch a prompt token ("generated" cannot)."""
    return position_form(positions)[0]


def touches_generated(positions: Positions) -> bool:
    """Whether the rule can touch a token the model generated ("prompt" and spans cannot)."""
    return position_form(positions)[1]


def touched(on_prompt: Any, on_generated: Any, from_pos: Any, pos: Any, generated: Any) -> Any:
    """Which tokens a positions rule in its data form touches. Pads (``pos < 0``) never.

    Elementwise over torch tensors or numpy arrays alike (the compiled step passes
    per-row tensors, vLLM's worker numpy arrays), so every engine shares this one rule.
    """
    kind = (generated & on_generated) | (~generated & on_prompt)
    return (pos >= 0) & (pos >= from_pos) & kind


def in_span(first: int, last: int, pos: Any, prompt_len: Any) -> Any:
    """The tokens of a span: the first ``first`` and the last ``last`` of each row's prompt.

    ``prompt_len`` is, per token (broadcastable to ``pos``), the length of its row's prompt
    counted from the row's first real token: every token fed before the model generates in
    this call. Pads (``pos < 0``) and tokens past the prompt are never in it.
    """
    head = pos < first
    tail = pos >= prompt_len - last
    return (pos >= 0) & (pos < prompt_len) & (head | tail)


def position_mask(
    positions: Positions,
    pos: Any,  # [batch, seq]: index from the row's first real token, -1 on pads
    generated: Any,  # [batch, seq] bool: the token was produced by the model
    prompt_len: Any = None,  # [batch, 1] (or per token): each row's prompt length
) -> Any:  # [batch, seq] bool
    """Which tokens a steer touches: THE position rule, for every engine.

    ``"all"`` every real token, ``"prompt"`` tokens not produced by the model,
    ``"generated"`` tokens it produced, an int ``k`` tokens from index ``k`` on, a span
    ``"first:k+last:k"`` the first and last ``k`` tokens of each row's prompt (``in_span``;
    it needs ``prompt_len``). Pads are never steered. Works on torch tensors and numpy
    arrays.

    >>> position_mask(2, torch.tensor([[-1, 0, 1, 2, 3]]), torch.zeros(1, 5, dtype=torch.bool))
    tensor([[False, False, False,  True,  True]])
    >>> position_mask("first:1+last:1", torch.tensor([[0, 1, 2, 3]]), None, torch.tensor([[3]]))
    tensor([[ True, False,  True, False]])
    """
    span = prompt_span(positions)
    if span is None:
        return touched(*position_form(positions), pos, generated)
    if prompt_len is None:
        raise SteerError(f"positions {positions!r} needs each row's prompt length.")
    return in_span(*span, pos, prompt_len)


def kept(logits: torch.Tensor, last_only: bool, keep: torch.Tensor | None) -> torch.Tensor:
    """The logits a backend's ``forward`` returns: ``[batch, pos, vocab]`` cut to the last
    position (``last_only``), or the positions ``keep`` marks, packed row by row.

    >>> logits = torch.arange(12.0).reshape(2, 3, 2)
    >>> kept(logits, False, torch.tensor([[False, True, True], [False, False, True]])).tolist()
    [[2.0, 3.0], [4.0, 5.0], [10.0, 11.0]]
    """
    if keep is not None:
        return logits[keep.to(logits.device)]
    return logits[:, -1:] if last_only else logits
