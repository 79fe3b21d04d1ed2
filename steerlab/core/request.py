"""What crosses the engine seam: requests and results as plain data.

A ``Request`` is one row: prompt token ids, the steers on that row (each with its one
alpha), and its own sampling settings. Nothing in it is a Python closure, so an engine
in another process (vLLM) can take it: ``RowSteer.to_data`` gives the op as a name and
parameters, and refuses a custom operation with a message that says why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from steerlab.core.ops import Operation, SteerError
from steerlab.core.steer import Positions, Steer, steer_data, vector_fingerprint


@dataclass(frozen=True, eq=False)
class RowSteer:
    """One steer on one row: site, vector, the row's alpha, positions and operation."""

    site: str
    vector: torch.Tensor  # [d_model]
    alpha: float
    positions: Positions
    op: Operation

    @classmethod
    def of(cls, steer: Steer, alpha: float) -> RowSteer:
        return cls(steer.site, steer.vector, float(alpha), steer.positions, steer.op)

    def to_data(self, *, vector_key: str | None = None) -> dict[str, Any]:
        """Plain data; the vector inline, or by ``vector_key`` where vectors travel once."""
        return steer_data(self.site, self.vector, self.alpha, self.positions, self.op,
                          vector_key=vector_key)  # fmt: skip

    def fingerprint(self) -> str:
        """The steer minus its alpha: site, vector content, positions and op."""
        return Steer(self.site, self.vector, 1.0, self.positions, self.op).fingerprint()

    @property
    def vector_key(self) -> str:
        return vector_fingerprint(self.vector)


@dataclass(frozen=True)
class Sampling:
    """How one row is decoded; checked on construction, so bad values fail before compute."""

    max_new_tokens: int = 40
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int = 0
    stop_at_eos: bool = True
    stop: tuple[str, ...] = ()
    logprobs: int | None = None  # per sampled token, its N most likely alternatives too
    prompt_logprobs: int | None = None  # score the prompt's tokens, each with N alternatives

    def __post_init__(self) -> None:
        n, least = self.max_new_tokens, 0 if self.prompt_logprobs is not None else 1
        if isinstance(n, bool) or not isinstance(n, int) or n < least:
            raise ValueError(f"max_new_tokens must be an int >= {least}; got {n!r}"
                             + (" (0 only when the prompt is scored)." if least else "."))  # fmt: skip
        for name in ("logprobs", "prompt_logprobs"):
            top = getattr(self, name)
            if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
                raise ValueError(f"{name} must be None or an int >= 0; got {top!r}.")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0; got {t!r}.")
        p = self.top_p
        if isinstance(p, bool) or not (isinstance(p, (int, float)) and 0 < p <= 1):
            raise ValueError(f"top_p must be in (0, 1]; got {p!r}.")
        k = self.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"top_k must be None or an int >= 1; got {k!r}.")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int; got {self.seed!r}.")
        if not isinstance(self.stop_at_eos, bool):
            raise ValueError(f"stop_at_eos must be True or False; got {self.stop_at_eos!r}.")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty strings; got {s!r}.")

    @staticmethod
    def stops(stop: str | Sequence[str] | None) -> tuple[str, ...]:
        """``stop=`` as a tuple: one string, a list of them, or None."""
        if stop is None:
            return ()
        if isinstance(stop, str):
            return (stop,)
        if not isinstance(stop, (list, tuple)):
            raise ValueError(f"stop must be a string or a list of strings; got {stop!r}.")
        return tuple(stop)


@dataclass(frozen=True)
class Request:
    """One row for an engine: tokens in, one ``Completion`` out.

    Attributes:
        prompt: token ids to feed (after the cache row, when a cache is continued).
        steers: the steers on this row, each with this row's alpha.
        sampling: this row's decoding settings.
        stream: rows with the same ``sampling.seed`` and ``stream`` draw the same random
            numbers (a prompt's baseline and steered rows); make it unique otherwise.
        generated: per prompt token, True where the model produced it in an earlier call
            (a chat history's replies fed again), so ``positions="generated"`` still
            touches it; empty means none.
    """

    prompt: tuple[int, ...]
    steers: tuple[RowSteer, ...] = ()
    sampling: Sampling = field(default_factory=Sampling)
    stream: str = ""
    generated: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.prompt):
            raise ValueError("Request.prompt must be a sequence of int token ids.")
        if self.generated and len(self.generated) != len(self.prompt):
            raise ValueError(
                f"Request.generated has {len(self.generated)} flags for "
                f"{len(self.prompt)} prompt tokens."
            )
        for steer in self.steers:
            if not isinstance(steer, RowSteer):
                raise SteerError(f"Request.steers takes RowSteer values; got {steer!r}.")


@dataclass(frozen=True)
class TokenScore:
    """One token's log-probability under the model, and the most likely tokens there.

    Read from the logits the model produced at that position (steered when the row is),
    before temperature, top-k or top-p touch them.
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), most likely first


@dataclass
class Completion:
    """One request's result: new tokens only, plus the scores its sampling asked for.

    ``scores`` (with ``Sampling.logprobs``) has one entry per sampled token, and one more
    for an end-of-sequence token that ended the row (which ``tokens`` leaves out).
    ``prompt_scores`` (with ``Sampling.prompt_logprobs``) has one per prompt token, None
    for the first, which nothing before it predicts.
    """

    text: str
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "eos", "stop" (a stop string), "length" or "cancelled"
    scores: list[TokenScore] = field(default_factory=list)
    prompt_scores: list[TokenScore | None] = field(default_factory=list)
