"""Steers that go on over several calls, each deciding its condition: a chat's turns.

A steer with a prompt condition is decided once per call, on that call's own tokens. A
chat session runs one call per turn, so what it caches and replays must know which of its
steers were decided that way, and such a steer may only steer the tokens each turn
generates.
"""

from __future__ import annotations

from collections.abc import Sequence

from steerlab.core.ops import SteerError
from steerlab.core.steer import Steer


def prompt_gated(steers: Sequence[Steer]) -> set[str]:
    """The marks (``Steer.mark``) of the one-alpha steers whose condition is read from the
    prompt, once per call: what a chat's cache key and its replay check both need."""
    return {s.mark() for s in steers if s.when is not None and not s.when.per_token}


def check_turn_steer(steer: Steer) -> None:
    """A steer that goes on over calls that each decide it (a chat session's turns): its
    prompt condition decides per call, on that call's own tokens, so it may only steer the
    tokens each call generates."""
    if steer.when is not None and not steer.when.per_token and steer.positions != "generated":
        raise SteerError(
            "In a chat session a conditioned steer (when=) decides per turn, on that "
            "turn's own tokens, so it steers the reply: give it positions="
            f"'generated' (it has {steer.positions!r}), or steer one call with "
            "lm.generate(messages, steer=..., chat=True)."
        )
