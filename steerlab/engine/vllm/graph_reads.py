"""Conditions and monitors inside vLLM's compiled graph: what they read leaves the graph as
its outputs, never through a buffer the graph writes.

Writing an activation into a buffer from inside the graph made inductor copy the whole
buffer at every write (``graph.py``). A tensor a traced hook stores on a Python object,
though, becomes an output of the compiled graph: dynamo replays the store after the graph
runs, and an output costs only its memory. So every site computes two small reads from
buffers the worker fills before the forward (``GraphReads``), and the last site stores
them, one tensor each:

- for prompt conditions, before the site's steers: the activation, in float32, where
  ``select`` says a tap reads the site (up to ``TAPS`` sites a forward); at the end one
  product with ``weights`` gives, per row that reads its prompt in this forward (up to
  ``QUERIES``), the sum of the tokens its conditions read (``GateState.kept``) and the
  last of them: ``[TAPS, 2 * QUERIES, d]``. A site costs one elementwise pass over its
  activation a tap, which inductor fuses where it can (a product at every site cost
  ``TAPS * 2 * QUERIES * d`` whatever the token count: milliseconds a decode step at
  width 768);
- for monitors, after the site's steers: ``act @ monitor[site].T``, each token's
  projection on the unit directions of up to ``MONITORS`` monitors: ``[tokens, sites *
  MONITORS]``.

After the forward the worker hands them to the state the eager hooks feed (``reads.py``):
each condition's ``GateState.add``, each monitor's trace. A decision therefore comes
after the forward that read the prompt: compiled, a gate lets a steer act on the tokens
generated after it, and the worker folds the decision into the alphas it writes. A forward
that needs more (a per-token gate, a prompt gate on its own prompt, more reads than these
buffers hold: ``GraphFull``) runs uncompiled (``graph.eager_reason``). A forward whose
reads never came out of the graph is an error for its reading rows, never a silent gap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from steerlab.core.monitors import Monitor
from steerlab.core.ops import unit
from steerlab.core.sites import Site
from steerlab.engine.vllm.batch import ForwardBatch
from steerlab.engine.vllm.reads import RowReads, WorkerReads

QUERIES = 64  # rows one forward reads the prompt of
TAPS = 2  # sites one forward's conditions read
MONITORS = 8  # distinct monitors read at one site in one forward


class GraphFull(ValueError):
    """A forward asks for more than the compiled model's buffers hold: it runs uncompiled."""


@dataclass
class _Query:
    """One row's prompt read in this forward: its reads, its tokens ``[a, b)`` of the
    forward, which of them its conditions read, and its rows in ``weights``."""

    reads: RowReads
    span: tuple[int, int]
    keep: torch.Tensor  # [b - a] bool
    q: int


class GraphReads(nn.Module):
    """The read buffers of a compiled model, and what its last forward read."""

    # [max tokens, 2 * QUERIES]: rows' sums, then their last tokens (tokens first: a
    # slice of the first dimension is contiguous whatever its length, so the matmul's
    # layout never depends on the token count, which dynamo would then specialise)
    weights: torch.Tensor
    select: torch.Tensor  # [sites, TAPS] bool: the tap a site's sums go to
    monitor: torch.Tensor  # [sites, MONITORS, d_model]: unit directions, float32

    def __init__(self, sites: list[str], max_tokens: int, d_model: int,
                 device: torch.device) -> None:  # fmt: skip
        super().__init__()
        self.sites = {name: k for k, name in enumerate(sites)}
        order = sorted(sites, key=lambda name: Site.parse(name).forward_order)
        self.first = self.sites[order[0]] if order else -1  # the forward's first site
        n = len(sites)
        self.register_buffer("weights", torch.zeros(max_tokens, 2 * QUERIES, device=device))
        self.register_buffer("select", torch.zeros(n, TAPS, dtype=torch.bool, device=device))
        self.register_buffer("monitor", torch.zeros(n, MONITORS, d_model, device=device))
        self.out: dict[str, torch.Tensor] = {}  # what the last forward stored
        self._trace: dict[str, Any] = {}  # while a forward runs
        self.taps: dict[str, int] = {}  # site -> tap, this forward
        self.columns: dict[tuple[str, Monitor], int] = {}  # (site, monitor) -> column
        self.queries: list[_Query] = []
        self.prepared: object = None  # the layout filled in whole, reading no prompt token

    # --- inside the forward (traced) ------------------------------------------------------

    def before(self, slot: int, act: torch.Tensor) -> None:
        """Keep ``act`` (before the site's steers) where a tap reads site ``slot``."""
        if slot == self.first:  # a forward starts: nothing kept from an earlier one
            self._trace.clear()
        here = self.select[slot][:, None, None]  # [TAPS, 1, 1]
        taps = self._trace.get("taps", 0.0)
        self._trace["taps"] = torch.where(here, act.to(torch.float32)[None], taps)

    def after(self, slot: int, act: torch.Tensor) -> None:
        """Each token's projections on the monitors at site ``slot``."""
        read = act.to(torch.float32) @ self.monitor[slot].T  # [tokens, MONITORS]
        self._trace.setdefault("monitors", {})[slot] = read

    def finish(self) -> None:
        """At the forward's last site: store the forward's reads (graph outputs), the
        monitors' columns in site order (``slot * MONITORS + k``)."""
        taps = self._trace.pop("taps")  # [TAPS, tokens, d]
        weights = self.weights[: taps.shape[1]].T  # [2Q, tokens]
        self.out["taps"] = weights[None] @ taps  # [TAPS, 2Q, d]: each row's sum, then last
        reads = self._trace.pop("monitors")
        self.out["monitors"] = torch.cat([reads[slot] for slot in range(len(self.sites))], 1)

    # --- in the worker, around the forward ------------------------------------------------

    def prepare(self, batch: ForwardBatch | None, reads: WorkerReads,
                errors: dict[str, str]) -> None:  # fmt: skip
        """Fill the buffers for the rows of ``batch`` that read (None: nothing reads);
        ``GraphFull`` where they ask for more than the buffers hold. A steady decode's
        forwards (one layout, no prompt token) read the same columns: filled once."""
        if batch is not None and batch.layout is self.prepared and not batch.feeds_prompt:
            self.out.clear()
            return
        self.prepared = None
        for query in self.queries:
            self.weights[query.span[0] : query.span[1]] = 0.0
        if self.taps:  # only a tap sets ``select``
            self.select.zero_()
        for kept in (self.queries, self.taps, self.columns, self.out):  # a module's setattr
            kept.clear()  # costs microseconds: every forward empties them in place
        if batch is None or not batch.req_ids:
            return
        whole = True
        for _, row, span in reads.reading(batch):
            try:
                self._monitors(row)
                self._prompt(row, span, batch.pos[span[0] : span[1]])
            except GraphFull:
                raise
            except ValueError as err:
                errors.setdefault(row.name, str(err))
                whole = False
        if whole and not self.queries:
            self.prepared = batch.layout

    def _prompt(self, row: RowReads, span: tuple[int, int], pos: np.ndarray) -> None:
        keep = row.kept(pos)
        if keep is None:
            return
        sites = {c.site for c in row.leaves if not c.per_token}
        new = [s for s in sites if s not in self.taps]
        if len(self.queries) == QUERIES or len(self.taps) + len(new) > TAPS:
            raise GraphFull(f"prompt conditions of more than {QUERIES} rows or at more "
                            f"than {TAPS} sites in one forward")  # fmt: skip
        for site in new:
            self.taps[site] = len(self.taps)
            self.select[self.sites[site], self.taps[site]] = True
        q = len(self.queries)
        a, b = span
        self.weights[a:b, q] = keep.to(self.weights.dtype)
        self.weights[a + int(np.flatnonzero(keep.numpy())[-1]), QUERIES + q] = 1.0
        self.queries.append(_Query(row, span, keep, q))

    def _monitors(self, row: RowReads) -> None:
        for m in row.plan.monitors[0]:
            if (m.site, m) in self.columns:
                continue
            slot = self.sites[m.site]
            k = sum(site == m.site for site, _ in self.columns)
            if k == MONITORS:
                raise GraphFull(f"more than {MONITORS} monitors at one site in one forward")
            self.monitor[slot, k] = unit(m.direction.to(self.monitor.device), torch.float32)
            self.columns[(m.site, m)] = slot * MONITORS + k

    def feed(self, batch: ForwardBatch, reads: WorkerReads, errors: dict[str, str]) -> None:
        """After the forward: what it read, into each row's conditions and monitors."""
        if not self.queries and not self.columns:
            return
        if "taps" not in self.out:
            for _, row, _ in reads.reading(batch):
                errors.setdefault(row.name, "the compiled model read nothing for this row's "
                                  "conditions and monitors in a forward")  # fmt: skip
            return
        taps = self.out["taps"]
        picked = self.out["monitors"][:, list(self.columns.values())]  # [tokens, read]
        column = {key: k for k, key in enumerate(self.columns)}
        for query in self.queries:
            a, b = query.span
            for c in query.reads.leaves:
                if c.per_token:
                    continue
                tap = taps[self.taps[c.site]]
                error = query.reads.add_read(c, batch.pos[a:b], query.keep, tap[query.q],
                                             tap[QUERIES + query.q])  # fmt: skip
                if error is not None:
                    errors.setdefault(query.reads.name, error)
        for _, row, (a, b) in reads.reading(batch):
            for m in row.plan.monitors[0]:
                values = picked[a:b, column[(m.site, m)]]
                row.traces.setdefault(m.name, []).append((batch.pos[a:b], values))
