"""The scheduler: one engine thread decodes concurrent callers' requests together.

Every caller that shares a model through it gets the same scheduling: the server's HTTP
clients, a notebook cell and the panel's timer alike (``Scheduler.run`` blocks for one
caller in-process). Requests that arrive within ``window_s`` of the first waiting one (up to
``max_rows`` rows) decode as one mixed batch. Where callers announce their jobs before
submitting them (``announced=True``: the server does, as each request starts to arrive),
the window closes as soon as nothing is queued and nothing announced is on its way, while
the batches come one job at a time: a client that sends one request at a time never waits
it out, and concurrent clients, whose next requests trickle in as their answers are read,
still fill their batches. A batch decodes through
``lm.engine.stream``: each row carries its own steers and sampling, and its random stream
depends only on its own request, so a row's tokens equal its solo run. Rows that finish
leave the batch; a job whose rows are all done is answered at once. A cancelled job (its
client went away) has its rows ended between steps. On an engine whose stream takes more
requests while it runs (vLLM's continuous batch), jobs that arrive meanwhile join the
running batch between steps instead of waiting for it.

A failure inside a batch (NaN logits from one request's steer, say) fails that request
alone: the unanswered jobs of the batch are retried, and streamed text already
sent is not sent again (a rerun decodes the same tokens). Failing batches are split in
halves until the failing request is alone. Jobs with different keys (the server's
amplification betas) decode in separate batches, one per key, each on ``engine_for(key)``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from steerlab.core.request import Completion, Request, TokenScore
from steerlab.engine.protocol import Engine
from steerlab.engine.state import RowStates, find_stop

log = logging.getLogger("steerlab.scheduler")


@dataclass
class Delta:
    """New output of one row of a streaming job.

    ``tokens`` are those whose text lies wholly within the text streamed so far (a row's
    tokens then join to its completion's, a stop string's left out). ``scores`` (where the
    row's sampling asks for logprobs) are theirs, plus the EOS token's that ended the row;
    ``prompt_scores`` (where it scores the prompt) come once, on the row's first delta.
    """

    step: int
    row: int
    text: str
    tokens: list[int]
    logprobs: list[float]
    done: bool = False
    reason: str = "length"
    scores: list[TokenScore] = field(default_factory=list)
    prompt_scores: list[TokenScore | None] = field(default_factory=list)


@dataclass
class Done:
    completions: list[Completion]


@dataclass
class Failed:
    error: Exception


Event = Delta | Done | Failed


class EngineStopped(RuntimeError):
    """The engine thread has died: nothing it held, or is given, will be decoded."""


@dataclass(eq=False)
class Job:
    """One caller's rows, and where its events go (``post`` must be thread-safe).

    ``key`` picks the engine (jobs with different keys never share a batch).
    """

    requests: list[Request]
    key: Hashable
    post: Callable[[Event], None]
    stream: bool = False
    cancelled: bool = False
    finished: bool = False
    emitted: list[str] = field(default_factory=list)  # per row: text already streamed
    sent: list[int] = field(default_factory=list)  # per row: tokens already streamed
    opened: list[bool] = field(default_factory=list)  # per row: a delta was streamed
    closed: list[bool] = field(default_factory=list)  # per row: its end was streamed

    def __post_init__(self) -> None:
        self.emitted = [""] * len(self.requests)
        self.sent = [0] * len(self.requests)
        self.opened = [False] * len(self.requests)
        self.closed = [False] * len(self.requests)

    def answer(self, event: Done | Failed) -> None:
        self.finished = True
        self.post(event)


class Scheduler:
    """The engine thread and its queue. ``submit`` and ``run`` are safe from any thread.

    Args:
        engine_for: the engine that decodes jobs with a given key (``lambda _: lm.engine``
            for one model).
        window_s: how long the first waiting job waits for others to share its batch.
        announced: callers ``expect`` each job before they submit it; the window then
            closes early when nothing is queued or expected and the last batch held one
            job.
        max_rows: the most rows one batch decodes.
        lock_wait: how long a batch queues behind another call on the same model.

    >>> from steerlab.core.request import Sampling
    >>> scheduler = Scheduler(lambda _: lm.engine, window_s=0.005).start()
    >>> ids = tuple(lm.tokenizer.encode("Once upon a time"))
    >>> [done] = scheduler.run([Request(ids, sampling=Sampling(max_new_tokens=5))])  # any thread
    >>> done.text
    ', there was a little'
    >>> scheduler.stop()
    """

    def __init__(self, engine_for: Callable[[Any], Engine], *, window_s: float = 0.005,
                 max_rows: int = 64, lock_wait: float = 60.0,
                 announced: bool = False) -> None:  # fmt: skip
        if not 0 <= window_s <= threading.TIMEOUT_MAX:  # NaN too: the queue would wait for good
            raise ValueError(f"window_s must be a number of seconds from 0 to "
                             f"{threading.TIMEOUT_MAX:g}; got {window_s!r}.")  # fmt: skip
        self.engine_for, self.window_s, self.max_rows = engine_for, window_s, max_rows
        self.lock_wait = lock_wait  # queue this long behind another call on the same model
        self.announced = announced
        self._expected = 0  # jobs announced (``expect``) and not yet submitted
        self._last_jobs = 1  # jobs in the last batch: 1 for a client alone, so far
        self.join_running = True  # admit jobs into a running call where the engine can
        self._stopping = False  # stop() was called: admit nothing more
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._held: deque[Job] = deque()  # taken from the queue but over the batch's cap
        self._thread = threading.Thread(target=self._loop, name="steerlab-engine", daemon=True)
        self.batches = 0  # batches decoded so far, for /health and tests
        self.cancelled = 0  # jobs whose rows were ended early because their client went away
        self.failure: EngineStopped | None = None  # set when the engine thread dies
        self._live: set[Job] = set()  # submitted, not yet answered: failed if the thread dies
        self._lock = threading.Lock()  # orders submit against the thread's death

    def start(self) -> Scheduler:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def expect(self) -> None:
        """Announce a job that is on its way: the batching window waits for it."""
        with self._lock:
            self._expected += 1

    def unexpect(self) -> None:
        """Withdraw an announced job that will not come (its request failed first)."""
        with self._lock:
            self._expected = max(self._expected - 1, 0)

    def submit(self, job: Job, expected: bool = False) -> None:
        """Queue ``job`` (``expected``: one announced with ``expect``); once the engine thread
        has died, fail it at once (``EngineStopped``)."""
        with self._lock:
            if expected:  # with the put, so the window never sees it neither queued nor expected
                self._expected = max(self._expected - 1, 0)
            if self.failure is None:
                self._live.add(job)
                self._queue.put(job)
                return
        job.answer(Failed(self.failure))

    @property
    def running(self) -> bool:
        """Whether the engine thread is up and decoding what it is given."""
        return self.failure is None and self._thread.is_alive()

    def pending(self) -> int:
        return self._queue.qsize() + len(self._held)

    def run(self, requests: Sequence[Request], key: Hashable = None,
            timeout: float | None = None) -> list[Completion]:  # fmt: skip
        """Decode ``requests`` as one caller among the others; blocks until they are done.

        Raises:
            Exception: the error the job failed with (a bad request, NaN logits, ...).
            TimeoutError: nothing came back within ``timeout`` seconds (the job is dropped).
        """
        done = threading.Event()
        answer: list[Event] = []

        def post(event: Event) -> None:
            if not isinstance(event, Delta):
                answer.append(event)
                done.set()

        job = Job(list(requests), key, post)
        self.submit(job)
        if not done.wait(timeout):
            job.cancelled = True
            raise TimeoutError(f"The scheduler did not answer within {timeout} s.")
        (event,) = answer
        if isinstance(event, Failed):
            raise event.error
        assert isinstance(event, Done)
        return event.completions

    def _loop(self) -> None:
        """The engine thread. Should anything escape it, every job waiting on it, and every
        job submitted after, fails with ``EngineStopped`` instead of waiting for good."""
        try:
            self._serve()
        except BaseException as error:
            log.exception("the engine thread stopped")
            stopped = EngineStopped(f"The engine thread stopped ({type(error).__name__}: "
                                    f"{error}); it decodes nothing more. Restart it.")  # fmt: skip
            with self._lock:
                self.failure, waiting, self._live = stopped, self._live, set()
            for job in waiting:
                if not job.finished:
                    job.answer(Failed(stopped))

    def _serve(self) -> None:
        while True:
            with self._lock:  # forget the jobs answered since the last batch
                self._live = {j for j in self._live if not j.finished}
            jobs = self._collect()
            if jobs is None:
                return
            for key in dict.fromkeys(j.key for j in jobs):
                group = [j for j in jobs if j.key == key]
                engine = None
                try:
                    engine = self.engine_for(key)
                    self._run(engine, group)
                except Exception as error:  # never let the engine thread die
                    for job in group:
                        if not job.finished:
                            job.answer(Failed(error))
                if engine is not None:
                    self._check_hooks(engine)
            for job in jobs:  # cancelled before their batch started
                if not job.finished:
                    self._drop(job)

    def _collect(self) -> list[Job] | None:
        """The next batch: the first waiting job, and those arriving within the window."""
        first = self._held.popleft() if self._held else self._queue.get()
        if first is None:
            return None
        jobs, rows = [first], len(first.requests)
        deadline = time.monotonic() + self.window_s
        while rows < self.max_rows:
            if self._nothing_coming():
                break  # waiting would only delay this batch
            try:
                job = self._held.popleft() if self._held else self._queue.get(
                    timeout=max(deadline - time.monotonic(), 0))  # fmt: skip
            except queue.Empty:
                break
            if job is None:
                self._queue.put(None)  # stop after this batch
                break
            if rows + len(job.requests) > self.max_rows:
                self._held.appendleft(job)
                break
            jobs.append(job)
            rows += len(job.requests)
        self._last_jobs = len(jobs)
        return jobs

    def _nothing_coming(self) -> bool:
        """Where callers announce jobs: nothing held, queued or announced, after a batch of
        one job (a batch of several: clients side by side, worth the window)."""
        with self._lock:
            return (self.announced and self._last_jobs <= 1 and not self._held
                    and self._queue.empty() and self._expected == 0)  # fmt: skip

    def _run(self, engine: Engine, jobs: list[Job]) -> None:
        """Decode ``jobs`` as one batch; on failure, split the unanswered jobs in halves and
        retry each half, so one failing request costs about log2(jobs) extra batches."""
        for job in jobs:
            if job.cancelled and not job.finished:
                self._drop(job)
        jobs = [j for j in jobs if not j.finished]
        if not jobs:
            return
        try:
            self._decode(engine, jobs)
        except Exception as error:
            if len(jobs) == 1:
                jobs[0].answer(Failed(error))
                return
            log.info("a batch of %d jobs failed (%s); retrying in halves", len(jobs), error)
            left = [j for j in jobs if not j.finished]
            self._run(engine, left[: len(left) // 2])
            self._run(engine, left[len(left) // 2 :])

    def _decode(self, engine: Engine, jobs: list[Job]) -> None:
        requests = [r for job in jobs for r in job.requests]
        spans, start = [], 0
        for job in jobs:
            spans.append((job, range(start, start + len(job.requests))))
            start += len(job.requests)
        self.batches += 1
        steps = engine.stream(requests, wait=self.lock_wait,
                              description=f"scheduled batch of {len(requests)} rows")  # fmt: skip
        last: tuple[Job, Done] | None = None  # answered once the model is free again
        try:
            for progress in steps:
                states = progress.states
                for job, rows in spans:
                    if job.finished:
                        continue
                    if job.cancelled:
                        for row in rows:
                            states.cancel(row)  # the row leaves the batch
                        self._drop(job)
                        continue
                    if job.stream:
                        _emit(job, rows, states, progress.index)
                    if all(states.done[r] for r in rows):
                        done = Done([states.completion(r) for r in rows])
                        if all(j.finished for j in jobs if j is not job):
                            last = (job, done)
                            break
                        job.answer(done)
                if last is not None:
                    break
                if self.join_running and engine.capabilities.join:
                    self._admit(steps, jobs, spans, progress.states)
        finally:
            steps.close()  # type: ignore[attr-defined]
        if last is not None:  # after close: a client may use the model the moment it hears
            last[0].answer(last[1])

    def _admit(self, steps: Any, jobs: list[Job], spans: list[tuple[Job, range]],
               states: RowStates) -> None:  # fmt: skip
        """Join waiting jobs to a running call on an engine that takes them (vLLM's
        continuous batch), up to ``max_rows`` live rows. A job the engine refuses fails
        alone; a job with another key waits for its own batch."""
        live = sum(not d for d in states.done)
        while not self._stopping and (self._held or not self._queue.empty()):
            job = self._held.popleft() if self._held else self._queue.get_nowait()
            if job is None:
                self._stopping = True
                self._queue.put(None)  # stop once this batch is done
                return
            if job.key != jobs[0].key or live + len(job.requests) > self.max_rows:
                self._held.appendleft(job)
                return
            if job.cancelled:
                self._drop(job)
                continue
            try:
                rows = steps.add(job.requests)
            except Exception as error:
                job.answer(Failed(error))
                continue
            jobs.append(job)
            spans.append((job, rows))
            live += len(job.requests)

    def _drop(self, job: Job) -> None:
        """A job whose client went away: nobody to answer, its rows end now."""
        job.finished = True
        self.cancelled += 1

    def _check_hooks(self, engine: Engine) -> None:
        """A second line behind the engine's own ``finally``: hooks left after a batch go.
        Hooks of a call another thread is running on the same model are that call's own, so
        the engine sweeps only when no call holds the model (``Engine.sweep_hooks``)."""
        try:
            left = engine.sweep_hooks()
            if left:
                log.warning("%d steerlab hooks were left after a batch; removed them", left)
        except Exception:  # never let the engine thread die
            log.exception("checking for hooks left after a batch failed")


def _emit(job: Job, rows: range, states: RowStates, step: int) -> None:
    """Post each row's new text, minus what might yet change, and the tokens within it."""
    for k, row in enumerate(rows):
        done = states.done[row]
        start, length = job.sent[k], len(states.tokens[row])
        if done:
            text, upto = states.text(row), states.kept(row)
        else:  # one decode per row and step: every token is within text that has settled
            decoded = states.decoded(row)
            text = _settled(decoded, job.requests[k].sampling.stop, states.stop_floor(row))
            upto = length if text == decoded else states.within(row, text, length, start)
        grown = text[len(job.emitted[k]) :] if text.startswith(job.emitted[k]) else ""
        if grown or upto > start or (done and not job.closed[k]):
            scores = (states.scores_kept(row, upto) if done else states.scores[row][:upto])[start:]
            prompt = [] if job.opened[k] else list(states.prompt_scores[row])
            job.post(Delta(step, k, grown, states.tokens[row][start:upto],
                           states.logprobs[row][start:upto], done, states.reasons[row], scores,
                           prompt))  # fmt: skip
            job.emitted[k] += grown
            job.sent[k], job.opened[k], job.closed[k] = upto, True, done


def _settled(text: str, stops: tuple[str, ...], floor: int = 0) -> str:
    """``text`` without a tail that may still change (a partial character or stop string),
    and never past a whole stop string (one that ends after ``floor``, as ``find_stop``)."""
    at = find_stop(text, stops, floor)
    if at is not None:
        return text[:at]
    cut = len(text.rstrip("\ufffd"))
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                cut = min(cut, len(text) - k)
                break
    return text[:cut]
