"""The reads of one call: conditions decided at prefill, per-token gates, and monitors.

``CallReads`` is the local engines' adapter over the call's ``GateState`` (``engine/gate.py``,
the conditions' state every engine keeps) and its monitors, read through hooks on the
backend (the same hooks for the eager loop and the compiled step's eager prefill):

- a prompt condition (``read="mean"`` or ``"last"``) reads the activations at its site at
  every token the call feeds before its first new token; its decision is made from them
  the first time a steer asks after they changed, so a steer later in the prefill forward
  already sees it, and it holds for the rest of the call;
- a per-token condition scores each position of the forward running now;
- a monitor records ``h·v/|v|`` at its site, after the steers there: at every prompt token,
  and at the last position of each forward (the one that chooses the next token).

State is indexed by call row, never by batch row, so compaction and prefix sharing leave it
where it belongs.
"""

from __future__ import annotations

import torch

from steerlab.backends.base import Backend
from steerlab.core.monitors import Monitor
from steerlab.core.reads import Condition, Gate
from steerlab.core.request import Readout
from steerlab.core.sites import Site
from steerlab.engine.context import ForwardContext
from steerlab.engine.gate import GateState
from steerlab.engine.guard import Call
from steerlab.engine.plan import Plan


class CallReads:
    """Condition state and decisions, and monitor traces, for every row of one call."""

    def __init__(self, plan: Plan) -> None:
        self.plan, self.n = plan, plan.rows
        self.state = GateState(plan.gates, plan.leaves, plan.reads_from)
        self.monitors: list[Monitor] = plan.all_monitors
        # per monitor, per forward: (rows, pos, values [batch, seq], prefill)
        self.reads: dict[Monitor, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]]] = {
            m: [] for m in self.monitors}  # fmt: skip
        self._assembled: dict[Monitor, tuple[list[list[float]], list[list[float]]]] = {}
        self._seen: dict[Monitor, int] = {}  # forwards assembled, per monitor

    def __bool__(self) -> bool:
        return bool(self.state or self.monitors)

    # --- hooks ---------------------------------------------------------------------------

    def attach_conditions(self, backend: Backend, call: Call) -> None:
        """Hook every condition's site (before the steers: it reads what they are given)."""
        for site in dict.fromkeys(c.site for c in self.state.leaves):
            here = [c for c in self.state.leaves if c.site == site]
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
            for c in conditions:  # the prompt's reads are the prefill's; a token's, any
                if c.per_token or context.prefill:
                    self.state.update(c, act, rows[:, None].expand_as(pos), pos)
            return None

        return call.hook(read)

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
        """``(fired [rows] bool, score [rows])`` of a prompt gate, from the reads so far."""
        fired, score, _ = self.state.decided(gate)
        return fired, score

    def gate(self, gate: Gate, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Where ``gate`` lets its steer act in the forward running now, ``[batch, seq]``
        (``GateState.where``)."""
        return self.state.where(gate, rows, pos)

    def fired_steers(self, row: int) -> frozenset[str]:
        """The conditioned steers of ``row`` whose prompt gate fired, as their marks
        (``Steer.mark``: what a chat's cache key gives the positions they touched)."""
        return frozenset(
            s.mark(alpha) for s, alpha in self.plan.of_row(row)
            if s.gate is not None and not s.gate.per_token and alpha != 0
            and bool(self.decision(s.gate)[0][row])
        )  # fmt: skip

    def spread(self, k: int) -> None:
        """After a shared prefix fed only the first row of each run of ``k`` (``GateState.spread``)."""
        self.state.spread(k)

    def gated(self) -> Plan:
        """The call's plan with each prompt-gated steer's alpha 0 on rows whose gate did
        not fire: what a table-driven step (the compiled one) decodes with after prefill."""
        return self.plan.gated(lambda gate: self.decision(gate)[0])

    # --- results -------------------------------------------------------------------------

    def row(self, r: int, kept: int) -> tuple[bool | None, float | None, dict[str, Readout]]:
        """Row ``r``'s decision (of its first prompt-gated steer), its score, and its
        monitors' readouts (``kept`` new tokens)."""
        fired = score = None
        gate = self.plan.reported(r)
        if gate is not None:
            decided, scores = self.decision(gate)
            fired, score = bool(decided[r]), float(scores[r])
        readouts = {}
        for m in self.plan.monitors[r]:
            if m not in self._assembled or len(self.reads[m]) != self._seen.get(m):
                self._assembled[m], self._seen[m] = self._traces(m), len(self.reads[m])
            prompt, chosen = self._assembled[m]
            readouts[m.name] = Readout(m.site, tuple(prompt[r]), tuple(chosen[r][:kept]))
        return fired, score, readouts
