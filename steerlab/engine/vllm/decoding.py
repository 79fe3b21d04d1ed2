"""One call on vLLM: its requests added, stepped, recorded, checked and aborted.

``VLLMStream`` is what ``VLLMEngine.stream`` returns; ``_Decoding`` holds the call's rows.
The checks ask every worker what its hooks did, each one RPC that waits for the step in
flight, so they are batched (see ``_Decoding``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from steerlab.core.ops import fingerprints_kept
from steerlab.core.request import Readout, Request, TokenScore
from steerlab.core.sampling import non_finite
from steerlab.engine.plan import Plan
from steerlab.engine.progress import Progress
from steerlab.engine.state import RowStates
from steerlab.engine.vllm.params import (
    expected_tokens,
    fed_positions,
    live_steers,
    to_vllm,
)
from steerlab.engine.vllm.reads import merge_reports
from steerlab.engine.vllm.scores import lines_up, prompt_scores, token_score

if TYPE_CHECKING:
    from steerlab.engine.vllm.engine import VLLMEngine

_CALL_IDS = itertools.count(1)


class SteerHookError(RuntimeError):
    """A steered request whose hooks failed or never ran inside vLLM."""


@dataclass
class _Held:
    """A finished steered row kept back until it is checked: its last step's tokens."""

    step: int
    reason: str
    tokens: list[int]
    logprobs: list[float]
    scores: list[TokenScore]


class VLLMStream(Iterator[Progress]):
    """One call decoding on vLLM: iterate it for ``Progress``; ``add`` joins more requests
    to it while it runs (they decode in the same continuous batch, from the next step).

    >>> steps = lm.engine.stream(requests)  # needs vLLM  # doctest: +SKIP
    >>> first = next(steps); rows = steps.add(more)  # needs vLLM  # doctest: +SKIP
    """

    def __init__(self, engine: VLLMEngine, requests: list[Request], wait: float,
                 description: str) -> None:  # fmt: skip
        self.engine = engine
        self._decoding: _Decoding | None = None
        self._steps: Generator[Progress, None, None] = self._run(requests, wait, description)

    def __next__(self) -> Progress:
        return next(self._steps)

    def close(self) -> None:
        self._steps.close()

    def add(self, requests: Sequence[Request]) -> range:
        """Rows for ``requests`` in this call (indices into ``Progress.states``), checked
        first as ``stream`` checks its own. Only between steps of a call under way."""
        if self._decoding is None or self._decoding.closed:
            raise RuntimeError("Requests join a call only while it runs: after its first "
                               "step and before its last.")  # fmt: skip
        self.engine.check(requests)
        return self._decoding.add(list(requests))

    def _run(self, requests: list[Request], wait: float,
             description: str) -> Generator[Progress, None, None]:  # fmt: skip
        engine = self.engine
        with engine.exclusive(description, wait):
            decoding = self._decoding = _Decoding(engine, next(_CALL_IDS))
            failed = False  # a worker failed: which vectors it still holds is unknown
            try:
                decoding.add(requests)
                yield from decoding.run()
            except SteerHookError:
                failed = True
                engine.proven.clear()  # what failed may be a hook: prove every site again
                raise
            finally:
                decoding.closed = True
                decoding.abort_all()
                if decoding.hooked:
                    engine.rpc("steerlab_finish")
                engine.trim_vectors(everything=failed)


class _Decoding:
    """One call's requests inside vLLM: add, step, record, verify, abort.

    Each check asks every worker (one RPC, which waits for the step in flight), so checks
    are batched. A steered row is checked when it starts if it uses a site not yet proven
    (so a compiled model or a missing hook fails at the first token); every steered row is
    checked in full before it is reported finished. Finished rows wait for a check
    together: until no row is left decoding, another check is made, or ``HOLD_STEPS`` steps
    have passed. A row that fails its check fails the call. The check that finds no row
    left decoding also takes the call's hooks off (one RPC, not two); a row joined after it
    hooks its sites again.

    A site is proven for this call once a row steering it has steered tokens, and for the
    engine once a row steering it alone has (so a hook at that very site ran), until a
    call fails a check (``SteerHookError``). Rows steering only proven sites skip the check
    at their first token (each RPC waits for a step in flight; on the toy model that was
    2-5 ms a call). Their check when they finish is never skipped: a hook that stopped
    running still fails the call, but a stream may have shown some of that row's tokens
    first, as it does for a row joined to a running call.
    """

    HOLD_STEPS = 8

    def __init__(self, engine: VLLMEngine, call: int) -> None:
        self.engine, self.call = engine, call
        self.requests: list[Request] = []
        self.rows: list[str] = []  # vLLM request ids
        self.index: dict[str, int] = {}
        self.states = RowStates(engine.tokenizer, [])
        self.states.reads = _Readouts(self)
        self.read: dict[int, dict] = {}  # what the workers read on finished rows
        self.live: set[str] = set()  # rows vLLM still decodes
        self.cached: list[int] = []  # prompt tokens served from the prefix cache, per row
        self.sites: list[frozenset[str]] = []  # the sites each row steers
        self.reading: list[bool] = []  # rows with a condition or a monitor
        self.hooked: set[str] = set()  # sites hooked on the workers for this call
        self.proven = set(engine.proven)  # sites seen steering (the engine's, then this call's)
        self.held: dict[int, _Held] = {}  # rows that finished, not yet checked
        self.dropped: list[str] = []  # rows aborted unfinished, for the workers to forget
        self.closed = False

    def add(self, requests: list[Request]) -> range:
        """Send ``requests`` to vLLM as more rows of this call (checked by the caller)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        engine = self.engine
        start = len(self.rows)
        names = [f"steerlab-{self.call}-{i}" for i in range(start, start + len(requests))]
        with fingerprints_kept():  # each row's steer is hashed for its salt, data and vectors
            plan = Plan.of(requests)  # one for the rows added: rows sharing a steer share it
            told = [plan.only(i, row) for i, row in enumerate(names)]  # each as sent
            engine.send_vectors(requests, plan)
            eos = engine.eos_ids()
            sent: list[tuple[str, Any, Any]] = []  # built in full before anything changes
            for request, row, mine in zip(requests, names, told):
                vr = to_vllm(request, row, revision=engine.cache_namespace, eos_ids=eos,
                             vocab=engine.n_vocab, told=mine)  # fmt: skip
                # made for this row alone and never used again: vLLM may take it as it is
                # (its deep copy of the steers' data was a quarter of a steered add_request)
                params = SamplingParams(**vr.sampling, output_kind=RequestOutputKind.DELTA,
                                        skip_clone=True)  # fmt: skip
                sent.append((row, vr.prompt, params))
        sites = {s.site for r in requests for s in live_steers(r)}
        sites |= {site for i in range(plan.rows) for site in plan.read_sites(i)}
        # The workers hook these sites themselves, ahead of the step that first schedules
        # a request steering or reading there (``SteerWorker.steerlab_attach``); this call
        # takes them off at its end.
        self.hooked |= sites
        new = self.states.extend(requests)
        for i in new:  # a row that only scores its prompt ends when vLLM's row does
            self.states.done[i] = False
        for i, request, (row, _, _) in zip(new, requests, sent):
            self.requests.append(request)
            self.rows.append(row)
            self.index[row] = i
            self.cached.append(0)
            self.sites.append(frozenset(s.site for s in live_steers(request)))
            self.reading.append(request.reads)
        for k, (row, prompt, params) in enumerate(sent):
            try:
                with engine.client_lock:
                    engine.llm.llm_engine.add_request(row, prompt, params)
            except BaseException:  # the rows stay, cancelled, so every list stays aligned
                self._abort([r for r, _, _ in sent[:k]])
                for i in new:
                    self.states.cancel(i)
                raise
            self.live.add(row)
        return new

    def run(self) -> Iterator[Progress]:
        llm, client = self.engine.llm.llm_engine, self.engine.client_lock
        eos = self.engine.eos_ids()
        step, lengths = 0, list[int]()
        while self.live or self.held:
            with client:
                outputs = llm.step() if self.live else []
            prior = [(len(t), len(s)) for t, s in zip(self.states.tokens, self.states.scores)]
            started, finished = self._record(outputs, eos)
            self._hold(finished, prior, step)
            self._abort([r for r in self.live if self._ended(self.index[r])])
            released = self._check(started, step)
            before = lengths + [0] * (len(self.states.tokens) - len(lengths))  # rows added since
            lengths = [len(t) for t in self.states.tokens]
            if lengths == before and not finished and not released:
                continue
            yield Progress.after(step, self.states, before, self.engine.pad_id)
            step += 1
            self._abort([r for r in self.live if self._ended(self.index[r])])  # cancelled

    def _ended(self, i: int) -> bool:
        return self.states.done[i] or i in self.held

    def _record(self, outputs: list[Any], eos: set[int]) -> tuple[list[int], list[int]]:
        """Feed new tokens to the row states; returns rows started and rows finished."""
        started, finished = [], []
        for out in outputs:
            i = self.index.get(out.request_id)
            if i is None or self.rows[i] not in self.live or self._ended(i):
                continue
            if self.requests[i].sampling.prompt_logprobs is not None:
                self._score_prompt(i, out)
            completion = out.outputs[0]
            if not self.states.tokens[i] and not self.states.done[i] and completion.token_ids:
                started.append(i)
                self.cached[i] = out.num_cached_tokens or 0
            self._add_tokens(i, completion, eos)
            if out.finished:
                self.live.discard(self.rows[i])
                self.states.done[i] = True
            if self.states.done[i]:
                finished.append(i)
        return started, finished

    def _score_prompt(self, i: int, out: Any) -> None:
        """The prompt's scores, in one output or over several. vLLM scores a prompt from its
        own forward only where it reads none of it from the prefix cache (its default for
        such rows); otherwise it reports stale buffers, which fail the call."""
        request, scores = self.requests[i], self.states.prompt_scores[i]
        chunk = out.prompt_logprobs or []
        if out.num_cached_tokens or not lines_up(request.prompt, len(scores), chunk,
                                                 complete=out.finished):  # fmt: skip
            raise RuntimeError(
                f"vLLM's prompt scores for row {i} are not its own forward's: "
                f"{out.num_cached_tokens or 0} of its {len(request.prompt)} prompt tokens came "
                "from the prefix cache, or the scores do not line up with the prompt. "
                "Nothing was returned for it."
            )
        for score in prompt_scores(request.prompt, len(scores), chunk,
                                   request.sampling.prompt_logprobs or 0):  # fmt: skip
            if score is not None and not math.isfinite(score.logprob):
                raise self.engine.overflowed(non_finite(0, i, request))  # the local engine's step 0
            scores.append(score)

    def _add_tokens(self, i: int, completion: Any, eos: set[int]) -> None:
        """Row ``i``'s new tokens, each with its raw logprob (and its score, when asked).
        A row that only scores its prompt drops the one token vLLM samples for it."""
        top = self.requests[i].sampling.logprobs
        keep = self.requests[i].sampling.max_new_tokens > 0
        for j, token in enumerate(completion.token_ids):
            if self.states.done[i]:
                break
            logprobs = completion.logprobs[j] if completion.logprobs else {}
            entry = logprobs.get(token)
            if entry is not None and not math.isfinite(entry.logprob):
                # A raw logprob is finite wherever the logits are: a steer overflowed.
                raise self.engine.overflowed(non_finite(len(self.states.tokens[i]), i,
                                                        self.requests[i]))  # fmt: skip
            if not keep:
                break
            score = None if top is None or entry is None else token_score(token, logprobs, top)
            self.states.add(i, int(token), float(entry.logprob) if entry else float("nan"), eos,
                            score)  # fmt: skip

    def _hold(self, finished: list[int], prior: list[tuple[int, int]], step: int) -> None:
        """Steered rows that finished are kept back, as they stood before this step, until
        they are checked: a caller never sees them end (or their stop string) unchecked."""
        states = self.states
        for i in finished:
            if not (self.sites[i] or self.reading[i]) or states.reasons[i] == "cancelled":
                continue
            n, k = prior[i]
            self.held[i] = _Held(step, states.reasons[i], states.tokens[i][n:],
                                 states.logprobs[i][n:], states.scores[i][k:])  # fmt: skip
            del states.tokens[i][n:], states.logprobs[i][n:], states.scores[i][k:]
            states.done[i], states.reasons[i] = False, "length"

    def _check(self, started: list[int], step: int) -> list[int]:
        """Check what is due; returns the held rows now released as finished."""
        first = [i for i in started if self.sites[i] - self.proven]
        due = bool(self.held) and (
            not self.live or bool(first) or step - min(h.step for h in self.held.values())
            >= self.HOLD_STEPS
        )  # fmt: skip
        if not first and not due:
            return []
        finished = sorted(self.held) if due else []
        self._verify(first, finished, finish=due and not self.live)
        states = self.states
        for i in finished:
            held = self.held.pop(i)
            if not states.done[i]:  # not cancelled meanwhile
                states.tokens[i] += held.tokens
                states.logprobs[i] += held.logprobs
                states.scores[i] += held.scores
                states.done[i], states.reasons[i] = True, held.reason
        return finished

    def _verify(self, started: list[int], finished: list[int], finish: bool = False) -> None:
        """Ask the workers what the hooks did for steered rows that started or finished;
        ``finish``: no row is left decoding, so the workers end the call's hooks too."""
        ask = sorted({*started, *finished})
        rows = [self.rows[i] for i in ask]
        forget = [self.rows[i] for i in finished]
        forget += self.dropped  # rows aborted before they finished: the workers forget them
        self.dropped = []
        reports = self.engine.rpc("steerlab_report", rows, forget, finish)
        if finish:
            self.hooked = set()
        read = merge_reports({row: [r["reads"][row] for r in reports if row in r["reads"]]
                              for row in forget})  # fmt: skip
        for i, row in zip(ask, rows):
            # Tensor-parallel ranks of a stage each steer the same tokens: count them once.
            by_stage: dict[int, int] = {}
            for report in reports:
                stage = report["rank"][0]
                by_stage[stage] = max(by_stage.get(stage, 0), report["rows"][row][0])
            fired = sum(by_stage.values())
            errors = [r["rows"][row][1] for r in reports if r["rows"][row][1]]
            if errors:
                raise SteerHookError(f"Steering failed inside vLLM for row {i}: {errors[0]}")
            held = self.held.get(i)
            reason = held.reason if held else self.states.reasons[i]
            generated = len(self.states.tokens[i]) + (len(held.tokens) if held else 0)
            generated += reason == "eos" or self.requests[i].sampling.max_new_tokens == 0
            if i not in finished:  # just started: only the prompt has been fed
                generated = 1
            expected = expected_tokens(self.requests[i], self.cached[i], generated)
            if fired < expected:
                raise SteerHookError(
                    f"Row {i} is steered, but vLLM's hooks steered {fired} tokens where at "
                    f"least {expected} were due: the hooks did not run (was the model "
                    "compiled before they were added?). Nothing was returned for it."
                )
            if fired > 0:
                self.proven |= self.sites[i]
                if len(self.sites[i]) == 1:  # this very site's hook steered
                    self.engine.proven |= self.sites[i]
            if i in finished and self.reading[i]:
                self.read[i] = self._checked_reads(i, read.get(row), generated)

    def _checked_reads(self, i: int, read: dict | None, generated: int) -> dict:
        """Row ``i``'s reads, once they are known to be whole: a decision for its gate, and
        each monitor's value at every position fed (``generated`` tokens sampled)."""
        request = self.requests[i]
        if read is None:
            raise SteerHookError(f"Row {i} reads its activations (a condition or a monitor), "
                                 "but vLLM's workers sent nothing back for it. Nothing was "
                                 "returned for it.")  # fmt: skip
        if not read["decided"]:
            raise SteerHookError(f"Row {i} has a condition, but vLLM's workers did not decide "
                                 "it (did the condition's hook run?). Nothing was returned "
                                 "for it.")  # fmt: skip
        fed = set(fed_positions(request, 0, generated).tolist())
        for m in request.monitors:
            positions = set(read["monitors"].get(m.name, ([], []))[0])
            if not fed <= positions:
                raise SteerHookError(
                    f"Monitor {m.name!r} on row {i} read {len(positions & fed)} of the "
                    f"{len(fed)} positions vLLM fed (did its hook run?). Nothing was "
                    "returned for it."
                )  # fmt: skip
        return read

    def _abort(self, rows: list[str]) -> None:
        if rows:
            with self.engine.client_lock:
                self.engine.llm.llm_engine.abort_request(rows)
            self.live -= set(rows)
            self.dropped += [r for r in rows if self.index[r] not in self.held]

    def abort_all(self) -> None:
        self._abort(sorted(self.live))


class _Readouts:
    """A call's conditions and monitors as ``RowStates.reads`` gives them to completions:
    what the workers reported for each finished row."""

    def __init__(self, decoding: _Decoding) -> None:
        self.decoding = decoding

    def row(self, r: int, kept: int) -> tuple[bool | None, float | None, dict[str, Readout]]:
        read = self.decoding.read.get(r)
        if read is None:
            return None, None, {}
        request = self.decoding.requests[r]
        n = len(request.prompt)
        readouts = {}
        for m in request.monitors:
            positions, values = read["monitors"].get(m.name, ([], []))
            at = dict(zip(positions, values))
            readouts[m.name] = Readout(
                m.site,
                tuple(at[p] for p in range(n) if p in at),
                tuple(at[p] for p in range(n - 1, n - 1 + kept) if p in at),
            )  # fmt: skip
        return read["fired"], read["score"], readouts
