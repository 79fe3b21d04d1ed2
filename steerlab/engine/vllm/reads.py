"""Inside a vLLM worker: what a request's conditions and monitors read, token by token.

vLLM feeds a request's prompt in one forward or, with chunked prefill, in several; then one
token a step. ``RowReads`` keeps, per request, what ``engine/reads.py`` keeps per call row
in-process, in the same float32 and with the same ``core.reads`` rules:

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

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from steerlab.core.monitors import Monitor
from steerlab.core.reads import Condition, Gate, prompt_score, reported_gate
from steerlab.engine.vllm.batch import ForwardBatch, RowPlan, SiteSteer


@dataclass
class _Sum:
    """One prompt condition's running sum over a request's prompt."""

    total: torch.Tensor  # [d] float32
    count: int = 0
    next_pos: int = 0  # the first position not yet summed
    last: torch.Tensor | None = None  # [d] float32, the last prompt token's activation


@dataclass
class RowReads:
    """One request's condition sums and decisions, and its monitors' values by forward."""

    plan: RowPlan
    prompt_len: int
    sums: dict[Condition, _Sum] = field(default_factory=dict)
    decided: dict[Gate, tuple[bool, float]] = field(default_factory=dict)
    # by monitor name: (positions, values on the device) of each forward, read at the end
    traces: dict[str, list[tuple[np.ndarray, torch.Tensor]]] = field(default_factory=dict)

    def add(self, c: Condition, act: torch.Tensor, pos: np.ndarray) -> str | None:
        """Sum ``act [n, d]`` at positions ``pos [n]`` (one request's tokens in this
        forward) into ``c``'s prompt sum; returns an error, or None."""
        s = self.sums.get(c)
        if s is None:
            s = self.sums[c] = _Sum(torch.zeros(act.shape[-1], device=act.device),
                                    next_pos=self.plan.reads_from)  # fmt: skip
        keep = (pos >= s.next_pos) & (pos < self.prompt_len)
        if not keep.any():
            return None
        at = pos[keep]
        if int(at[0]) != s.next_pos or not np.array_equal(at, np.arange(at[0], at[0] + len(at))):
            return (f"the condition at {c.site} saw prompt positions {int(at[0])}.. where it "
                    f"expected {s.next_pos}: part of the prompt was not fed (a prefix-cache "
                    "hit?), so its mean would be wrong")  # fmt: skip
        wide = act[torch.from_numpy(np.flatnonzero(keep)).to(act.device)].to(torch.float32)
        s.total += wide.sum(0)
        s.count += len(at)
        s.next_pos = int(at[-1]) + 1
        if s.next_pos == self.prompt_len:
            s.last = wide[-1]
        return None

    def decision(self, gate: Gate) -> tuple[bool, float] | None:
        """``(fired, score)`` of a prompt gate once every part has read the whole prompt
        (``core.reads.prompt_score``, as the local engines score); None before."""
        if gate in self.decided:
            return self.decided[gate]
        scores = {}
        for c in gate.leaves():
            s = self.sums.get(c)
            if self.plan.reads_from >= self.prompt_len:  # nothing to read: NaN, never fires
                s = _Sum(torch.zeros(c.direction.shape[0]), next_pos=self.prompt_len)
            if s is None or s.next_pos < self.prompt_len:
                return None
            last = s.last if s.last is not None else torch.zeros_like(s.total)
            scores[c] = prompt_score(c, s.total[None], torch.tensor([float(s.count)],
                                                                    device=s.total.device),
                                     last[None])  # fmt: skip
        fired, score = gate.decide(scores)
        self.decided[gate] = bool(fired[0]), float(score[0])
        return self.decided[gate]

    def report(self) -> dict:
        """Plain data for the engine: the decision the row reports (``reported_gate``),
        whether it was made, and each monitor's ``[positions, values]``."""
        gate = reported_gate(key.when for key, _ in self.plan.steers)
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
        self.token: dict[Condition, torch.Tensor] = {}  # [real tokens] this forward's scores

    def track(self, rid: str, plan: RowPlan | None, request: Any) -> None:
        """Start reading for a request vLLM just scheduled (``request``: vLLM's own, with
        its ``num_prompt_tokens``)."""
        if plan is not None and plan.reads and rid not in self.rows:
            self.rows[rid] = RowReads(plan, int(request.num_prompt_tokens))

    def forget(self, rows: set[str]) -> None:
        for rid in [r for r, reads in self.rows.items() if reads.plan.row in rows]:
            del self.rows[rid]

    def clear(self) -> None:
        self.rows.clear()
        self.token.clear()

    def new_forward(self) -> None:
        self.token.clear()

    def _reading(self, batch: ForwardBatch) -> Iterator[tuple[int, RowReads, tuple[int, int]]]:
        """``(index, reads, (first token, end))`` of every request in the forward that reads."""
        counts = np.bincount(batch.owner, minlength=len(batch.req_ids))
        ends = np.cumsum(counts)
        for i, rid in enumerate(batch.req_ids):
            reads = self.rows.get(rid)
            if reads is not None:
                yield i, reads, (int(ends[i] - counts[i]), int(ends[i]))

    def before(self, site: str, act: torch.Tensor, batch: ForwardBatch,
               errors: dict[str, str]) -> None:  # fmt: skip
        """Read ``site``'s activation ``act [tokens, d]`` for every condition there."""
        real = len(batch.owner)
        for _, reads, (a, b) in self._reading(batch):
            for gate in reads.plan.gates:
                for c in gate.leaves():
                    if c.site != site:
                        continue
                    if c.per_token:
                        if c not in self.token:
                            self.token[c] = c.scores(act[:real])
                    elif (error := reads.add(c, act[a:b], batch.pos[a:b])) is not None:
                        errors.setdefault(reads.plan.row, error)

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
        out = torch.zeros(tokens, dtype=torch.bool)
        fired = np.zeros(len(batch.req_ids), dtype=bool)
        first = np.zeros(len(batch.req_ids), dtype=np.int64)
        touched = steer.touched[:real].numpy()
        for i, reads, (a, b) in self._reading(batch):
            if not touched[a:b].any():
                continue
            decided = reads.decision(gate)
            if decided is None:
                errors.setdefault(reads.plan.row, (
                    f"the condition gating the steer at {site} was not decided "
                    "before the steer had to act on the prompt: vLLM fed this prompt in "
                    "chunks (chunked prefill), so its whole-prompt read came too late. Use "
                    "positions='generated', or vllm_args={'enable_chunked_prefill': False}"))  # fmt: skip
                continue
            fired[i], first[i] = decided[0], reads.plan.reads_from
        out[:real] = torch.from_numpy(fired[batch.owner] & (batch.pos >= first[batch.owner]))
        return out

    def after(self, site: str, act: torch.Tensor, batch: ForwardBatch) -> None:
        """Record every monitor at ``site`` from ``act [tokens, d]`` (after its steers),
        kept on the device until the row reports: no sync in the loop."""
        values: dict[Monitor, torch.Tensor] = {}  # one product per monitor (by content)
        real = len(batch.owner)
        for _, reads, (a, b) in self._reading(batch):
            for m in reads.plan.monitors:
                if m.site != site:
                    continue
                if m not in values:
                    values[m] = m.values(act[:real])
                trace = reads.traces.setdefault(m.name, [])
                trace.append((batch.pos[a:b], values[m][a:b]))


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
