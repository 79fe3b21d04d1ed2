"""``StepRunner``: one batch-size and length bucket, its buffers and its compiled step."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from steerlab.core.ops import unit
from steerlab.core.sites import Site
from steerlab.engine.compiled.families import Family
from steerlab.engine.compiled.step import Spec, decode_step
from steerlab.engine.compiled.tables import StaticCache, SteerTable, slot, spec_of
from steerlab.engine.plan import Plan

_COMPILED: dict[tuple[str | None, str], Callable[..., Any]] = {}  # per process


def compiled_step(mode: str | None, backend: str = "inductor") -> Callable[..., Any]:
    """``decode_step`` compiled once per process, mode and backend; dynamo then keeps one
    graph per bucket, model and ``Spec`` (the slots and terms a batch steers), so a batch
    pays only for the terms its steers use. ``backend="aot_eager"`` traces without
    generating code.

    Without a mode (the CPU default) the generated C++ kernels run single-threaded: a decode
    step's elementwise work is tiny, and an OpenMP barrier per kernel costs more than it
    saves (matrix products still use torch's threads). There, inductor's own checks of its
    inputs' sizes, strides and alignment are off: dynamo's guards have already checked every input
    (``dynamic=False``: exact sizes and strides), and on steerlab-tiny the repeated checks
    were ~70 calls a step, ~5% of its time by profile.
    """
    key = (mode, backend)
    if key not in _COMPILED:
        options: dict[str, Any] | None = None
        if mode is None and backend == "inductor":
            options = {"cpp.threads": 1, "size_asserts": False, "alignment_asserts": False}
        _COMPILED[key] = torch.compile(decode_step, mode=mode, backend=backend, dynamic=False,
                                       fullgraph=True, options=options)  # fmt: skip
    return _COMPILED[key]


def bucket(n: int, smallest: int = 1) -> int:
    """The next power of two >= ``n`` (and >= ``smallest``): one graph serves a whole bucket.

    >>> bucket(5), bucket(30, 64)
    (8, 64)
    """
    size = smallest
    while size < n:
        size *= 2
    return size


class StepRunner:
    """Static buffers for ``batch`` rows over ``length`` positions, and the step that uses them.

    The buffers are allocated once and rewritten for every call, so their addresses stay
    put (what a CUDA graph needs).
    """

    def __init__(self, family: Family, batch: int, length: int, d_model: int,
                 dtype: torch.dtype, device: torch.device, mode: str | None,
                 backend: str = "inductor") -> None:  # fmt: skip
        self.family, self.batch, self.length, self.mode = family, batch, length, mode
        self.backend = backend
        self.cache = StaticCache(family.n_layers, batch, family.n_kv_heads, length,
                                 family.head_dim, dtype, device)  # fmt: skip
        self.table = SteerTable(1 + 5 * family.n_layers, batch, d_model, dtype, device)
        self.ids = torch.zeros(batch, dtype=torch.long, device=device)
        self.pos = torch.ones(batch, dtype=torch.long, device=device)
        self.live = torch.zeros(batch, dtype=torch.bool, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        self.read_units = torch.zeros(0, d_model, dtype=dtype, device=device)
        self.spec = Spec()
        self.compile_seconds: float | None = None
        self.compiled_specs: dict[Spec, float] = {}  # seconds the first step of each took
        if device.type == "cuda":  # CUDA graphs replay these addresses; mark them fixed
            for t in (*self.cache.tensors(), *self.table.tensors(), *self.inputs()):
                torch._dynamo.mark_static_address(t)

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.ids, self.pos, self.live, self.column

    def start(self, plan: Plan, layers: Any, mask: torch.Tensor) -> None:
        """A call's data in: its plan, and its prefilled cache (``layers`` of keys, values)."""
        self.table.fill(plan)
        monitors = plan.all_monitors
        units = [unit(m.direction, torch.float32) for m in monitors]  # normalised, then cast
        if len(units) != self.read_units.shape[0]:  # a new spec, a new graph: a new buffer
            self.read_units = torch.zeros(len(units), *self.read_units.shape[1:],
                                          dtype=self.read_units.dtype,
                                          device=self.read_units.device)  # fmt: skip
            if self.read_units.device.type == "cuda":
                torch._dynamo.mark_static_address(self.read_units)
        for k, u in enumerate(units):
            self.read_units[k].copy_(u.to(self.read_units.dtype))
        self.spec = Spec(*spec_of(plan), tuple(slot(Site.parse(m.site)) for m in monitors))
        self.cache.load(layers, mask.to(self.cache.mask.device))
        self.live.zero_()
        self.pos.fill_(1)
        self.ids.zero_()

    def step(self, ids: torch.Tensor, pos: torch.Tensor, live: torch.Tensor,
             column: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Feed ``ids`` [rows] at ``pos`` [rows] into ``column``: logits [rows, vocab] and
        the monitors' values [monitors, rows]."""
        rows = ids.shape[0]
        self.ids[:rows].copy_(ids)
        self.pos[:rows].copy_(pos)
        self.live[:rows].copy_(live)
        self.column.fill_(column)
        first = self.spec not in self.compiled_specs
        start = time.perf_counter()
        with torch.no_grad():
            logits, read = compiled_step(self.mode, self.backend)(
                self.family, self.spec, *self.inputs(), self.cache.tensors(), self.table.columns,
                self.read_units,
            )  # fmt: skip
        if first:
            self.compiled_specs[self.spec] = time.perf_counter() - start
            if self.compile_seconds is None:
                self.compile_seconds = self.compiled_specs[self.spec]
        return logits[:rows], read[:, :rows]
