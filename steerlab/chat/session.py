"""``ChatSession``: a conversation that keeps its KV cache from turn to turn.

Each turn feeds only what it adds: the new message and the chat template's tokens around
it (``encoding.py``). The cache is keyed on the token ids and on the steering applied at
each position (``key.py``), so changing ``chat.steer`` recomputes exactly the positions the
change touches and a stale prefix is never reused.

"prompt" and "generated" keep one meaning across turns: tokens the user or system supplied
versus tokens the model produced in any turn (a reply's EOS included, and a reply fed
again after ``clear_cache`` or a steer change).

An interrupted turn (an exception in ``on_token``, KeyboardInterrupt, a stream closed
early) keeps the partial reply, with finish reason ``"cancelled"``, and the cache up to
the last token fed; a turn interrupted before its first token leaves no trace. ``undo()``
removes the last exchange either way.
"""

from __future__ import annotations

import html
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from steerlab.backends.cache import KVCache
from steerlab.chat.encoding import as_messages, render
from steerlab.chat.key import CacheKey, touches
from steerlab.chat.plan import Conversation, Plan, plan_turn, too_long
from steerlab.chat.turns import TurnLog, TurnStats
from steerlab.core.doors import takes_options
from steerlab.core.ops import SteerError
from steerlab.core.prompts import Message, PromptError, check_text
from steerlab.core.request import Request, Sampling
from steerlab.core.results import Generation, Step
from steerlab.core.rows import Rows, SteerArg, as_steers
from steerlab.core.sites import site_names
from steerlab.core.steer import Steer, warn_other_model
from steerlab.core.turns import check_turn_steer, prompt_gated
from steerlab.engine.local import Progress
from steerlab.engine.steps import OnToken, steps

if TYPE_CHECKING:
    from steerlab.model import SteerableModel

OVERFLOW = ("error", "drop_oldest")


class ChatSession:
    """A steered conversation with one model; build it with ``lm.chat``.

    >>> chat = lm.chat(system="You are a helpful assistant.")
    >>> chat.say("Hello!", max_new_tokens=8).text[0]
    'Once upon a time, there was a'
    """

    def __init__(self, lm: SteerableModel, system: str | None = None, steer: SteerArg = None,
                 *, overflow: str = "error") -> None:  # fmt: skip
        if not getattr(lm.tokenizer, "chat_template", None):
            raise PromptError(
                "A chat session needs a tokenizer with a chat template; set "
                "lm.tokenizer.chat_template to a Jinja template first."
            )
        if overflow not in OVERFLOW:
            raise ValueError(f"overflow must be one of {OVERFLOW}; got {overflow!r}.")
        if system is not None and not isinstance(system, str):
            raise PromptError(f"system must be a string or None; got {type(system).__name__}.")
        if system is not None:
            check_text(system, "system")
        self.lm, self.overflow = lm, overflow
        self._steers: list[Steer] = []
        self.steer = steer
        messages = ({"role": "system", "content": system},) if system is not None else ()
        self._conversation = Conversation(messages, system=system is not None)
        self._cache: KVCache | None = None
        self._key: CacheKey | None = None
        self._log = TurnLog()
        self._closed = False
        if system is not None:
            self._prefill_system()

    # -- state ---------------------------------------------------------------------------

    @property
    def history(self) -> list[Message]:
        """The messages so far (the system prompt first), as dicts."""
        return [dict(m) for m in self._conversation.messages]

    @property
    def stats(self) -> TurnLog:
        """Per turn: tokens prefilled, tokens reused from the cache, cache length, time."""
        return self._log.copy()

    @property
    def cache_key(self) -> CacheKey | None:
        """What the cache holds (None once cleared)."""
        return self._key

    @property
    def cache_length(self) -> int:
        return 0 if self._cache is None else self._cache.length

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def steer(self) -> list[Steer]:
        """The steers of the next turn. Setting it takes effect at the next turn, which
        recomputes exactly the cached positions the change touches."""
        return list(self._steers)

    @steer.setter
    def steer(self, steer: SteerArg) -> None:
        steers = as_steers(steer)
        for s in steers:
            s.check(self.lm.sites(), self.lm.d_model)
            warn_other_model(s, self.lm)
            check_turn_steer(s)
            if len(s.alpha) != 1:
                raise SteerError(
                    f"A chat session is one conversation: give one alpha per steer, not "
                    f"{list(s.alpha)} (fork() the session to compare several)."
                )
        self._steers = steers

    def _row_steers(self) -> tuple[Steer, ...]:
        return tuple(Steer.of(s, s.alpha[0]) for s in self._steers)

    # -- turns ---------------------------------------------------------------------------

    @takes_options
    def say(self, message: str | Message | Sequence[Message], *,
            capture: str | Sequence[str] = (), on_token: OnToken | None = None,
            **options: Any) -> Generation:  # fmt: skip
        """Add ``message`` and generate the reply: a ``Generation`` with one row.

        The generation options are ``lm.generate``'s; the repetition penalty counts the
        whole conversation before the reply as its prompt.

        Args:
            message: the user's text, a message dict, or a list of them (a tool result
                and a question, say); assistant messages are refused.
            {options}
            capture: as in ``lm.generate``; it covers the tokens fed this turn.
            on_token: called with each ``Step``; an exception in it ends the turn cleanly
                (the partial reply is kept, see the module docs) and propagates.

        >>> chat = lm.chat()
        >>> chat.say("Tell me a story.", max_new_tokens=8, temperature=0.7, seed=0).text
        ['One day, Rosa the pig went for']
        """
        steps = self.stream(message, capture=capture, on_token=on_token, **options)
        (last,) = deque(steps, maxlen=1)
        return last.result()

    @takes_options
    def stream(self, message: str | Message | Sequence[Message], *,
               capture: str | Sequence[str] = (), on_token: OnToken | None = None,
               **options: Any) -> Iterator[Step]:  # fmt: skip
        """``say``, one ``Step`` at a time, as ``lm.stream``; checks run before it returns.

        The turn is recorded when the stream ends; closing it early keeps the partial reply.
        """
        self._check_open()
        new = as_messages(message)
        sampling = Sampling.of(options, where="say")
        steers = self._row_steers()
        plan = plan_turn(self.lm, self._conversation, new, steers, self._key,
                         sampling.max_new_tokens, self.overflow)  # fmt: skip
        capture = site_names(capture)
        self.lm.engine.check([Request(tuple(plan.target[-1:]), steers, sampling)], capture)
        self._check_replay(plan)
        return self._turn(plan, sampling, capture, on_token)

    def _check_replay(self, plan: Plan) -> None:
        """Refuse a turn that would feed again a position an earlier turn's condition fired
        on: one call decides once, so it could not replay that turn's decision."""
        start = plan.conversation.exchanges[-1][1]  # where this turn's own tokens begin
        gated = prompt_gated(self._row_steers())
        fired = plan.conversation.fired_for(plan.target)
        if any(gated & fired[i] for i in range(plan.reuse, min(start, len(fired)))):
            raise SteerError(
                "This turn would recompute part of an earlier turn whose condition fired "
                "(after clear_cache, a dropped exchange or a steer change): one call decides "
                "once, so it cannot replay that turn's decision. fork() the session before, "
                "or start a new one."
            )

    def _turn(self, plan: Plan, sampling: Sampling, capture: Sequence[str],
              on_token: OnToken | None) -> Iterator[Step]:  # fmt: skip
        started = time.perf_counter()
        rows = Rows([list(plan.conversation.messages)], [plan.target], self._steers, [0],
                    [tuple(s.alpha[0] for s in self._steers)])  # fmt: skip
        start = plan.conversation.exchanges[-1][1]  # this turn's own tokens decide
        request = replace(rows.requests(sampling)[0], prompt=tuple(plan.target[plan.reuse :]),
                          generated=tuple(plan.generated[plan.reuse :]),
                          reads_from=start)  # fmt: skip
        cache = self._reuse(plan.reuse)
        progress = self.lm.engine.stream([request], cache=cache, keep_cache=True,
                                         capture=capture, description="chat turn")  # fmt: skip
        seen: list[Progress] = []
        try:
            yield from steps(_tap(progress, seen), rows, sampling.seed, on_token)
        finally:
            getattr(progress, "close", lambda: None)()  # the engine call ends: hooks off
            self._record(plan, seen[-1] if seen else None, cache, started)

    def _reuse(self, length: int) -> KVCache | None:
        """The cache cut to ``length`` positions (None for none): this turn continues it."""
        if self._cache is None or self._key is None or length == 0:
            self._cache, self._key = None, None
            return None
        if length < self._cache.length:
            self._cache.crop(length)
            self._key = self._key.crop(length)
        return self._cache

    def _record(self, plan: Plan, last: Progress | None, given: KVCache | None,
                started: float) -> None:  # fmt: skip
        """After a turn, finished or cut short: keep what was computed."""
        if last is None:  # cut short before the first token: as if the turn never began
            self._cache = given if given is not None and given.length > 0 else None
            self._key = self._key.crop(self._cache.length) if self._cache and self._key else None
            return
        kv = given if given is not None else last.cache()
        assert kv is not None
        fed = len(plan.target) + last.index + (1 if last.done[0] else 0)
        if kv.length > fed:
            kv.crop(fed)
        reply = last.states.tokens[0][: last.lengths[0]]
        ending = kv.tokens[0, len(plan.target) :].tolist()  # the reply as fed, EOS included
        tokens = [*plan.target, *(ending if last.done[0] else reply)]
        generated = [*plan.generated, *[True] * (len(tokens) - len(plan.target))]
        reason = last.reasons[0] if last.done[0] else "cancelled"
        text = last.states.text(0, last.lengths[0], reason)
        start = plan.conversation.exchanges[-1][1]
        reads = last.states.reads
        marks = reads.fired_steers(0) if reads is not None else frozenset()
        earlier = list(plan.conversation.fired_for(plan.target))[:start]
        fired = (*earlier, *[frozenset()] * (start - len(earlier)),
                 *[marks] * (len(tokens) - start))  # fmt: skip
        self._conversation = replace(
            plan.conversation, tokens=tuple(tokens), generated=tuple(generated),
            messages=(*plan.conversation.messages, {"role": "assistant", "content": text}),
            fired=fired,
        )  # fmt: skip
        self._cache = kv
        self._key = self._key_of(tokens[:fed], generated[:fed], len(plan.target))
        turn = self._log[-1].turn + 1 if len(self._log) else 1
        self._log.append(TurnStats(turn, len(plan.target) - plan.reuse, plan.reuse,
                                   len(tokens) - len(plan.target), kv.length,
                                   time.perf_counter() - started, reason, plan.dropped))  # fmt: skip

    def _key_of(self, tokens: list[int], generated: list[bool],
                prompt_len: int | None = None) -> CacheKey:  # fmt: skip
        marks = touches(self._row_steers(), generated, prompt_len=prompt_len,
                        fired=self._conversation.fired)  # fmt: skip
        return CacheKey(self.lm.name, self.lm.revision, tuple(tokens), tuple(marks))

    def _prefill_system(self) -> None:
        """Feed the system prompt once, as the template renders it on its own."""
        started = time.perf_counter()
        try:
            ids = render(self.lm.tokenizer, list(self._conversation.messages),
                         generation_prompt=False)  # fmt: skip
        except PromptError:  # a template that wants a user message: the first turn feeds it
            return
        too_long(self.lm, len(ids), 1, 0)
        self._cache = self.lm.engine.prefill([Request(tuple(ids), self._row_steers())])
        self._key = self._key_of(ids, [False] * len(ids))
        self._conversation = replace(self._conversation, tokens=tuple(ids),
                                     generated=(False,) * len(ids))  # fmt: skip
        self._log.append(TurnStats(0, len(ids), 0, 0, len(ids), time.perf_counter() - started))

    # -- editing -------------------------------------------------------------------------

    def undo(self) -> None:
        """Drop the last exchange (your message and the reply), cropping the cache back."""
        self._check_open()
        if not self._conversation.exchanges:
            raise ValueError("Nothing to undo: this session has no exchange yet.")
        self._conversation = self._conversation.until(len(self._conversation.exchanges) - 1)
        keep = min(len(self._conversation.tokens), self.cache_length)
        self._reuse(keep)

    def fork(self) -> ChatSession:
        """An independent copy from this point: its own cache (a copy), history and steer."""
        self._check_open()
        twin = object.__new__(ChatSession)
        twin.lm, twin.overflow, twin._steers = self.lm, self.overflow, list(self._steers)
        twin._conversation, twin._key, twin._log = self._conversation, self._key, self._log.copy()
        twin._cache = self._cache.fork() if self._cache is not None else None
        twin._closed = False
        return twin

    def clear_cache(self) -> None:
        """Free the cache's memory; the next turn feeds the whole conversation again."""
        self._cache, self._key = None, None

    def close(self) -> None:
        """Free the cache; the session takes no more turns."""
        self.clear_cache()
        self._closed = True

    def __enter__(self) -> ChatSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("This chat session is closed; start a new one with lm.chat().")

    def __repr__(self) -> str:
        turns = len(self._conversation.exchanges)
        steer = ", ".join(repr(s) for s in self._steers) or "none"
        state = "closed" if self._closed else f"cache {self.cache_length} tokens"
        return f"ChatSession({turns} exchanges, {state}, steer: {steer})"

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td><b>{html.escape(m['role'])}</b></td>"
            f"<td style='text-align:left'>{html.escape(m['content'])}</td></tr>"
            for m in self._conversation.messages
        )
        return f"<p>{html.escape(repr(self))}</p><table><tbody>{rows}</tbody></table>"


def _tap(progress: Iterator[Progress], seen: list[Progress]) -> Iterator[Progress]:
    """Pass ``progress`` through, remembering the last one and hiding the session's cache."""
    for p in progress:
        seen[:] = [p]
        yield replace(p, cache=lambda: None)
