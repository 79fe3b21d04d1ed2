"""Per-row decoding state: new tokens, finish reasons, text, and steps as snapshots."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from steerlab.core.request import Completion, Request, TokenScore
from steerlab.core.sampling import is_greedy


class RowStates:
    """New tokens of every row of a call, and when and why each row finished."""

    def __init__(self, tokenizer: Any, requests: Sequence[Request]) -> None:
        self.tokenizer = tokenizer
        self.requests = list(requests)
        n = len(self.requests)
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[float]] = [[] for _ in range(n)]
        self.scores: list[list[TokenScore]] = [[] for _ in range(n)]
        self.prompt_scores: list[list[TokenScore | None]] = [[] for _ in range(n)]
        self.reasons = ["length"] * n
        self.done = [r.sampling.max_new_tokens == 0 for r in self.requests]  # scored only
        self.reads: Any = None  # the call's ``CallReads`` when it has conditions or monitors

    def reads_of(self, row: int, kept: int) -> tuple[bool | None, float | None, dict[str, Any]]:
        """A row's condition decision, its score, and its monitors' readouts."""
        if self.reads is None:
            return None, None, {}
        return self.reads.row(row, kept)

    def extend(self, requests: Sequence[Request]) -> range:
        """Rows for more requests, joining a call that is under way; returns their indices."""
        start = len(self.requests)
        self.requests += requests
        self.tokens += [[] for _ in requests]
        self.logprobs += [[] for _ in requests]
        self.scores += [[] for _ in requests]
        self.prompt_scores += [[] for _ in requests]
        self.reasons += ["length"] * len(requests)
        self.done += [r.sampling.max_new_tokens == 0 for r in requests]
        return range(start, len(self.requests))

    def decoded(self, row: int, length: int | None = None) -> str:
        return self.tokenizer.decode(self.tokens[row][:length], skip_special_tokens=True)

    def text(self, row: int, length: int | None = None, reason: str | None = None) -> str:
        """A row's completion (its first ``length`` tokens), cut before a stop string."""
        text = self.decoded(row, length)
        if (reason or self.reasons[row]) == "stop":
            at = find_stop(text, self.requests[row].sampling.stop, self.stop_floor(row))
            text = text if at is None else text[:at]
        return text

    def stop_floor(self, row: int) -> int:
        """Where a stop string may end, at the earliest: after the text of the row's first
        ``min_tokens`` tokens (vLLM's stop checker skips them), else anywhere."""
        least = self.requests[row].sampling.min_tokens
        return len(self.decoded(row, least)) if least else 0

    def kept(self, row: int, length: int | None = None, reason: str | None = None) -> int:
        """How many of a row's first ``length`` tokens its result keeps: all of them, unless
        the row ended at a stop string; then those wholly before it.

        A token whose text runs into the stop string is dropped with every token after it,
        though ``text`` keeps the part of its text before the stop string: a row's
        ``tokens`` then decode to a prefix of its ``text``, never to text past it.
        """
        length = len(self.tokens[row]) if length is None else length
        if (reason or self.reasons[row]) != "stop":
            return length
        return self.within(row, self.text(row, length, reason), length)

    def within(self, row: int, text: str, length: int, start: int = 0) -> int:
        """The most of a row's first ``length`` tokens (at least ``start``) whose decoded
        text is a prefix of ``text``; the row's last tokens are tried first."""
        for n in range(length, start, -1):
            if text.startswith(self.decoded(row, n)):
                return n
        return start

    def scores_kept(self, row: int, kept: int) -> list[TokenScore]:
        """The scores of a row's first ``kept`` tokens, and of the EOS token that ended it."""
        scores = self.scores[row]
        return scores[:kept] + scores[len(self.tokens[row]) :]

    def add(self, row: int, token: int, logprob: float, eos: set[int],
            score: TokenScore | None = None) -> None:  # fmt: skip
        """Record one sampled token for a live row, and whether it ends the row.

        ``score`` is kept where the row's sampling asks for scores, an ending EOS included."""
        sampling = self.requests[row].sampling
        if sampling.logprobs is not None:
            self.scores[row].append(score or TokenScore(token, logprob))
        if sampling.stop_at_eos and token in eos:
            self.done[row], self.reasons[row] = True, "eos"
            return
        self.tokens[row].append(token)
        self.logprobs[row].append(logprob)
        if (
            sampling.stop
            and len(self.tokens[row]) > sampling.min_tokens
            and find_stop(self.decoded(row), sampling.stop, self.stop_floor(row)) is not None
        ):
            self.done[row], self.reasons[row] = True, "stop"
        elif len(self.tokens[row]) >= sampling.max_new_tokens:
            self.done[row] = True

    def cancel(self, row: int) -> None:
        """End a row now (its client went away, say); it leaves the batch like a finished one."""
        if not self.done[row]:
            self.done[row], self.reasons[row] = True, "cancelled"

    def completion(self, row: int) -> Completion:
        kept = self.kept(row)
        fired, score, readouts = self.reads_of(row, kept)
        return Completion(self.text(row), self.tokens[row][:kept], self.logprobs[row][:kept],
                          self.reasons[row], self.scores_kept(row, kept),
                          list(self.prompt_scores[row]), fired, score, readouts)  # fmt: skip

    def completions(self) -> list[Completion]:
        return [self.completion(r) for r in range(len(self.requests))]


def find_stop(text: str, stops: Sequence[str], floor: int = 0) -> int | None:
    """Where the first stop string in ``text`` that ends after ``floor`` starts, or None.

    >>> find_stop("a cat. a dog.", ["."], floor=6)
    12
    """
    found = [text.find(s, max(floor - len(s) + 1, 0)) for s in stops]
    return min((at for at in found if at >= 0), default=None)


class RandomStreams:
    """One seeded random stream per distinct ``(seed, stream)`` of the call's rows.

    A stream draws one number per step while a sampling row that uses it is alive, so a
    row gets the same numbers whatever else shares its batch.
    """

    def __init__(self, requests: Sequence[Request]) -> None:
        self.keys = [(r.sampling.seed, r.stream) for r in requests]
        self.sampled = [not is_greedy(r.sampling.temperature) for r in requests]
        self.generators: dict[tuple[int, str], torch.Generator] = {}
        for seed, stream in dict.fromkeys(self.keys):
            digest = hashlib.sha256(f"{seed}|{stream}".encode()).digest()
            generator = torch.Generator().manual_seed(int.from_bytes(digest[:7], "big"))
            self.generators[(seed, stream)] = generator

    def draw(self, rows: Sequence[int]) -> torch.Tensor:  # [len(rows)], uniform in [0, 1)
        live = dict.fromkeys(self.keys[r] for r in rows if self.sampled[r])
        drawn = {key: torch.rand(1, generator=self.generators[key]) for key in live}
        zero = torch.zeros(1)
        return torch.cat([drawn.get(self.keys[r], zero) for r in rows])
