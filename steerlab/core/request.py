"""What crosses the engine seam: requests and results as plain data.

A ``Request`` is one row: prompt token ids, the steers on that row (each a ``Steer`` with
its one alpha, ``Steer.of``), and its own sampling settings. An engine compiles a call's
requests once into its plan (``engine/plan.py``), which is what crosses into a worker
process as data.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from steerlab.core.errors import SamplingError
from steerlab.core.monitors import Monitor
from steerlab.core.ops import SteerError
from steerlab.core.scalars import as_flag, as_int, as_real
from steerlab.core.steer import Steer


@dataclass(frozen=True)
class Option:
    """One generation option, as every door shows it; ``OPTIONS`` lists them.

    Attributes:
        name: the ``Sampling`` field, and the keyword of ``lm.generate``, ``lm.stream``,
            ``chat.say`` and ``sl.connect``'s model.
        default: the keyword's default.
        annotation: the keyword's type, as written in signatures.
        doc: its line in those functions' docstrings.
        wire: its name in a server request (OpenAI's or vLLM's name).
        wire_type: its JSON type in a server request (null always means the default).
        to_wire: the ``Sampling`` value as JSON; ``from_wire`` the JSON value as the keyword.
        vllm: passed to vLLM's ``SamplingParams`` under its own name, unchanged (else the
            vLLM engine maps it itself).
        sampler: a setting of the sampler (temperature and truncation): rows that agree on
            every one of these sample together.
    """

    name: str
    default: Any
    annotation: str
    doc: str
    wire: str
    wire_type: Any
    to_wire: Callable[[Any], Any]
    from_wire: Callable[[Any], Any]
    vllm: bool
    sampler: bool


def _same(value: Any) -> Any:
    return value


def option(default: Any, doc: str, *, annotation: str, wire_type: Any, wire: str = "",
           given: Any = MISSING, to_wire: Callable[[Any], Any] = _same,
           from_wire: Callable[[Any], Any] = _same, vllm: bool = False,
           sampler: bool = False) -> Any:  # fmt: skip
    """A ``Sampling`` field that is also a generation option (``given``: the keyword's own
    default, when it differs from the field's)."""
    meta = {"doc": doc, "annotation": annotation, "wire_type": wire_type, "wire": wire,
            "given": default if given is MISSING else given, "to_wire": to_wire,
            "from_wire": from_wire, "vllm": vllm, "sampler": sampler}  # fmt: skip
    return field(default=default, metadata={"option": meta})


@dataclass(frozen=True)
class Sampling:
    """How one row is decoded; checked on construction, so bad values fail before compute.

    Its option fields are THE generation options: ``OPTIONS`` derives every keyword of
    ``lm.generate`` / ``lm.stream`` / ``chat.say`` / ``sl.connect`` and every sampling field
    of the server's requests from them (name, default, type, docs, wire name), so a new
    setting is a field here plus what it does (``core.sampling``).

    The logit adjustments are vLLM's, made in vLLM's order by
    ``core.sampling.adjust_logits`` on every engine, before temperature, top-k, top-p and
    min-p. Reported log-probabilities are the model's own, before any of them.
    """

    max_new_tokens: int = option(
        40, "at most this many new tokens per row.", annotation="int", wire="max_tokens",
        wire_type=int)  # fmt: skip
    temperature: float = option(
        0.0, "0 is greedy; otherwise logits are divided by it before sampling.",
        annotation="float", wire_type=float, sampler=True)  # fmt: skip
    top_k: int | None = option(
        None, "keep only the k most likely tokens.", annotation="int | None", wire_type=int,
        sampler=True)  # fmt: skip
    top_p: float = option(
        1.0, "keep the smallest set of tokens whose probability reaches top_p.",
        annotation="float", wire_type=float, vllm=True, sampler=True)  # fmt: skip
    min_p: float = option(
        0.0, "in [0, 1], as vLLM's and HF's: drop the tokens less likely than min_p times the "
        "likeliest one (after temperature, top-k and top-p, as HF's order; 0 is off).",
        annotation="float", wire_type=float, vllm=True, sampler=True)  # fmt: skip
    seed: int = option(
        0, "makes sampling reproducible; rows of the same prompt share random numbers (None: "
        "a fresh seed).", annotation="int | None", wire_type=int, given=None)  # fmt: skip
    stop_at_eos: bool = option(
        True, "rows end at EOS; False gives fixed-length output.", annotation="bool",
        wire="ignore_eos", wire_type=bool, to_wire=lambda v: not v,
        from_wire=lambda v: not v)  # fmt: skip
    stop: tuple[str, ...] = option(
        (), "strings that end a row; the text is cut before them.",
        annotation="str | Sequence[str] | None", wire_type=str | list[str], given=None,
        to_wire=lambda v: list(v) or None)  # fmt: skip
    logprobs: int | None = None  # per sampled token, its N most likely alternatives too
    prompt_logprobs: int | None = None  # score the prompt's tokens, each with N alternatives
    repetition_penalty: float = option(
        1.0, "> 0 (1 is off), as vLLM's: every token already in the prompt or the output has "
        "its logit divided by it where positive, multiplied by it otherwise.",
        annotation="float", wire_type=float, vllm=True)  # fmt: skip
    frequency_penalty: float = option(
        0.0, "in [-2, 2], as vLLM's and OpenAI's: subtracted from a token's logit once for "
        "each time it occurs in the output so far.", annotation="float", wire_type=float,
        vllm=True)  # fmt: skip
    presence_penalty: float = option(
        0.0, "in [-2, 2]: subtracted once from the logit of every token that occurs in the "
        "output so far.", annotation="float", wire_type=float, vllm=True)  # fmt: skip
    logit_bias: tuple[tuple[int, float], ...] = option(
        (), "``{token_id: bias}``, biases in [-100, 100], added to the logits (-100 all but "
        "bans a token, 100 all but forces it).", annotation="Mapping[int, float] | None",
        wire_type=dict[str, float], given=None,
        to_wire=lambda v: {str(t): b for t, b in v} or None)  # fmt: skip
    min_tokens: int = option(
        0, "no end of sequence before this many new tokens: EOS ids cannot be sampled and "
        "stop strings do not match until then (at most max_new_tokens). The penalties, "
        "logit_bias and min_tokens adjust the logits a row samples from, in vLLM's order, "
        "before temperature, top-k, top-p and min-p; reported logprobs are the model's own.",
        annotation="int", wire_type=int, vllm=True)  # fmt: skip

    @classmethod
    def of(cls, options: Mapping[str, Any], *, where: str = "generate", **fixed: Any) -> Sampling:
        """``Sampling`` from option keywords (``OPTIONS``' names; missing ones take their
        defaults); ``fixed`` sets fields that are not options (``logprobs``). An unknown
        keyword is a ``TypeError`` naming the close matches, as Python's own."""
        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            close = difflib.get_close_matches(unknown[0], OPTION_NAMES, n=2)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else "."
            raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}{hint}")
        given = {o.name: options.get(o.name, o.default) for o in OPTIONS}
        if given["seed"] is None:
            given["seed"] = fresh_seed()
        given["stop"] = cls.stops(given["stop"])
        given["logit_bias"] = cls.biases(given["logit_bias"])
        return cls(**given, **fixed)

    def options(self) -> dict[str, Any]:
        """The option fields by name (the keywords that give this ``Sampling`` again)."""
        return {o.name: getattr(self, o.name) for o in OPTIONS}

    def wire(self) -> dict[str, Any]:
        """The option fields as a server request's JSON fields (``Option.wire`` names)."""
        return {o.wire: o.to_wire(getattr(self, o.name)) for o in OPTIONS}

    def __post_init__(self) -> None:
        _plain_numbers(self)
        n, least = self.max_new_tokens, 0 if self.prompt_logprobs is not None else 1
        if not _is_int(n) or n < least:
            raise SamplingError("max_new_tokens", f"max_new_tokens must be an int >= {least}; "
                                f"got {n!r}" + (" (0 only when the prompt is scored)." if least
                                                else "."))  # fmt: skip
        for name in ("logprobs", "prompt_logprobs"):
            top = getattr(self, name)
            if top is not None and (not _is_int(top) or top < 0):
                raise SamplingError(name, f"{name} must be None or an int >= 0; got {top!r}.")
        t = self.temperature
        if not _is_real(t) or t < 0:
            raise SamplingError("temperature", "temperature must be a finite number >= 0; "
                                f"got {t!r}.")  # fmt: skip
        p = self.top_p
        if not (_is_real(p) and 0 < p <= 1):
            raise SamplingError("top_p", f"top_p must be in (0, 1]; got {p!r}.")
        m = self.min_p
        if not (_is_real(m) and 0 <= m <= 1):
            raise SamplingError("min_p", f"min_p must be in [0, 1]; got {m!r}.")
        k = self.top_k
        if k is not None and (not _is_int(k) or k < 1):
            raise SamplingError("top_k", f"top_k must be None or an int >= 1; got {k!r}.")
        if not _is_int(self.seed):
            raise SamplingError("seed", f"seed must be an int; got {self.seed!r}.")
        eos = as_flag(self.stop_at_eos)  # ``core.scalars``' rule for every boolean option
        if eos is None:
            raise SamplingError("stop_at_eos", "stop_at_eos must be True or False; got "
                                f"{self.stop_at_eos!r}.")  # fmt: skip
        object.__setattr__(self, "stop_at_eos", eos)
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise SamplingError("stop", f"stop strings must be non-empty strings; got {s!r}.")
        self._check_adjustments()

    def _check_adjustments(self) -> None:
        """vLLM's ranges for the logit adjustments (its ``SamplingParams`` checks)."""
        r = self.repetition_penalty
        if not _is_real(r) or r <= 0:
            raise SamplingError("repetition_penalty", "repetition_penalty must be a finite "
                                f"number > 0; got {r!r}.")  # fmt: skip
        for name in ("frequency_penalty", "presence_penalty"):
            v = getattr(self, name)
            if not _is_real(v) or not -2 <= v <= 2:
                raise SamplingError(name, f"{name} must be a number in [-2, 2]; got {v!r}.")
        for pair in self.logit_bias:
            token, bias = pair if isinstance(pair, tuple) and len(pair) == 2 else (None, None)
            if not _is_int(token) or token < 0:  # type: ignore[operator]
                raise SamplingError("logit_bias", "logit_bias maps token ids (ints >= 0) to "
                                    f"biases; got {pair!r}.")  # fmt: skip
            if not _is_real(bias) or not -100 <= bias <= 100:  # type: ignore[operator]
                raise SamplingError("logit_bias", f"logit_bias[{token}] must be a number in "
                                    f"[-100, 100]; got {bias!r}.")  # fmt: skip
        if len({token for token, _ in self.logit_bias}) < len(self.logit_bias):
            raise SamplingError("logit_bias", "logit_bias names a token id twice.")
        m = self.min_tokens
        if not _is_int(m) or m < 0:
            raise SamplingError("min_tokens", f"min_tokens must be an int >= 0; got {m!r}.")
        if m > self.max_new_tokens:
            raise SamplingError("min_tokens", f"min_tokens ({m}) must be at most max_new_tokens "
                                f"({self.max_new_tokens}).")  # fmt: skip

    def check_vocab(self, n_vocab: int) -> None:
        """Refuse ``logit_bias`` ids outside a model's ``n_vocab`` logits, before compute.

        >>> Sampling(logit_bias=((7, 5.0),)).check_vocab(678)  # id 7 is in: nothing raised
        """
        outside = [token for token, _ in self.logit_bias if token >= n_vocab]
        if outside:
            raise SamplingError("logit_bias", "logit_bias has token ids outside this model's "
                                f"vocabulary [0, {n_vocab}): {outside}.")  # fmt: skip

    @staticmethod
    def stops(stop: str | Sequence[str] | None) -> tuple[str, ...]:
        """``stop=`` as a tuple: one string, a list of them, or None."""
        if stop is None:
            return ()
        if isinstance(stop, str):
            return (stop,)
        if not isinstance(stop, (list, tuple)):
            raise SamplingError("stop", "stop must be a string or a list of strings; got "
                                f"{stop!r}.")  # fmt: skip
        return tuple(stop)

    @staticmethod
    def biases(
        logit_bias: Mapping[int, float] | Mapping[str, float] | None,
    ) -> tuple[tuple[int, float], ...]:
        """``logit_bias=`` as sorted (id, bias) pairs; ids may be strings of digits (JSON's).

        >>> Sampling.biases({"17": -100, 3: 2.5})
        ((3, 2.5), (17, -100))
        """
        if logit_bias is None:
            return ()
        if not isinstance(logit_bias, Mapping):
            raise SamplingError("logit_bias", "logit_bias must map token ids to biases; got "
                                f"{logit_bias!r:.60}.")  # fmt: skip
        pairs: list[tuple[int, float]] = []
        for key, bias in logit_bias.items():
            if isinstance(key, str) and key.strip().isdigit():
                key = int(key)
            if not _is_int(key):
                raise SamplingError("logit_bias", "logit_bias keys must be token ids (ints, or "
                                    f"strings of digits); got {key!r}.")  # fmt: skip
            pairs.append((int(key), bias))
        return tuple(sorted(pairs, key=lambda pair: pair[0]))


OPTIONS: tuple[Option, ...] = tuple(
    Option(f.name, f.metadata["option"]["given"], f.metadata["option"]["annotation"],
           f.metadata["option"]["doc"], f.metadata["option"]["wire"] or f.name,
           f.metadata["option"]["wire_type"], f.metadata["option"]["to_wire"],
           f.metadata["option"]["from_wire"], f.metadata["option"]["vllm"],
           f.metadata["option"]["sampler"])
    for f in fields(Sampling) if "option" in f.metadata
)  # fmt: skip
OPTION_NAMES = tuple(o.name for o in OPTIONS)


def fresh_seed() -> int:
    """A random seed from the OS, leaving torch's (and everyone's) global RNG alone."""
    return int.from_bytes(os.urandom(4), "big") % 2**31


def _is_int(value: object) -> bool:
    """One integer (numpy's and 0-d tensors too), never a bool: ``core.scalars.as_int``."""
    return as_int(value) is not None


def _is_real(value: object) -> bool:
    """A finite real number (numpy's and 0-d tensors too), never a bool (``True`` is not a
    number here): ``core.scalars.as_real``."""
    return as_real(value) is not None


def _plain(value: Any) -> Any:
    """A numpy or 0-d tensor number as a plain int or float; anything else as it is."""
    if type(value) in (int, float):
        return value
    number: int | float | None = as_int(value)
    if number is None:
        number = as_real(value)
    return value if number is None else number


def _plain_numbers(sampling: Sampling) -> None:
    """Every number setting of ``sampling`` as a plain int or float, before it is checked."""
    for name in _NUMBER_FIELDS:
        object.__setattr__(sampling, name, _plain(getattr(sampling, name)))
    if isinstance(sampling.logit_bias, tuple):
        pairs = tuple(
            tuple(_plain(x) for x in pair) if isinstance(pair, tuple) else pair
            for pair in sampling.logit_bias
        )
        object.__setattr__(sampling, "logit_bias", pairs)


_NUMBER_FIELDS = tuple(f.name for f in fields(Sampling)
                       if str(f.type) in ("int", "float", "int | None"))  # fmt: skip


@dataclass(frozen=True)
class Request:
    """One row for an engine: tokens in, one ``Completion`` out.

    Attributes:
        prompt: token ids to feed (after the cache row, when a cache is continued).
        steers: the steers on this row, each with this row's one alpha (``Steer.of``).
        sampling: this row's decoding settings.
        stream: rows with the same ``sampling.seed`` and ``stream`` draw the same random
            numbers (a prompt's baseline and steered rows); make it unique otherwise.
        generated: per prompt token, True where the model produced it in an earlier call
            (a chat history's replies fed again), so ``positions="generated"`` still
            touches it; empty means none.
        monitors: projections to read on this row while it generates (``Readout``).
        reads_from: the first position (counted from the row's first real token, a
            continued cache's included) that a prompt condition reads and that a
            conditioned steer may touch: a chat turn's own tokens start there, so the turn
            decides on its own prompt and leaves earlier turns as they were decided.
    """

    prompt: tuple[int, ...]
    steers: tuple[Steer, ...] = ()
    sampling: Sampling = field(default_factory=Sampling)
    stream: str = ""
    generated: tuple[bool, ...] = ()
    monitors: tuple[Monitor, ...] = ()
    reads_from: int = 0

    @property
    def reads(self) -> bool:
        """Whether the row reads its activations: a condition or a monitor."""
        return bool(self.monitors) or any(s.when is not None for s in self.steers)

    def __post_init__(self) -> None:
        if not all(type(t) is int for t in self.prompt) or not isinstance(self.prompt, tuple):
            plain = tuple(as_int(t) for t in self.prompt)  # numpy's integers too, not bools
            if any(t is None for t in plain):
                raise ValueError("Request.prompt must be a sequence of int token ids.")
            object.__setattr__(self, "prompt", plain)
        if self.generated and len(self.generated) != len(self.prompt):
            raise ValueError(
                f"Request.generated has {len(self.generated)} flags for "
                f"{len(self.prompt)} prompt tokens."
            )
        if as_int(self.reads_from) is None or self.reads_from < 0:
            raise ValueError(f"Request.reads_from must be an int >= 0; got {self.reads_from!r}.")
        for steer in self.steers:
            if not isinstance(steer, Steer) or len(steer.alpha) != 1:
                raise SteerError("Request.steers takes Steer values with one alpha each "
                                 f"(Steer.of(steer, alpha)); got {steer!r}.")  # fmt: skip


@dataclass(frozen=True)
class Readout:
    """What a monitor read on one row: ``h·v/|v|`` at ``site``, after the steers there.

    ``prompt`` has one value per prompt token fed by the call; ``generated[t]`` is read at
    the position whose forward chose new token ``t`` (the last prompt token for t = 0, new
    token t-1 after that).
    """

    site: str
    prompt: tuple[float, ...]
    generated: tuple[float, ...]


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
    fired: bool | None = None  # did the row's condition fire (None: the row has none)
    condition_score: float | None = None  # the score that decision was made on
    readouts: dict[str, Readout] = field(default_factory=dict)  # by monitor name
