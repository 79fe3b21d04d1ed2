"""``write_concept_data``: a concept's benchmark data written by an LLM, AxBench's recipe.

AxBench (Wu et al., 2025; ``axbench/scripts/generate.py`` and ``axbench/utils/dataset.py``)
writes each concept's data with gpt-4o-mini: positives answer instructions while weaving the
concept in, negatives answer them keeping it out (15% math, 15% code, the rest text), and
RePS pairs each positive with the steered model's own greedy reply. Here any *writer* does
the writing: anything with ``ask(question: str) -> str``, such as ``sl.evals.Judge`` (an
OpenAI-compatible endpoint) or ``steerlab.toy.ToyWriter()`` (offline). The questions'
wording is steerlab's own (``steerlab.core.writing``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from steerlab.core.bars import bar
from steerlab.core.concepts import ConceptData, preference_pairs
from steerlab.core.errors import SteerError
from steerlab.core.scalars import as_int, list_of
from steerlab.core.writing import genre_plan, question
from steerlab.evals.judge import JudgeError

# A reply that opens like this declined to write; it is asked again, then reported.
_REFUSAL = re.compile(
    r"^\W*(i'?m sorry|i am sorry|sorry,|i can'?t|i cannot|i can not|i won'?t|i will not|"
    r"i'?m (not able|unable)|i am (not able|unable)|as an ai)",
    re.I,
)


def write_concept_data(
    concept: str,
    *,
    writer: Any,
    instructions: Sequence[str],
    n_positives: int = 72,
    n_negatives: int = 72,
    lm: Any = None,
    prompts: Sequence[str] | None = None,
    max_new_tokens: int | None = None,
    progress: bool = True,
) -> ConceptData:
    """A concept's ``ConceptData``, written by ``writer`` by AxBench's recipe.

    Args:
        concept: the concept as the writer and the judge are told it
            ("references to the ocean").
        writer: anything with ``ask(question: str) -> str``: ``sl.evals.Judge(url, model)``
            or ``steerlab.toy.ToyWriter()``. Its ``max_workers`` (default 1) requests run at
            once; its ``ping()``, where it has one, runs first; an empty reply or a refusal
            is asked again up to its ``max_retries`` (default 3) times.
        instructions: the prompts the steered model answers in the benchmark, kept as given.
        n_positives: positives to write (AxBench: 72): replies that weave the concept in.
        n_negatives: negatives to write (AxBench: 72): replies that keep it out, 15% of them
            math and 15% code, the rest text.
        lm: the model whose own greedy replies are the pairs' rejected side
            (``sl.train.preference_pairs``); None: no pairs.
        prompts: the requests the writer answers, taken in turn (a request asked again asks
            for another version); None: ``instructions``. The pairs' prompts are these, so
            a benchmark that trains (BiPO, RePS, LoReFT) sees its own test instructions
            unless ``prompts`` holds them out, as AxBench's seed instructions do.
        max_new_tokens: the length of ``lm``'s greedy replies; None: the longest positive's.
        progress: a progress bar over the writer's requests.

    Returns:
        ``ConceptData(concept)`` with ``n_positives`` positives, ``n_negatives`` negatives,
        the pairs (one per positive, less any the model would write itself) and the
        instructions.

    Raises:
        SteerError: bad input, before any request.
        JudgeError: an unreachable writer (before any work), or replies that stayed empty or
            refused after the retries (naming the concept and how many).

    >>> import steerlab.toy as toy
    >>> write_concept_data("the sea", writer=toy.ToyWriter(), instructions=["Tell me a story."],
    ...                    n_positives=4, n_negatives=4, progress=False)
    ConceptData('the sea': 4 positives, 4 negatives, 0 pairs, 1 instructions)
    """
    asked, retries, workers = _check(concept, writer, instructions, n_positives, n_negatives,
                                     prompts, max_new_tokens, progress)  # fmt: skip
    ping = getattr(writer, "ping", None)
    if callable(ping):
        ping()  # an unreachable writer stops here, before any work
    positive_asks = _asks(asked, n_positives)
    negative_asks = _asks(asked, n_negatives)
    questions = [question("positive", concept, a, "text", v) for a, v in positive_asks]
    questions += [question("negative", concept, a, g, v)
                  for (a, v), g in zip(negative_asks, genre_plan(n_negatives))]  # fmt: skip
    replies = _ask_all(writer, questions, retries, workers, progress)
    failed = sum(r is None for r in replies)
    if failed:
        raise JudgeError(f"The writer gave no usable reply (empty, or a refusal) to {failed} "
                         f"of {len(questions)} requests for the concept {concept!r}, each "
                         f"asked {retries + 1} times.")  # fmt: skip
    texts: list[str] = [r for r in replies if r is not None]
    positives, negatives = texts[:n_positives], texts[n_positives:]
    data = ConceptData(concept, positives=positives, negatives=negatives,
                       instructions=list(instructions))  # fmt: skip
    if lm is None:
        return data
    pairs = preference_pairs(lm, [a for a, _ in positive_asks], positives,
                             max_new_tokens=max_new_tokens)  # fmt: skip
    return replace(data, pairs=pairs)


def _check(concept: Any, writer: Any, instructions: Any, n_positives: Any, n_negatives: Any,
           prompts: Any, max_new_tokens: Any, progress: Any) -> tuple[list[str], int, int]:  # fmt: skip
    """The requests to answer, the retries and the workers; every argument checked."""
    if not isinstance(concept, str) or not concept.strip():
        raise SteerError(f"concept must be a non-empty string; got {concept!r:.60}.")
    if not callable(getattr(writer, "ask", None)):
        raise SteerError(f"writer must have ask(question) -> str (sl.evals.Judge, "
                         f"steerlab.toy.ToyWriter); got {type(writer).__name__}.")  # fmt: skip
    for name, value in (("n_positives", n_positives), ("n_negatives", n_negatives)):
        if as_int(value) is None or value < 1:
            raise SteerError(f"{name} must be an int >= 1; got {value!r}.")
    instructions = _requests(instructions, "instructions")
    requests = instructions if prompts is None else _requests(prompts, "prompts")
    if max_new_tokens is not None and (as_int(max_new_tokens) is None or max_new_tokens < 1):
        raise SteerError(f"max_new_tokens must be an int >= 1 or None; got {max_new_tokens!r}.")
    if not isinstance(progress, bool):
        raise SteerError(f"progress must be True or False; got {progress!r}.")
    retries = getattr(writer, "max_retries", 3)
    workers = getattr(writer, "max_workers", 1)
    for name, value, least in (("max_retries", retries, 0), ("max_workers", workers, 1)):
        if as_int(value) is None or value < least:
            raise SteerError(f"writer.{name} must be an int >= {least}; got {value!r}.")
    return requests, int(retries), int(workers)


def _requests(value: Any, name: str) -> list[str]:
    texts = list_of(value, name)
    if not texts:
        raise SteerError(f"{name} must hold at least one request.")
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise SteerError(f"{name}[{i}] must be a non-empty string; got {text!r:.60}.")
    return texts


def _asks(requests: list[str], n: int) -> list[tuple[str, int]]:
    """``n`` requests taken in turn, each with its version (1 the first time it is asked)."""
    return [(requests[i % len(requests)], i // len(requests) + 1) for i in range(n)]


def _ask_all(writer: Any, questions: list[str], retries: int, workers: int,
             progress: bool) -> list[str | None]:  # fmt: skip
    """Each question's reply (stripped), in order; None where every try was empty or refused."""
    pool = ThreadPoolExecutor(workers)
    jobs = [pool.submit(_ask_one, writer, q, retries) for q in questions]
    try:
        return [job.result() for job in bar(jobs, desc="writer", disable=not progress)]
    finally:  # on a writer error, the requests not yet asked are not asked
        pool.shutdown(cancel_futures=True)


def _ask_one(writer: Any, text: str, retries: int) -> str | None:
    for _ in range(retries + 1):
        reply = writer.ask(text)
        if not isinstance(reply, str):
            raise JudgeError(f"The writer's ask returned {type(reply).__name__}, not a string.")
        reply = reply.strip()
        if reply and not _REFUSAL.match(reply):
            return reply
    return None
