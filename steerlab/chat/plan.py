"""Planning one turn before any compute: the conversation's ids, what fits, what is reused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from steerlab.chat.encoding import check_roles, common_prefix, render
from steerlab.chat.key import CacheKey, touches
from steerlab.core.prompts import Message
from steerlab.core.steer import Steer
from steerlab.core.window import check_window, fits

if TYPE_CHECKING:
    from steerlab.model import SteerableModel


@dataclass(frozen=True)
class Conversation:
    """What a session knows: messages, their ids, and which ids the model produced.

    ``tokens`` and ``generated`` survive ``clear_cache``: a reply fed again is still the
    model's (``positions="generated"`` still touches it). ``exchanges`` holds, per
    exchange, the number of messages before it and the token where it starts (for
    ``undo`` and ``overflow="drop_oldest"``).
    """

    messages: tuple[Message, ...] = ()
    tokens: tuple[int, ...] = ()
    generated: tuple[bool, ...] = ()
    exchanges: tuple[tuple[int, int], ...] = ()
    system: bool = False
    fired: tuple[frozenset[str], ...] = ()  # per token: conditioned steers that fired in its turn

    def flags_for(self, target: list[int]) -> list[bool]:
        """``generated`` flags for ``target``: kept where it agrees with what we know."""
        n = common_prefix(self.tokens, target)
        return [*self.generated[:n], *[False] * (len(target) - n)]

    def fired_for(self, target: list[int]) -> list[frozenset[str]]:
        """Each turn's decisions (``fired``) for ``target``, where it agrees with what we
        know; none for the rest (it is not decided yet)."""
        n = min(common_prefix(self.tokens, target), len(self.fired))
        return list(self.fired[:n])

    def drop_oldest(self) -> Conversation | None:
        """Without its oldest exchange (the system prompt stays); None when none is left."""
        if not self.exchanges:
            return None
        (m0, t0), rest = self.exchanges[0], self.exchanges[1:]
        m1, t1 = rest[0] if rest else (len(self.messages), len(self.tokens))
        t1 = max(t0, min(t1, len(self.tokens)))
        return Conversation(
            self.messages[:m0] + self.messages[m1:],
            self.tokens[:t0] + self.tokens[t1:],
            self.generated[:t0] + self.generated[t1:],
            tuple((m - (m1 - m0), t - (t1 - t0)) for m, t in rest),
            self.system,
            self.fired[:t0] + self.fired[t1:],
        )

    def until(self, exchange: int) -> Conversation:
        """The conversation as it was before ``exchange`` (``undo``)."""
        m, t = self.exchanges[exchange]
        return Conversation(self.messages[:m], self.tokens[:t], self.generated[:t],
                            self.exchanges[:exchange], self.system, self.fired[:t])  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """One turn, worked out: the conversation after it, the ids to feed, what is reused."""

    conversation: Conversation  # before the reply, with the new messages (after any drops)
    target: list[int]  # the whole conversation's ids, generation prompt included
    generated: list[bool]  # per target id
    key: CacheKey  # the key the target positions will have
    reuse: int  # cached positions kept
    dropped: int


def plan_turn(lm: SteerableModel, conversation: Conversation, new: list[Message],
              steers: tuple[Steer, ...], cached: CacheKey | None, max_new_tokens: int,
              overflow: str) -> Plan:  # fmt: skip
    """Everything about a turn that can fail, and what it will feed; nothing runs.

    Raises:
        PromptError: a role the template does not render, a template that refuses the
            conversation, or a turn past the context window (unless ``overflow`` is
            ``"drop_oldest"`` and dropping old exchanges makes it fit).
    """
    check_roles(lm.tokenizer, list(conversation.messages), new)
    dropped = 0
    while True:
        messages = [*conversation.messages, *new]
        target = render(lm.tokenizer, messages, generation_prompt=True)
        if fits(lm.n_ctx, len(target), max_new_tokens):
            break
        smaller = conversation.drop_oldest() if overflow == "drop_oldest" else None
        if smaller is None:
            too_long(lm, len(target), max_new_tokens, dropped)  # raises: it does not fit
            raise AssertionError("unreachable")
        conversation, dropped = smaller, dropped + 1
    flags = conversation.flags_for(target)
    marks = touches(steers, flags, fired=conversation.fired_for(target))
    key = CacheKey(lm.name, lm.revision, tuple(target), tuple(marks))
    reuse = min(cached.valid_prefix(key), len(target) - 1) if cached is not None else 0
    start = common_prefix(conversation.tokens, target)  # where this exchange's ids begin
    exchanges = tuple((m, min(t, start)) for m, t in conversation.exchanges)
    after = Conversation(tuple(messages), conversation.tokens, conversation.generated,
                         (*exchanges, (len(conversation.messages), start)),
                         conversation.system, conversation.fired)  # fmt: skip
    return Plan(after, target, flags, key, reuse, dropped)


def too_long(lm: SteerableModel, prompt: int, new: int, dropped: int) -> None:
    """Refuse a turn past the context window, saying what dropping old exchanges did."""
    hint = (
        f" even after dropping {dropped} old exchanges (the system prompt stays)"
        if dropped
        else "; build the session with overflow='drop_oldest' to drop old exchanges"
    )
    check_window(lm.n_ctx, prompt, new, hint=hint)
