"""An LLM judge over any OpenAI-compatible chat endpoint, rating steered text AxBench's way.

The protocol is AxBench's (Wu et al., "AxBench: Steering LLMs? Even Simple Baselines
Outperform Sparse Autoencoders", 2025): a judge model rates each completion 0, 1 or 2 on
three criteria, asked separately: does it show the concept, does it follow the
instruction, is it fluent. The headline is the harmonic mean of the three, so a completion
that drops any one of them scores 0. The prompts below are steerlab's own.

>>> judge = Judge("http://127.0.0.1:8000/v1", "gpt-4o-mini")
>>> concept = judge.concept("the sea")
>>> sl.evals.steerability(lm, vec, prompts, concept=concept)  # needs a judge server  # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
import os
import time
import unicodedata
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from steerlab.core.bars import bar
from steerlab.core.errors import SteerError
from steerlab.core.prompts import Prompt
from steerlab.core.scalars import as_int, as_real, list_of

CRITERIA = ("concept", "instruction", "fluency")

_ASK = {
    "concept": (
        "You are grading how strongly a piece of text is about a given concept.\n\n"
        "Concept: {concept}\n\nText:\n<<<\n{text}\n>>>\n\n"
        "Give 0 if the concept is absent, 1 if it is hinted at or mentioned in passing, "
        "and 2 if it is clearly and repeatedly present."
    ),
    "instruction": (
        "You are grading whether a response stays on the topic of the request it was given. "
        "Judge only how related it is to the request, not its style or its quality.\n\n"
        "Request:\n<<<\n{instruction}\n>>>\n\nResponse:\n<<<\n{text}\n>>>\n\n"
        "Give 0 if it is unrelated to the request, 1 if it is loosely related, and 2 if "
        "it addresses the request."
    ),
    "fluency": (
        "You are grading the fluency of a piece of text: grammar, coherence and freedom "
        "from repetition. Ignore what it is about.\n\nText:\n<<<\n{text}\n>>>\n\n"
        "Give 0 if it is broken or repetitive, 1 if it is readable with clear flaws, and "
        "2 if it reads naturally."
    ),
}
_FORMAT = "\n\nExplain in one or two sentences, then end with a last line of the form 'Rating: N'."
_WRITE = (
    "Write a short instruction, addressed to an AI assistant, that makes every one of its "
    "replies include the concept below, even when the user's question is about something "
    "else.\n\nConcept: {concept}\n\nReply with the instruction only."
)


_RETRY = (429, 500, 502, 503, 504)  # rate limits and a server's passing trouble
MAX_WAIT = 60.0  # seconds: the longest pause between two tries, whoever asks for more
_sleep = time.sleep  # how the judge pauses between tries (a test records it instead)


def retry_wait(retry_after: str | None, attempt: int) -> float:
    """Seconds before try ``attempt + 1``: the server's ``Retry-After`` when it gives a
    number of seconds, else 1, 2, 4 ... (exponential backoff); either way in [0, MAX_WAIT].

    >>> retry_wait("3", 0), retry_wait(None, 3), retry_wait("nan", 1), retry_wait(None, 40)
    (3.0, 8.0, 2.0, 60.0)
    """
    try:
        seconds = float(retry_after) if retry_after is not None else math.nan
    except ValueError:  # an HTTP date, or garbage: as if it were not there
        seconds = math.nan
    if math.isnan(seconds):
        seconds = 2.0 ** min(attempt, 30)
    return min(max(seconds, 0.0), MAX_WAIT)


class JudgeError(RuntimeError):
    """A judge that did not answer, or answered without a rating steerlab can read."""


def prompt_text(prompt: Prompt) -> str:
    """A prompt as the text a judge reads: a string as is, messages as ``role: content``."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m['role']}: {m['content']}" for m in prompt)


def harmonic_mean(values: Sequence[float]) -> float:
    """The harmonic mean; 0 when any value is 0 (AxBench's rule: a zero sinks the rating).

    >>> harmonic_mean([2, 2, 2]), harmonic_mean([2, 1, 0]), round(harmonic_mean([2, 2, 1]), 3)
    (2.0, 0.0, 1.5)
    """
    if any(v == 0 for v in values):
        return 0.0
    return len(values) / sum(1 / v for v in values)


def parse_rating(reply: str) -> float | None:
    """The judge's rating by AxBench's rule, or None when there is none to read.

    The text after the last ``Rating:``, its first line, with brackets, full stops, quotes
    and stars stripped, read as a number in [0, 2]. Anything else (no ``Rating:``, not a
    number, out of range) is None: the benchmark scores it 0 and counts it as a parse
    failure.

    >>> parse_rating("It mentions the sea twice.\\nRating: [[2]]"), parse_rating("Rating: **1.5**")
    (2.0, 1.5)
    >>> parse_rating("Rating: .5"), parse_rating("Rating: [[1]].")
    (0.5, 1.0)
    >>> parse_rating("I would say 2."), parse_rating("Rating: 3")
    (None, None)
    """
    if not isinstance(reply, str) or "Rating:" not in reply:
        return None
    lines = reply.rsplit("Rating:", 1)[1].strip().splitlines()
    first = lines[0].strip().replace("[", "").replace("]", "") if lines else ""
    first = first.rstrip(".").strip('"').strip("'").strip("*").strip()  # AxBench's order
    try:
        value = float(first)
    except ValueError:
        return None
    return value if 0.0 <= value <= 2.0 else None


class Judge:
    """A judge model behind an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        base_url: the API root, such as ``https://api.openai.com/v1`` or a ``steerlab
            serve`` / vLLM server's ``http://127.0.0.1:8000/v1``.
        model: the judge model's name at that endpoint.
        api_key: sent as a bearer token; None reads ``OPENAI_API_KEY`` when it is set.
        timeout: seconds per request, the whole of it (connecting, sending, the reply's
            headers and body): a server that trickles its reply cannot stretch it.
        max_workers: requests in flight at once.
        max_tokens: the most tokens a judge may spend on one rating.
        max_retries: tries after the first for a request that failed to connect or was
            answered 429 or 5xx, waiting the server's ``Retry-After`` or else 1, 2, 4 ... s
            between them, never more than 60 s (``MAX_WAIT``). Any other answer is final.

    Ratings are asked at temperature 0. Needs ``httpx`` (the ``server`` extra), whose
    ``httpcore`` it speaks through; an ``http(s)://`` proxy in ``HTTPS_PROXY`` /
    ``HTTP_PROXY`` / ``ALL_PROXY`` is used, as httpx would (not for hosts in ``NO_PROXY``).
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *,
                 timeout: float = 60.0, max_workers: int = 8, max_tokens: int = 256,
                 max_retries: int = 3) -> None:  # fmt: skip
        from steerlab.evals.http import DeadlinePool, HTTPFailure, proxy_for

        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise SteerError(f"base_url must be an http(s) URL; got {base_url!r:.80}.", "base_url")
        if not isinstance(model, str) or not model.strip():
            raise SteerError(f"model must be the judge model's name; got {model!r:.60}.", "model")
        self.timeout = _positive_seconds(timeout)
        for name, value, least in (("max_workers", max_workers, 1), ("max_tokens", max_tokens, 1),
                                   ("max_retries", max_retries, 0)):  # fmt: skip
            if as_int(value) is None or value < least:
                raise SteerError(f"{name} must be an int >= {least}; got {value!r:.40}.", name)
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        _check_key(key, "api_key" if api_key is not None else "OPENAI_API_KEY (the api_key)")
        self.base_url, self.model = base_url.rstrip("/"), model
        self.max_workers, self.max_tokens = int(max_workers), int(max_tokens)
        self.max_retries = int(max_retries)
        try:
            proxy = proxy_for(self.base_url)
        except HTTPFailure as error:
            raise SteerError(f"No way to reach the judge: {error}.", "base_url") from None
        self._http = DeadlinePool({"Authorization": f"Bearer {key}"} if key else {}, proxy)

    def __repr__(self) -> str:
        return f"Judge({self.base_url!r}, {self.model!r})"

    def concept(self, description: str) -> Criterion:
        """The judge rating ``description`` (what the steer should bring out), for
        ``steerability(..., concept=judge.concept("talks about the sea"))``."""
        if not isinstance(description, str) or not description.strip():
            raise ValueError("The concept is a non-empty description, e.g. 'talks about the sea'.")
        return Criterion(self, description)

    def ask(self, question: str, *, temperature: float = 0.0) -> str:
        """One chat completion: the judge's reply to ``question``."""
        from steerlab.evals.http import HTTPFailure

        body = json.dumps({"model": self.model, "temperature": temperature,
                           "messages": [{"role": "user", "content": question}],
                           "max_tokens": self.max_tokens}).encode()  # fmt: skip
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                reply = self._http.send("POST", f"{self.base_url}/chat/completions", body,
                                        timeout=self.timeout)  # fmt: skip
            except HTTPFailure as error:
                if last:
                    raise JudgeError(f"The judge at {self.base_url} did not answer: {error}"
                                     ) from error  # fmt: skip
                _sleep(retry_wait(None, attempt))
                continue
            if reply.status not in _RETRY or last:
                break
            _sleep(retry_wait(reply.headers.get("retry-after"), attempt))
        if reply.status != 200:
            raise JudgeError(f"The judge at {self.base_url} answered {reply.status}: "
                             f"{reply.text[:300]}")  # fmt: skip
        try:
            content = json.loads(reply.body)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError, RecursionError):
            raise JudgeError(f"The judge's answer is not a chat completion: "
                             f"{reply.text[:300]}") from None  # fmt: skip
        if not isinstance(content, str):
            raise JudgeError(f"The judge's message has no text content: {content!r:.300}")
        return content

    def rate(self, concept: str, instruction: str, text: str) -> tuple[float, float, float]:
        """One text's ratings (0-2): does it show ``concept``, is it related to
        ``instruction``, is it fluent. A reply with no rating steerlab can read (AxBench's
        rule, ``parse_rating``) is ``nan`` for that criterion: the benchmark scores it 0 and
        counts it.

        Raises:
            JudgeError: the judge did not answer (after ``max_retries``), or its answer is
                not a chat completion.
        """
        return self.rate_with_replies(concept, instruction, text)[0]

    def rate_with_replies(self, concept: str, instruction: str, text: str
                          ) -> tuple[tuple[float, float, float], tuple[str, str, str]]:  # fmt: skip
        """``rate``'s three ratings and the judge's three replies they were read from."""
        fields = {"concept": concept, "instruction": instruction, "text": text}
        replies = [self.ask(_ASK[name].format(**fields) + _FORMAT) for name in CRITERIA]
        values = [parse_rating(reply) for reply in replies]
        c, i, f = (math.nan if v is None else v for v in values)
        return (c, i, f), (replies[0], replies[1], replies[2])

    def write_prompt(self, concept: str) -> str:
        """A prompt that asks a model to bring ``concept`` into its replies, written by the
        judge's model at temperature 1 (AxBench's prompting baseline)."""
        text = self.ask(_WRITE.format(concept=concept), temperature=1.0).strip()
        if not text:
            raise JudgeError(f"The judge wrote an empty prompt for the concept {concept!r}.")
        return text

    def ping(self) -> None:
        """Check that the judge's server answers at all (``GET /models``), before a run.

        Raises:
            JudgeError: nothing answered at ``base_url``.
        """
        from steerlab.evals.http import HTTPFailure

        try:
            self._http.send("GET", f"{self.base_url}/models", timeout=min(self.timeout, 10.0))
        except HTTPFailure as error:
            raise JudgeError(f"The judge at {self.base_url} is unreachable: {error}. Start the "
                             "judge's server, or check base_url.") from error  # fmt: skip


def _positive_seconds(timeout: Any) -> float:
    seconds = as_real(timeout)
    if seconds is None or seconds <= 0:
        raise SteerError(f"timeout must be a finite number of seconds > 0; got {timeout!r:.40}.",
                         "timeout")  # fmt: skip
    return seconds


def _check_key(key: Any, name: str) -> None:
    """An API key a header can carry: a string of visible ASCII, no spaces or line breaks
    (the key itself is never shown)."""
    if key is None:
        return
    if not isinstance(key, str):
        raise SteerError(f"{name} must be a string; got {type(key).__name__}.", "api_key")
    bad = next((i for i, c in enumerate(key) if not "!" <= c <= "~"), None)  # visible ASCII
    if bad is not None:
        char = unicodedata.name(key[bad], f"U+{ord(key[bad]):04X}")
        raise SteerError(f"{name} has a character a header cannot carry at position "
                         f"{bad} ({char}); keys are visible ASCII, with no spaces or line "
                         "breaks.", "api_key")  # fmt: skip


@dataclass(frozen=True)
class Criterion:
    """A judge and a concept: the ``concept=`` of ``steerability`` for an LLM judge."""

    judge: Judge
    description: str
    metrics: tuple[str, ...] = (*CRITERIA, "judge")
    headline: str = "judge"

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", tuple(list_of(self.metrics, "Criterion metrics")))

    def score(self, prompts: Sequence[str], texts: Sequence[str], *,
              progress: bool = True) -> list[dict[str, Any]]:  # fmt: skip
        """Ratings for each (prompt, text), requests in parallel; in input order. A rating
        the judge gave in no readable form counts 0 (AxBench's rule)."""
        prompts, texts = list_of(prompts, "prompts"), list_of(texts, "texts")
        pool = ThreadPoolExecutor(self.judge.max_workers)
        jobs = [pool.submit(self.judge.rate, self.description, p, t)
                for p, t in zip(prompts, texts)]  # fmt: skip
        try:
            rated = [job.result() for job in bar(jobs, desc="judge", disable=not progress)]
        finally:  # on a judge error, the ratings not yet asked are not asked
            pool.shutdown(cancel_futures=True)
        out = []
        for values in rated:
            scores = [0.0 if math.isnan(v) else v for v in values]
            out.append({**dict(zip(CRITERIA, scores)), "judge": harmonic_mean(scores)})
        return out
