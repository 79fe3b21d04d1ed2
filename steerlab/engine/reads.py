"""The reads of one call: conditions decided at prefill, per-token gates, and monitors.

``CallReads`` holds, per call row, what a call's conditions and monitors read through hooks
on the backend (the same hooks for the eager loop and the compiled step's eager prefill):

- a prompt condition (``read="mean"`` or ``"last"``) sums the activations at its site over
  every token the call feeds before its first new token, pads excluded; its decision is
  made from them the first time a steer asks after they changed, so a steer later in the
  prefill forward already sees it, and it holds for the rest of the call;
- a per-token condition scores each position of the forward running now;
- a monitor records ``h·v/|v|`` at its site, after the steers there: at every prompt token,
  and at the last position of each forward (the one that chooses the next token).

State is indexed by call row, never by batch row, so compaction and prefix sharing leave it
where it belongs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from steerlab.backends.base import Backend
from steerlab.core.monitors import Monitor
from steerlab.core.reads import Condition, Gate, prompt_score, reported_gate
from steerlab.core.request import Readout, Request
from steerlab.core.sites import Site
from steerlab.engine.context import ForwardContext
from steerlab.engine.guard import Call


class CallReads:
    """Condition sums and decisions, and monitor traces, for every row of one call."""

    def __init__(self, requests: Sequence[Request]) -> None:
        self.n = len(requests)
        self.gates: list[Gate] = list(dict.fromkeys(
            s.when for r in requests for s in r.steers if s.when is not None))  # fmt: skip
        self.leaves: list[Condition] = list(dict.fromkeys(
            c for g in self.gates for c in g.leaves()))  # fmt: skip
        self.monitors: list[Monitor] = list(dict.fromkeys(m for r in requests for m in r.monitors))
        self.requests = list(requests)
        self.reads_from = torch.tensor([r.reads_from for r in requests])  # [rows]
        self.sums: dict[Condition, torch.Tensor] = {}  # [rows, d] float32
        self.counts: dict[Condition, torch.Tensor] = {}  # [rows]
        self.lasts: dict[Condition, torch.Tensor] = {}  # [rows, d] float32
        self.token: dict[Condition, torch.Tensor] = {}  # [batch, seq]: this forward's scores
        self.decided: dict[Gate, tuple[torch.Tensor, torch.Tensor]] = {}
        # per monitor, per forward: (rows, pos, values [batch, seq], prefill)
        self.reads: dict[Monitor, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]]] = {
            m: [] for m in self.monitors}  # fmt: skip
        self._assembled: dict[Monitor, tuple[list[list[float]], list[list[float]]]] = {}
        self._seen: dict[Monitor, int] = {}  # forwards assembled, per monitor

    def __bool__(self) -> bool:
        return bool(self.gates or self.monitors)

    # --- hooks ---------------------------------------------------------------------------

    def attach_conditions(self, backend: Backend, call: Call) -> None:
        """Hook every condition's site (before the steers: it reads what they are given)."""
        for site in dict.fromkeys(c.site for c in self.leaves):
            here = [c for c in self.leaves if c.site == site]
            backend.attach(Site.parse(site), self._reader(here, call))

    def attach_monitors(self, backend: Backend, call: Call) -> None:
        """Hook every monitor's site (after the steers: it reads what the next layer sees)."""
        for site in dict.fromkeys(m.site for m in self.monitors):
            here = [m for m in self.monitors if m.site == site]
            backend.attach(Site.parse(site), self._recorder(here, call))

    def _reader(self, conditions: list[Condition], call: Call):  # noqa: ANN202
        def read(
            act: torch.Tensor, context: ForwardContext, placed: tuple[torch.Tensor, ...]
        ) -> None:
            rows, pos, _ = placed
            batch, seq, d = act.shape
            for c in conditions:
                if c.per_token:
                    self.token[c] = c.scores(act.reshape(-1, d)).reshape(batch, seq)
                elif context.prefill:
                    self._add(c, act, rows, pos)
            return None

        return call.hook(read)

    def _add(self, c: Condition, act: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor) -> None:
        d = act.shape[-1]
        if c not in self.sums:
            self.sums[c] = torch.zeros(self.n, d, device=act.device)
            self.counts[c] = torch.zeros(self.n, device=act.device)
            self.lasts[c] = torch.zeros(self.n, d, device=act.device)
        first = self.reads_from.to(pos.device)[rows][:, None]  # [batch, 1]
        real = ((pos >= 0) & (pos >= first)).to(torch.float32)  # [batch, seq]
        wide = act.to(torch.float32)
        self.sums[c].index_add_(0, rows, (wide * real[..., None]).sum(1))
        self.counts[c].index_add_(0, rows, real.sum(1))
        self.lasts[c][rows] = wide[:, -1]  # left-padded: every row's last column is real
        self.decided.clear()

    def _recorder(self, monitors: list[Monitor], call: Call):  # noqa: ANN202
        def record(
            act: torch.Tensor, context: ForwardContext, placed: tuple[torch.Tensor, ...]
        ) -> None:
            rows, pos, _ = placed
            for m in monitors:  # kept on the device as they are: no sync in the loop
                self.reads[m].append((rows, pos, m.values(act), context.prefill))  # [b, s]
            return None

        return call.hook(record)

    def _traces(self, m: Monitor) -> tuple[list[list[float]], list[list[float]]]:
        """Per call row: the monitor's values at its prompt tokens, and at the last position
        of each forward (the one that chose the next token)."""
        prompt: list[list[float]] = [[] for _ in range(self.n)]
        chosen: list[list[float]] = [[] for _ in range(self.n)]
        for rows, pos, values, prefill in self.reads[m]:
            rows_, real, values_ = rows.tolist(), (pos >= 0).tolist(), values.cpu().tolist()
            for i, r in enumerate(rows_):
                if prefill:
                    prompt[r] += [v for v, ok in zip(values_[i], real[i]) if ok]
                chosen[r].append(values_[i][-1])
        return prompt, chosen

    def add_step(self, values: torch.Tensor) -> None:
        """A table step's monitor values, ``[monitors, rows]`` in ``self.monitors``' order,
        every call row in the batch (a static batch keeps them all): each the value at the
        position that chooses the row's next token."""
        rows = torch.arange(values.shape[1], device=values.device)
        for k, m in enumerate(self.monitors):
            self.reads[m].append((rows, rows[:, None], values[k][:, None], False))

    # --- decisions -----------------------------------------------------------------------

    def decision(self, gate: Gate) -> tuple[torch.Tensor, torch.Tensor]:
        """``(fired [rows] bool, score [rows])`` of a prompt gate, from the sums so far."""
        if gate not in self.decided:
            scores = {c: self._score(c) for c in gate.leaves()}
            self.decided[gate] = gate.decide(scores)
        return self.decided[gate]

    def _score(self, c: Condition) -> torch.Tensor:
        if c not in self.sums:  # nothing fed yet: no row fires
            return torch.full((self.n,), float("nan"))
        return prompt_score(c, self.sums[c], self.counts[c], self.lasts[c])

    def gate(self, gate: Gate, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Where ``gate`` lets its steer act in the forward running now, ``[batch, seq]``:
        per position for a per-token gate, per row for a prompt gate (never before a row's
        ``reads_from``)."""
        if gate.per_token:  # a function of this forward's activations alone
            fired, _ = gate.decide(self.token)
            return fired
        first = self.reads_from.to(pos.device)[rows][:, None]  # [batch, 1]
        fired, _ = self.decision(gate)
        return fired.to(rows.device)[rows][:, None] & (pos >= first)

    def fired_steers(self, row: int) -> frozenset[str]:
        """The conditioned steers of ``row`` whose prompt gate fired, as ``fingerprint@alpha``
        (the marks a chat's cache key gives the positions they touched)."""
        return frozenset(
            f"{s.fingerprint()}@{s.alpha!r}" for s in self.requests[row].steers
            if s.when is not None and not s.when.per_token and s.alpha != 0
            and bool(self.decision(s.when)[0][row])
        )  # fmt: skip

    def spread(self, k: int) -> None:
        """After a shared prefix fed only the first row of each run of ``k``: every row of a
        run takes its first row's sums (the rows' own last tokens follow)."""
        leaders = torch.arange(self.n) // k * k
        for c in self.sums:
            at = leaders.to(self.sums[c].device)
            self.sums[c], self.counts[c] = self.sums[c][at], self.counts[c][at]
            self.lasts[c] = self.lasts[c][at]
        self.decided.clear()

    def gated(self, requests: Sequence[Request]) -> list[Request]:
        """The requests with each prompt-gated steer's alpha set to 0 on rows whose gate did
        not fire: what a table-driven step (the compiled one) decodes with after prefill."""
        out = []
        for r, request in enumerate(requests):
            steers = tuple(
                s if s.when is None or bool(self.decision(s.when)[0][r]) else replace(s, alpha=0.0)
                for s in request.steers
            )  # fmt: skip
            out.append(replace(request, steers=steers))
        return out

    # --- results -------------------------------------------------------------------------

    def row(self, r: int, kept: int) -> tuple[bool | None, float | None, dict[str, Readout]]:
        """Row ``r``'s decision (of its first prompt-gated steer), its score, and its
        monitors' readouts (``kept`` new tokens)."""
        fired = score = None
        gate = reported_gate(s.when for s in self.requests[r].steers)
        if gate is not None:
            decided, scores = self.decision(gate)
            fired, score = bool(decided[r]), float(scores[r])
        readouts = {}
        for m in self.requests[r].monitors:
            if m not in self._assembled or len(self.reads[m]) != self._seen.get(m):
                self._assembled[m], self._seen[m] = self._traces(m), len(self.reads[m])
            prompt, chosen = self._assembled[m]
            readouts[m.name] = Readout(m.site, tuple(prompt[r]), tuple(chosen[r][:kept]))
        return fired, score, readouts
