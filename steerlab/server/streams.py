"""Streamed ``/v1/completions`` and ``/v1/chat/completions``: OpenAI's chunks, one per delta
of a row, then each row's finish, then the request's usage where ``stream_options`` asks.

Joined up, a stream's chunks say what the response without ``stream`` says: the same text,
``token_ids`` and logprobs, row by row.
"""

from __future__ import annotations

from typing import Any

from steerlab.core.request import TokenScore
from steerlab.engine.scheduler import Delta, Done
from steerlab.server import responses
from steerlab.server.plan import Plan
from steerlab.server.schemas import StreamOptions


class Chunks:
    """The chunks of one streamed response; a subclass shapes each row's ``choice``.

    With ``include_usage`` every chunk carries ``"usage": null`` and one last chunk, whose
    ``choices`` is empty, carries the request's usage (as without ``stream``). With
    ``continuous_usage_stats`` too, each chunk's ``usage`` is its row's so far: its prompt
    and the tokens streamed for it. ``[DONE]`` follows, sent by the route.
    """

    def __init__(self, plan: Plan, base: dict[str, Any], n: int,
                 options: StreamOptions | None) -> None:  # fmt: skip
        self.plan, self.base, self.n = plan, base, n
        self.usage = bool(options and options.include_usage)
        self.continuous = bool(options and options.include_usage and options.continuous_usage_stats)
        self.streamed = [0] * len(plan.requests)  # tokens sent, per row

    def head(self) -> list[dict[str, Any]]:
        return []

    def delta(self, delta: Delta) -> dict[str, Any]:
        self.streamed[delta.row] += len(delta.tokens)
        return self.chunk(delta.row, self.choice(delta))

    def finish(self, done: Done) -> list[dict[str, Any]]:
        """Each row's last chunk (no text, its finish reason), then the usage chunk."""
        out = [self.chunk(k, self._last(k, c)) for k, c in enumerate(done.completions)]
        if self.usage:
            totals = responses.usage(self.plan, done.completions, self.n)
            out.append({**self.base, "choices": [], "usage": totals})
        return out

    def _last(self, row: int, c: Any) -> dict[str, Any]:
        """A row's finishing choice, with its reads (``responses.reads``) when it has any."""
        choice = self.choice(Delta(0, row, "", [], []), responses.FINISH[c.finish_reason])
        extra = responses.reads(c)
        if extra:
            choice["steerlab"] = extra
        return choice

    def choice(self, delta: Delta, finish: str | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def chunk(self, row: int, choice: dict[str, Any]) -> dict[str, Any]:
        out = {**self.base, "choices": [choice]}
        if self.usage:
            out["usage"] = self._row_usage(row) if self.continuous else None
        return out

    def _row_usage(self, row: int) -> dict[str, int]:
        prompt, new = len(self.plan.prompt_tokens[row]), self.streamed[row]
        return {"prompt_tokens": prompt, "completion_tokens": new, "total_tokens": prompt + new}


class TextChunks(Chunks):
    """``/v1/completions``: with ``echo`` a row's first chunk begins with its prompt (and its
    prompt's logprobs, where they were asked for); each chunk's ``logprobs`` is the legacy
    object for that chunk's tokens, ``text_offset`` counting on from the chunks before."""

    def __init__(self, plan: Plan, model: str, n: int, options: StreamOptions | None,
                 tokenizer: Any, logprobs: int | None) -> None:  # fmt: skip
        super().__init__(plan, responses.head("cmpl", model, "text_completion"), n, options)
        self.tokenizer, self.logprobs = tokenizer, logprobs
        self.opened = [False] * len(plan.requests)
        self.offsets = [0] * len(plan.requests)  # per row: where its next token's text begins

    def choice(self, delta: Delta, finish: str | None = None) -> dict[str, Any]:
        row, text = delta.row, delta.text
        prompt: list[TokenScore | None] = []
        if self.plan.echo and not self.opened[row]:
            text, prompt = self.plan.echo[row] + text, delta.prompt_scores
        self.opened[row] = True
        return {"index": row, "text": text, "logprobs": self._logprobs(row, prompt, delta.scores),
                "finish_reason": finish, "token_ids": delta.tokens}  # fmt: skip

    def _logprobs(self, row: int, prompt: list[TokenScore | None],
                  scores: list[TokenScore]) -> dict[str, Any] | None:  # fmt: skip
        if self.logprobs is None:
            return None
        tokens, listed = responses.scored_tokens(self.plan, row, prompt, scores)
        start = self.offsets[row]
        self.offsets[row] = responses.text_offsets(self.tokenizer, tokens, start)[-1]
        return responses.legacy_logprobs(self.tokenizer, tokens, listed, self.logprobs, start)


class ChatChunks(Chunks):
    """``/v1/chat/completions``: a first chunk per row with the assistant's role, then its
    content; ``logprobs`` (with ``top_logprobs`` alternatives) for each chunk's tokens."""

    def __init__(self, plan: Plan, model: str, n: int, options: StreamOptions | None,
                 tokenizer: Any, top_logprobs: int | None) -> None:  # fmt: skip
        super().__init__(plan, responses.head("chatcmpl", model, "chat.completion.chunk"), n,
                         options)  # fmt: skip
        self.tokenizer, self.top = tokenizer, top_logprobs

    def head(self) -> list[dict[str, Any]]:
        return [self.chunk(k, {"index": k, "delta": {"role": "assistant", "content": ""},
                               "logprobs": None, "finish_reason": None, "token_ids": []})
                for k in range(len(self.plan.requests))]  # fmt: skip

    def choice(self, delta: Delta, finish: str | None = None) -> dict[str, Any]:
        scores = delta.scores[: len(delta.tokens)]  # the content's tokens: an ending EOS is not
        lp = None if self.top is None else responses.chat_logprobs(self.tokenizer, scores, self.top)
        return {"index": delta.row, "delta": {"content": delta.text}, "logprobs": lp,
                "finish_reason": finish, "token_ids": delta.tokens}  # fmt: skip
