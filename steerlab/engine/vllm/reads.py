"""Inside a vLLM worker: what a request's conditions and monitors read, token by token.

vLLM feeds a request's prompt in one forward or, with chunked prefill, in several; then one
token a step. ``WorkerReads`` keeps one ``GateState`` (``engine/gate.py``, the object the
local engines keep per call) with a row for each request that reads, so a forward's prompt
reads are summed for all its requests at once; ``RowReads`` holds a request's row and its
monitors' values:

- a prompt condition (``read="mean"`` / ``"last"``) sums its site's activations over the
  prompt's tokens from ``reads_from`` on, across chunks, each position once (a preempted
  request fed again is not counted twice); it is decided when its last prompt token has
  been read, and the decision holds for the request's life;
- a per-token condition scores every token of the forward running now (``WorkerReads``);
- a monitor records ``h·v/|v|`` at its site, after the steers there, at every position fed.

A steer whose gate is not decided yet where it must act (a prompt-touching steer whose
prompt vLLM split into chunks) is an error for its row, never a silent unsteered token.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from steerlab.core.monitors import Monitor
from steerlab.core.reads import Condition, Gate
from steerlab.engine.gate import GateState
from steerlab.engine.plan import Plan
from steerlab.engine.vllm.batch import ForwardBatch, SiteSteer


@dataclass
class RowReads:
    """One request's reads: its conditions' row in the worker's ``GateState`` (its
    prompt's length known, so a decision waits for the whole prompt) and its monitors'
    values by forward."""

    plan: Plan  # the request's own, one row
    prompt_len: int
    state: GateState  # the worker's, shared by every request that reads (``WorkerReads``)
    slot: int  # this request's row in it
    # by monitor name: (positions, values on the device) of each forward, read at the end
    traces: dict[str, list[tuple[np.ndarray, torch.Tensor]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.state.seat(self.slot, self.plan.reads_from[0], self.prompt_len)
        self.leaves = self.plan.leaves  # its conditions
        self.sites = self.plan.read_sites(0)  # its conditions' and monitors' sites
        self.decisions: dict[Gate, tuple[bool, float]] = {}  # its prompt gates', once made

    @property
    def name(self) -> str:
        """steerlab's id for the request."""
        return self.plan.names[0]

    def kept(self, pos: np.ndarray) -> torch.Tensor | None:
        """Which of this forward's positions ``pos`` the request's prompt conditions read
        (the same for each: they read the same forwards), or None where they read none."""
        leaves = [c for c in self.leaves if not c.per_token]
        if not leaves or not len(pos) or int(pos.min()) >= self.prompt_len:
            return None
        at = torch.from_numpy(pos)
        rows = torch.full_like(at, self.slot)
        d = leaves[0].direction.shape[-1]
        keeps = [self.state.kept(c, rows, at, d, torch.device("cpu")).cpu() for c in leaves]
        if any(not torch.equal(k, keeps[0]) for k in keeps):
            raise ValueError("this row's prompt conditions have read different positions")
        return keeps[0] if bool(keeps[0].any()) else None

    def add_read(self, c: Condition, pos: np.ndarray, keep: torch.Tensor, total: torch.Tensor,
                 last: torch.Tensor) -> str | None:  # fmt: skip
        """Add what a compiled graph read for ``c`` at the ``keep`` positions of ``pos``:
        their activations' ``total [d]`` and the ``last [d]`` of them (``GateState.add``);
        returns an error, or None."""
        at = torch.from_numpy(pos)
        sums = total.new_zeros(self.state.n, *total.shape)
        lasts = last.new_zeros(self.state.n, *last.shape)
        sums[self.slot], lasts[self.slot] = total, last
        gap = self.state.add(c, torch.full_like(at, self.slot), at, keep, sums, lasts)
        return _gap_error(c, bool(gap[self.slot]), pos)

    def decision(self, gate: Gate) -> tuple[bool, float] | None:
        """``(fired, score)`` of a prompt gate once every part has read the whole prompt
        (``GateState.decided``, as the local engines decide); None before. Once made it
        holds for the request's life (a prompt position is read once), so it is kept."""
        if gate in self.decisions:
            return self.decisions[gate]
        fired, score, done = self.state.decided(gate)
        if not bool(done[self.slot]):
            return None
        made = self.decisions[gate] = (bool(fired[self.slot]), float(score[self.slot]))
        return made

    def report(self) -> dict:
        """Plain data for the engine: the decision the row reports (``reported_gate``),
        whether it was made, and each monitor's ``[positions, values]``."""
        gate = self.plan.reported(0)
        decided = None if gate is None else self.decision(gate)
        traces = {}
        for name, parts in self.traces.items():
            at: dict[int, float] = {}
            for positions, values in parts:  # a position fed again (a preemption) overwrites
                at.update(zip(positions.tolist(), values.tolist()))
            traces[name] = [sorted(at), [at[p] for p in sorted(at)]]
        return {
            "fired": None if decided is None else decided[0],
            "score": None if decided is None else decided[1],
            "decided": gate is None or decided is not None,
            "monitors": traces,
        }


class WorkerReads:
    """Every request's ``RowReads`` in one worker, and the per-token scores of the forward
    running now. The worker calls ``before`` at a site (ahead of its steers), ``mask`` for
    each gated steer, and ``after`` (behind them)."""

    def __init__(self) -> None:
        self.rows: dict[str, RowReads] = {}  # by vLLM request id
        # every reading request's conditions, a row each (``RowReads.slot``): a forward's
        # prompt reads are summed for all its rows at once
        self.state = GateState((), (), [0] * 8, [0] * 8)
        self.free: list[int] = []  # rows of ``state`` given back, below ``high``
        self.high = 0  # its rows ever given
        self.token: dict[Condition, torch.Tensor] = {}  # [real tokens] this forward's scores
        # ``reading``'s, for a batch layout (``ForwardBatch.layout``), and ``_at``'s for it
        self.spans: tuple[object, list] | None = None
        self.site_reads: dict[str, tuple[list, list]] = {}
        # and ``mask``'s for it: by prompt-gated steer (its id: the layout's batches hold
        # it), each token's decision and first position read, once every row has decided
        self.gated: dict[int, _Gated] = {}

    def track(self, rid: str, plan: Plan | None, request: Any) -> None:
        """Start reading for a request vLLM just scheduled (``request``: vLLM's own, with
        its ``num_prompt_tokens``)."""
        if plan is not None and plan.reads and rid not in self.rows:
            slot = self.free.pop() if self.free else self.high
            self.high = max(self.high, slot + 1)
            self.rows[rid] = RowReads(plan, int(request.num_prompt_tokens), self.state, slot)
            self.spans = None

    def forget(self, rows: set[str]) -> None:
        for rid in [r for r, reads in self.rows.items() if reads.name in rows]:
            self.free.append(self.rows.pop(rid).slot)
        self.state.drop({c for reads in self.rows.values() for c in reads.leaves})
        self.spans = None

    def clear(self) -> None:
        self.rows.clear()
        self.token.clear()
        self.state.reset()
        self.free, self.high = [], 0
        self.spans = None

    def new_forward(self) -> None:
        self.token.clear()

    def reading(self, batch: ForwardBatch) -> list[tuple[int, RowReads, tuple[int, int]]]:
        """``(index, reads, (first token, end))`` of every request in the forward that
        reads: worked out once a layout (every site asks, and a steady decode's forwards
        share one), again whenever a request starts or stops reading."""
        if self.spans is not None and self.spans[0] is batch.layout:
            return self.spans[1]
        counts = np.bincount(batch.owner, minlength=len(batch.req_ids))
        ends = np.cumsum(counts)
        spans = [(i, reads, (int(ends[i] - counts[i]), int(ends[i])))
                 for i, rid in enumerate(batch.req_ids)
                 if (reads := self.rows.get(rid)) is not None]  # fmt: skip
        self.spans, self.site_reads, self.gated = (batch.layout, spans), {}, {}
        return spans

    def _at(self, site: str, batch: ForwardBatch) -> tuple[list, list]:
        """This forward's conditions at ``site``: the distinct per-token ones, and each
        prompt one with ``(reads, (first token, end))`` of the rows that read it and feed
        prompt tokens in this forward (a decode step's token is past its prompt: nothing
        to read). Kept with ``reading``'s for forwards that feed no prompt token."""
        spans = self.reading(batch)
        fed = batch.feeds_prompt
        if fed or site not in self.site_reads:
            token: dict[Condition, None] = {}
            prompt: dict[Condition, list[tuple[RowReads, tuple[int, int]]]] = {}
            feeds = _rows_with(batch, batch.in_prompt)
            for i, reads, span in spans:
                for c in reads.leaves:
                    if c.site != site:
                        continue
                    if c.per_token:
                        token[c] = None
                    elif feeds[i]:
                        prompt.setdefault(c, []).append((reads, span))
            if fed:
                return list(token), list(prompt.items())
            self.site_reads[site] = (list(token), list(prompt.items()))
        return self.site_reads[site]

    def before(self, site: str, act: torch.Tensor, batch: ForwardBatch,
               errors: dict[str, str]) -> None:  # fmt: skip
        """Read ``site``'s activation ``act [tokens, d]`` for every condition there."""
        token, prompt = self._at(site, batch)
        real = len(batch.owner)
        for c in token:
            if c not in self.token:
                self.token[c] = c.scores(act[:real])
        for c, rows in prompt:
            self._prompt(c, rows, act, batch, errors)

    def _prompt(self, c: Condition, rows: list[tuple[RowReads, tuple[int, int]]],
                act: torch.Tensor, batch: ForwardBatch, errors: dict[str, str]) -> None:  # fmt: skip
        """Read the tokens of ``rows`` in ``act`` into prompt condition ``c``'s sums, every
        row at once (``GateState.update``, each on its own row)."""
        at = np.concatenate([np.arange(a, b) for _, (a, b) in rows])
        slots = np.concatenate([np.full(b - a, reads.slot) for reads, (a, b) in rows])
        index = torch.from_numpy(at).to(act.device)
        gap = self.state.update(c, act[index], torch.from_numpy(slots),
                                torch.from_numpy(batch.pos[at]))  # fmt: skip
        assert gap is not None  # a prompt condition's
        gaps = gap.cpu()
        for reads, (a, b) in rows:
            if (error := _gap_error(c, bool(gaps[reads.slot]), batch.pos[a:b])) is not None:
                errors.setdefault(reads.name, error)

    def mask(self, site: str, steer: SiteSteer, batch: ForwardBatch, tokens: int,
             errors: dict[str, str]) -> torch.Tensor:  # fmt: skip
        """Where ``steer`` (at ``site``) may act in this forward, by its gate: ``[tokens]``
        bool. A request whose prompt gate is not decided where the steer touches it gets an
        error (and no steer)."""
        gate = steer.gate
        assert gate is not None
        real = len(batch.owner)
        if gate.per_token:  # on the device: no sync
            where = gate.decide(self.token)[0]
            out = torch.zeros(tokens, dtype=torch.bool, device=where.device)
            out[:real] = where
            return out
        spans = self.reading(batch)
        by_token = self.gated.get(id(steer))
        if by_token is None:
            fired = np.zeros(len(batch.req_ids), dtype=bool)
            first = np.zeros(len(batch.req_ids), dtype=np.int64)
            touches = _rows_with(batch, steer.touched[:real].numpy())
            whole = True  # every row it touches decided: what holds for the layout's life
            for i, reads, _ in spans:
                if not touches[i]:
                    continue
                decided = reads.decision(gate)
                if decided is None:
                    whole = False
                    errors.setdefault(reads.name, (
                        f"the condition gating the steer at {site} was not decided "
                        "before the steer had to act on the prompt: vLLM fed this prompt in "
                        "chunks (chunked prefill), so its whole-prompt read came too late. Use "
                        "positions='generated', or vllm_args={'enable_chunked_prefill': False}"))  # fmt: skip
                    continue
                fired[i], first[i] = decided[0], reads.plan.reads_from[0]
            by_token = _Gated(fired[batch.owner], first[batch.owner])
            if whole:
                self.gated[id(steer)] = by_token
        return by_token.at(batch.pos, tokens)

    def after(self, site: str, act: torch.Tensor, batch: ForwardBatch) -> None:
        """Record every monitor at ``site`` from ``act [tokens, d]`` (after its steers),
        kept on the device until the row reports: no sync in the loop."""
        values: dict[Monitor, torch.Tensor] = {}  # one product per monitor (by content)
        real = len(batch.owner)
        for _, reads, (a, b) in self.reading(batch):
            for m in reads.plan.monitors[0]:
                if m.site != site:
                    continue
                if m not in values:
                    values[m] = m.values(act[:real])
                trace = reads.traces.setdefault(m.name, [])
                trace.append((batch.pos[a:b], values[m][a:b]))


class _Gated:
    """A prompt-gated steer's decisions over a layout's real tokens: whether each token's
    row fired, and the first position its row reads (the steer acts from there on)."""

    def __init__(self, fired: np.ndarray, first: np.ndarray) -> None:
        self.fired, self.first = fired, first
        self.past = int(first.max()) if len(first) else 0  # every row acts from here on
        self.steady: torch.Tensor | None = None  # the mask where every token is past it

    def at(self, pos: np.ndarray, tokens: int) -> torch.Tensor:
        """The ``[tokens]`` bool mask for a forward at positions ``pos`` (its real tokens'):
        made once for the forwards whose every token is past ``past`` (a steady decode's)."""
        steady = len(pos) > 0 and int(pos.min()) >= self.past
        if steady and self.steady is not None and len(self.steady) == tokens:
            return self.steady
        out = torch.zeros(tokens, dtype=torch.bool)
        where = self.fired if steady else self.fired & (pos >= self.first)
        out[: len(pos)] = torch.from_numpy(where)
        if steady:
            self.steady = out
        return out


def _gap_error(c: Condition, gap: bool, pos: np.ndarray) -> str | None:
    """The error for a row whose prompt positions ``pos`` read for ``c`` left a ``gap``."""
    if not gap:
        return None
    return (f"the condition at {c.site} saw prompt positions {pos.tolist()} that do not "
            "follow on from what it had read: part of the prompt was not fed (a prefix-cache "
            "hit?), so its mean would be wrong")  # fmt: skip


def _rows_with(batch: ForwardBatch, where: np.ndarray) -> np.ndarray:
    """Which of the forward's requests have a token ``where [real tokens]`` holds: ``[requests]``
    bool."""
    return np.bincount(batch.owner[where], minlength=len(batch.req_ids)) > 0


def merge_reports(reports: Mapping[str, list[dict]]) -> dict[str, dict]:
    """Per row, the reads of every worker's report merged: tensor-parallel ranks read the
    same values; pipeline stages each read the sites they hold."""
    out: dict[str, dict] = {}
    for row, parts in reports.items():
        merged: dict = {"fired": None, "score": None, "monitors": {},
                        "decided": all(part["decided"] for part in parts)}  # fmt: skip
        for part in parts:
            if merged["fired"] is None and part["fired"] is not None:
                merged["fired"], merged["score"] = part["fired"], part["score"]
            for name, trace in part["monitors"].items():
                merged["monitors"].setdefault(name, trace)
        out[row] = merged
    return out
