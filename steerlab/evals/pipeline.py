"""A benchmark run's loop, as a bounded pipeline: each cell (method × concept) has its steer
made, its texts generated and stored, and its ratings handed to the judge's workers; the
next cell generates while they rate. At most ``LAG`` cells' ratings wait behind the one
generating, so memory stays bounded. Every piece goes to the ``RunStore`` the moment it
exists, so a run stopped anywhere resumes from there.

A judge that rates through the benchmark's own model (``ToyJudge``'s fluency) takes turns
with generation on one lock, instead of failing on a call already in flight.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from steerlab.core.bars import counter
from steerlab.core.concepts import ConceptData
from steerlab.core.errors import SteerError
from steerlab.core.rows import as_steers
from steerlab.core.sites import resolve
from steerlab.core.steer import at_alphas
from steerlab.evals.detection import detection_table
from steerlab.evals.methods import Method, Prompting
from steerlab.evals.protocol import judge_workers, raw_ratings
from steerlab.evals.runstore import RunStore

LAG = 1  # cells whose ratings may still be running while the next cell generates
Texts = list[tuple[int, float, int, str, str]]  # (row, factor, instruction, input, text)


def run_cells(lm: Any, maker: Any, concepts: list[ConceptData],
              methods: list[Method | Prompting], site: str, judge: Any, store: RunStore,
              progress: bool, sampling: dict[str, Any]) -> dict[str, float]:  # fmt: skip
    """Every cell not yet stored, through the pipeline: steers made and detection measured
    on ``maker`` (``lm`` itself, or ``make_on``), texts generated on ``lm``. Returns seconds
    spent making, generating, detecting (the models' time) and judging (the time any rating
    ran)."""
    seconds = dict.fromkeys(("make", "generate", "judge", "detect"), 0.0)
    rows = sum(len(d.instructions) * len(m.factors) for d in concepts for m in methods)
    model = threading.Lock()  # one model: generation and a judge that shares it take turns
    shares = _shares_model(judge, lm) or _shares_model(judge, maker)
    rater = _Rater(judge, store, model if shares else None)
    pending: list[list[Future[None]]] = []
    try:
        with counter(rows * 2, "benchmark", disable=not progress) as bar:  # made, then rated
            rater.done = bar.update
            for data in concepts:
                steers = {}
                for method in methods:
                    cell = (method.name, data.name)
                    bar.set_postfix_str(f"{method.name} / {data.name}")
                    with model, _timed(seconds, "make"):
                        steers[cell] = steer = _steer(maker, method, data, site, store)
                    texts = store.generations(cell)
                    if not texts:
                        with model, _timed(seconds, "generate"):
                            texts = _generate(lm, method, data, steer, store, sampling)
                    bar.update(len(texts))
                    pending.append(rater.submit(cell, data, texts))
                    rater.raise_failed(pending)  # a judge failing for good stops the run now
                    while len(pending) > LAG:
                        rater.wait(pending.pop(0))
                with model, _timed(seconds, "detect"):
                    _detect(maker, data, methods, steers, site, store)
            while pending:
                rater.wait(pending.pop(0))
    except BaseException as error:
        if not rater.failed and not isinstance(error, KeyboardInterrupt):
            rater.drain(pending)  # a make that raised: the texts made are still rated
        raise
    finally:  # ratings queued are not asked; those in flight finish and are stored
        rater.pool.shutdown(wait=True, cancel_futures=True)
        seconds["judge"] = rater.busy
    return seconds


class _Rater:
    """The judge's workers: each rating is stored by the worker that asked it, the moment
    it arrives; ``busy`` counts the seconds any rating ran."""

    def __init__(self, judge: Any, store: RunStore, lock: threading.Lock | None) -> None:
        self.judge, self.store = judge, store
        self.turn: AbstractContextManager[Any] = lock if lock is not None else nullcontext()
        self.pool = ThreadPoolExecutor(judge_workers(judge))
        self.done: Callable[[int], Any] = lambda n: None
        self.failed = False
        self.busy = 0.0
        self._active, self._since, self._lock = 0, 0.0, threading.Lock()

    def submit(self, cell: tuple[str, str], data: ConceptData, texts: Texts) -> list[Future[None]]:
        have = self.store.ratings(cell)
        missing = [t for t in texts if t[0] not in have]
        self.done(len(texts) - len(missing))
        return [self.pool.submit(self._one, cell, data.name, data.instructions[index], row, text)
                for row, _, index, _, text in missing]  # fmt: skip

    def _one(self, cell: tuple[str, str], concept: str, instruction: str, row: int,
             text: str) -> None:  # fmt: skip
        self._clock(+1)
        try:
            with self.turn:
                values, replies = ask_judge(self.judge, concept, instruction, text)
            self.store.put_rating(cell, row, raw_ratings(values), replies)
        finally:
            self._clock(-1)
        self.done(1)

    def _clock(self, step: int) -> None:
        with self._lock:
            now = time.perf_counter()
            if self._active == 0:
                self._since = now
            self._active += step
            if self._active == 0:
                self.busy += now - self._since

    def wait(self, jobs: list[Future[None]]) -> None:
        for job in jobs:
            try:
                job.result()
            except BaseException:
                self.failed = True
                raise

    def raise_failed(self, pending: list[list[Future[None]]]) -> None:
        for jobs in pending:
            for job in jobs:
                if job.done() and not job.cancelled() and job.exception() is not None:
                    self.wait([job])

    def drain(self, pending: list[list[Future[None]]]) -> None:
        for jobs in pending:
            for job in jobs:
                if not job.cancelled():
                    job.exception()  # waits; a rating's own failure is left for the resume


def _shares_model(judge: Any, lm: Any) -> bool:
    """Whether the judge rates through the benchmark's model (``judge.lm``)."""
    other = getattr(judge, "lm", None)
    if other is lm:
        return True
    if other is None or getattr(lm, "backend", None) is None:  # vLLM: its model is elsewhere
        return False
    return getattr(other, "model", None) is lm.model


@contextmanager
def _timed(seconds: dict[str, float], phase: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds[phase] += time.perf_counter() - started


def ask_judge(judge: Any, concept: str, instruction: str, text: str) -> tuple[Any, Any]:
    """The judge's ratings and its three replies (None from a judge that gives none)."""
    explained = getattr(judge, "rate_with_replies", None)
    if callable(explained):
        return explained(concept, instruction, text)
    return judge.rate(concept, instruction, text), None


def _steer(lm: Any, method: Method | Prompting, data: ConceptData, site: str,
           store: RunStore) -> Any:  # fmt: skip
    """The cell's steer (None for prompting): stored, or made now and stored."""
    cell = (method.name, data.name)
    if store.has_steer(cell):
        return store.steer(cell, lm)
    steer = None if isinstance(method, Prompting) else _make(method, lm, data, site)
    store.put_steer(cell, steer)
    return steer


def _generate(lm: Any, method: Method | Prompting, data: ConceptData, steer: Any,
              store: RunStore, sampling: dict[str, Any]) -> list[tuple[int, float, int, str, str]]:  # fmt: skip
    """The cell's texts, every factor in one engine call (prompt-major: row = instruction ×
    k + factor), stored in one transaction."""
    cell = (method.name, data.name)
    if isinstance(method, Prompting):
        prompt = method.prompt or store.prompt(cell)
        assert prompt is not None  # stored before the run began
        inputs = method.inputs(prompt, data.instructions)
    else:
        inputs = list(data.instructions)
    factors = list(method.factors)
    steering = at_alphas(as_steers(steer), factors) if steer is not None else None
    out = lm.generate(inputs, steering, **sampling)
    k = len(factors) if steer is not None else 1
    rows = [(r, float(factors[r % k]), r // k, inputs[r // k], text)
            for r, text in enumerate(out.text)]  # fmt: skip
    store.put_generations(cell, rows)
    return rows


def _detect(lm: Any, data: ConceptData, methods: list[Method | Prompting],
            steers: dict[tuple[str, str], Any], site: str, store: RunStore) -> None:  # fmt: skip
    """Detection for the concept's cells not yet measured, stored (None: no one direction)."""
    if not lm.engine.capabilities.capture:
        return
    pending = [m for m in methods if not store.detected((m.name, data.name))]
    if not pending:
        return
    measured = {(r["method"], r["concept"]): r
                for r in detection_table(lm, [data], pending, steers, site)}  # fmt: skip
    rows: list[tuple[str, str, float | None, int | None]] = []
    for method in pending:
        row = measured.get((method.name, data.name))
        auroc, n = (None, None) if row is None else (float(row["auroc"]), int(row["n"]))
        rows.append((method.name, data.name, auroc, n))
    store.put_detection(rows)


def _make(method: Method, lm: Any, data: ConceptData, site: str) -> Any:
    """The method's steer for the concept, checked to be a steer at the method's site."""
    where = method.site or site
    steer = method.make(lm, data, where)
    try:
        steers = as_steers(steer)
    except SteerError as error:
        raise SteerError(f"Method {method.name!r} made {type(steer).__name__}, not a steer: "
                         f"{error}") from None  # fmt: skip
    if not steers:
        raise SteerError(f"Method {method.name!r} made no steer for concept {data.name!r}.")
    want = resolve(where, lm.sites()).name
    for made in steers:
        if resolve(made.site, lm.sites()).name != want:
            raise SteerError(f"Method {method.name!r} made a steer at {made.site!r} for concept "
                             f"{data.name!r}, and it should act at {where!r} (the benchmark's "
                             "site=, or the method's own); a method that wants its own site "
                             f"says so: sl.evals.Method(..., site={made.site!r}).")  # fmt: skip
    return steer
