"""A call's steering as data: the one thing that crosses from the facade into an engine.

An engine compiles a call's requests once into a ``Plan``. For every distinct steer (site,
vector, positions, op and gate, ``PlanSteer``) it holds the alpha on every row as one
``[rows]`` tensor, 0 where a row does not carry it; per row, which of those steers it
carries in its own order, its monitors, and the first position its conditions read.

Every engine reads this one plan: the local hooks (``local/steering.py``), the compiled
step's table (``compiled/tables.py``) and the conditions' state (``engine/gate.py``). A
vLLM worker gets each row's plan as data (``Plan.to_data``), read back by
``plan_from_data`` with the same fields by name. A new op or a new per-row field is added
to ``core`` and here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import torch

from steerlab.core.monitors import Monitor, monitor_from_data
from steerlab.core.ops import Operation, op_tensors, tensor_fingerprint
from steerlab.core.positions import Positions
from steerlab.core.reads import Condition, Gate, gate_tensors, reported_gate
from steerlab.core.request import Request
from steerlab.core.sites import Site
from steerlab.core.steer import (
    Steer,
    SteerData,
    SteerKey,
    alpha_from_data,
    steer_data,
    steer_fingerprint,
    steer_from_data,
    steer_mark,
)


@dataclass(frozen=True, eq=False)
class PlanSteer:
    """One distinct steer of a plan, with its alpha on every row of the call.

    ``vector`` is the tensor in-process, or its content key in a vLLM worker (which holds
    the tensors by key)."""

    site: str
    vector: torch.Tensor | str  # [d_model], or its content key
    positions: Positions
    op: Operation
    gate: Gate | None
    alphas: torch.Tensor  # [rows] float32, 0 on rows that do not carry it

    @cached_property
    def place(self) -> Site:
        """The site, parsed once (the hooks attach there; the plan is ordered by it)."""
        return Site.parse(self.site)

    @property
    def key(self) -> SteerKey:
        """This steer less its alphas, as every engine groups by (``SteerKey``)."""
        return SteerKey(self.site, self.vector, self.positions, self.op, self.gate)

    @property
    def live(self) -> bool:
        """Some row steers with it (alpha 0 leaves an activation bit-identical)."""
        return bool(self.alphas.any())

    def mark(self, alpha: float) -> str:
        """``Steer.mark`` of this steer at ``alpha``: the same rule, from the same fields."""
        assert isinstance(self.vector, torch.Tensor), "a mark needs the vector itself"
        fingerprint = steer_fingerprint(self.site, self.vector, self.positions, self.op, self.gate)
        return steer_mark(fingerprint, alpha)


@dataclass(frozen=True, eq=False)
class Plan:
    """Every steer and read of one call, compiled once from its requests (``Plan.of``).

    Attributes:
        steers: the distinct steers, in forward order of their sites (a site's own in the
            order the rows first carry them), each with its ``[rows]`` alphas.
        carried: per row, the steers it carries in its order: ``(index into steers,
            alpha)``, the alpha as the row gave it (``alphas`` holds it as float32).
        monitors: per row, its monitors.
        reads_from: per row, the first position its conditions read (``Request.reads_from``).
        names: per row, steerlab's id for it where an engine needs one (vLLM's workers).
    """

    steers: tuple[PlanSteer, ...]
    carried: tuple[tuple[tuple[int, float], ...], ...]
    monitors: tuple[tuple[Monitor, ...], ...]
    reads_from: tuple[int, ...]
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # what every engine asks of a plan first, worked out once while it is built
        _ = self.gates, self.leaves, self.all_monitors

    @classmethod
    def of(cls, requests: Sequence[Request], names: Sequence[str] = ()) -> Plan:
        """The plan of a call: its requests' steers grouped by ``SteerKey``."""
        index: dict[SteerKey, int] = {}
        found: list[tuple[Steer, list[float]]] = []
        carried = []
        for r, request in enumerate(requests):
            mine = []
            for steer in request.steers:
                key = steer.key
                if key not in index:
                    index[key] = len(found)
                    found.append((steer, [0.0] * len(requests)))
                found[index[key]][1][r] = steer.alpha[0]
                mine.append((index[key], steer.alpha[0]))
            carried.append(mine)
        made = [PlanSteer(s.site, s.vector, s.positions, s.op, s.when, torch.tensor(alphas))
                for s, alphas in found]  # fmt: skip
        order = sorted(range(len(made)), key=lambda k: made[k].place.forward_order)
        moved = {old: new for new, old in enumerate(order)}
        steers = tuple(made[k] for k in order)
        return cls(steers, tuple(tuple((moved[k], a) for k, a in mine) for mine in carried),
                   tuple(r.monitors for r in requests), tuple(r.reads_from for r in requests),
                   tuple(names))  # fmt: skip

    @property
    def rows(self) -> int:
        return len(self.reads_from)

    def live(self) -> list[PlanSteer]:
        """The steers some row steers with: what is hooked in."""
        return [s for s in self.steers if s.live]

    @cached_property
    def gates(self) -> list[Gate]:
        """The distinct gates of the call's steers, alpha 0 included (their rows still
        report a decision)."""
        return list(dict.fromkeys(s.gate for s in self.steers if s.gate is not None))

    @cached_property
    def leaves(self) -> list[Condition]:
        """The distinct conditions the gates are built of."""
        return list(dict.fromkeys(c for g in self.gates for c in g.leaves()))

    @cached_property
    def all_monitors(self) -> list[Monitor]:
        """The distinct monitors of every row, in order."""
        return list(dict.fromkeys(m for row in self.monitors for m in row))

    @property
    def reads(self) -> bool:
        """Whether any row reads activations: a condition or a monitor."""
        return bool(self.gates or self.all_monitors)

    def of_row(self, r: int) -> list[tuple[PlanSteer, float]]:
        """Row ``r``'s steers with its alphas, in its own order."""
        return [(self.steers[k], alpha) for k, alpha in self.carried[r]]

    def told(self, r: int) -> list[int]:
        """Row ``r``'s steers an engine in another process is told of, by their place in
        the row: the live ones, and a gated one at alpha 0, whose decision the row still
        reports (as on the local engines)."""
        return [j for j, (k, alpha) in enumerate(self.carried[r])
                if alpha != 0 or self.steers[k].gate is not None]  # fmt: skip

    def read_sites(self, r: int) -> set[str]:
        """The sites row ``r``'s conditions and monitors read."""
        sites = {c.site for s, _ in self.of_row(r) if s.gate is not None for c in s.gate.leaves()}
        return sites | {m.site for m in self.monitors[r]}

    def reported(self, r: int) -> Gate | None:
        """The gate whose decision row ``r`` reports (``core.reads.reported_gate``)."""
        return reported_gate(self.steers[k].gate for k, _ in self.carried[r])

    def gated(self, fired: Callable[[Gate], torch.Tensor]) -> Plan:
        """This plan with each prompt-gated steer's alpha 0 on the rows whose gate did not
        fire (``fired(gate)``: ``[rows]`` bool): what a table-driven step (the compiled
        one) decodes with, after the prefill decided."""
        kept = [None if s.gate is None or s.gate.per_token else fired(s.gate).cpu()
                for s in self.steers]  # fmt: skip
        steers = tuple(s if on is None else replace(s, alphas=torch.where(on, s.alphas, 0.0))
                       for s, on in zip(self.steers, kept))  # fmt: skip
        carried = tuple(
            tuple((k, a if kept[k] is None or bool(kept[k][r]) else 0.0) for k, a in row)  # type: ignore[index]
            for r, row in enumerate(self.carried)
        )  # fmt: skip
        return replace(self, steers=steers, carried=carried)

    # --- a row's plan as data, for a worker in another process ---------------------------

    def only(self, r: int, name: str) -> Plan:
        """Row ``r`` alone, named ``name``, as a worker is told of it (``told``): its steers
        at its alphas, in its order."""
        row = self.of_row(r)
        mine = [row[j] for j in self.told(r)]
        steers = tuple(replace(s, alphas=torch.tensor([a])) for s, a in mine)
        return Plan(steers, (tuple((k, a) for k, (_, a) in enumerate(mine)),), (self.monitors[r],),
                    (self.reads_from[r],), (name,))  # fmt: skip

    def to_data(self) -> dict[str, Any]:
        """A one-row plan as plain data: every tensor by its content key (``tensors``)."""
        assert self.rows == 1 and self.names, "a plan travels one named row at a time"
        data: dict[str, Any] = {"row": self.names[0], "steers": [
            steer_data(s.site, s.vector, a, s.positions, s.op,  # type: ignore[arg-type]
                       vector_key=tensor_fingerprint(s.vector), when=s.gate)  # type: ignore[arg-type]
            for s, a in self.of_row(0)]}  # fmt: skip
        if self.monitors[0]:
            data["monitors"] = [m.to_data(tensor_fingerprint) for m in self.monitors[0]]
        if self.reads_from[0]:
            data["reads_from"] = self.reads_from[0]
        return data

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor ``to_data`` names by key: vectors, ops', gates' and monitors'."""
        out: dict[str, torch.Tensor] = {}
        for s in self.steers:
            assert isinstance(s.vector, torch.Tensor)
            out |= {tensor_fingerprint(s.vector): s.vector, **op_tensors(s.op)}
            if s.gate is not None:
                out |= gate_tensors(s.gate)
        for m in self.all_monitors:
            out[tensor_fingerprint(m.direction)] = m.direction
        return out


def plan_from_data(data: Mapping[str, Any], tensors: Mapping[str, torch.Tensor] | None = None,
                   read: MutableMapping[str, tuple[dict, SteerData]] | None = None) -> Plan:  # fmt: skip
    """THE reader of ``Plan.to_data``: a one-row plan whose vectors are content keys (an
    op's, a condition's and a monitor's tensors looked up in ``tensors``), each steer read
    by ``core.steer.steer_from_data``. ``read``: the steers read before, kept by the reader
    (a vLLM worker, for one call), so that a steer differing from one of them only by its
    alpha (a call's rows) is not read again (``_steer``)."""
    steers, carried = [], []
    for k, item in enumerate(data["steers"]):
        s = _steer(item, tensors, read)
        alpha = float(s.alpha)  # type: ignore[arg-type]
        steers.append(PlanSteer(s.site, s.vector, s.positions, s.op, s.when,  # type: ignore[arg-type]
                                torch.tensor([alpha])))  # fmt: skip
        carried.append((k, alpha))
    monitors = tuple(monitor_from_data(m, tensors or {}) for m in data.get("monitors", ()))
    return Plan(tuple(steers), (tuple(carried),), (monitors,),
                (int(data.get("reads_from", 0)),), (str(data["row"]),))  # fmt: skip


def _steer(item: Any, tensors: Mapping[str, torch.Tensor] | None,
           read: MutableMapping[str, tuple[dict, SteerData]] | None) -> SteerData:  # fmt: skip
    """``steer_from_data(item, tensors)``; with ``read``, a steer whose data less its alpha
    equals one read before comes from there with ``item``'s own alpha, checked by the same
    rule (``alpha_from_data``). Its vector and tensors are content keys, so equal data is
    an equal steer. The data is compared, not only its JSON (which writes a tuple as a
    list, where the reader refuses a tuple)."""
    alpha = item.get("alpha") if isinstance(item, dict) else None
    if read is None or isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        return steer_from_data(item, tensors)
    rest = {k: v for k, v in item.items() if k != "alpha"}
    try:
        key = json.dumps(rest, sort_keys=True)
    except (TypeError, ValueError):  # not plain data: the reader says what is wrong
        return steer_from_data(item, tensors)
    known = read.get(key)
    if known is None or known[0] != rest:
        parsed = steer_from_data(item, tensors)
        read[key] = (rest, parsed)
        return parsed
    return replace(known[1], alpha=alpha_from_data(alpha)[0])
