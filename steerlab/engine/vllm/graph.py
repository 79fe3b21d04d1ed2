"""Steering inside vLLM's compiled graph: the plan's steers as data in static buffers.

vLLM compiles the model (torch.compile; on a GPU, CUDA graphs too) unless loaded with
``vllm_args={"enforce_eager": True}``. A hook added after that never runs, so steerlab
builds its steering into the model before vLLM compiles it: importing ``worker.py`` in a
worker process (vLLM does, for ``worker_extension_cls``) wraps
``BaseModelLoader.load_model`` (no fork of vLLM), and, when ``STEERLAB_VLLM_GRAPH`` is set
(JSON: the sites ``load(..., graph=...)`` names to build in, none by default, and the
kinds of steering they compute, ``graph_kinds=``, all of ``KINDS`` by default), every
model it builds gets:

- buffers at fixed addresses (``GraphBuffers``): per built site, a table of ``ROWS`` steers in
  ``core.ops.table``'s columns (the vector, its unit direction, each ``Form`` field), and
  per token of a forward its alpha and table row; a site's LoReFTs stacked in
  ``LOW_RANK`` columns, each owned by a table row; a count of the tokens each site steered
  (``applied``);
- a hook at each built site (any of the embedding and each block's five) that applies its
  row's ``Form`` terms where the token's alpha is not 0 (``core.ops.table.apply_terms``,
  the local compiled step's arithmetic; only the terms built in) and its own LoReFT
  columns (``core.reft.low_rank_edit``): tensors only, traced into the compiled graph,
  holding no value of any request. A kind left out is not traced, so costs nothing (the
  README's table measures both on the toy); a forward that needs it runs uncompiled.

Before each forward the worker, in the model's outer module (which vLLM does not compile),
writes that forward's rows into the buffers in place (``write``): the same per-token
layout the eager hooks use (``batch.lay_out_forward``), so positions, per-row alphas and
mixed rows mean the same. After it, ``applied`` is compared with what was written: a
site that steered fewer tokens than asked fails its rows (``SteerHookError``), so a graph
that lost its steering cannot pass unnoticed.

Conditions and monitors read inside the graph too: what they read leaves it as the
graph's outputs (``graph_reads.py``), and the worker decides a prompt condition after the
forward that read the prompt, folding the decision into the alphas it writes for the
tokens generated after it.

A forward the graph cannot hold runs uncompiled, through vLLM's own switch for that
(``ForwardContext.skip_compiled``): the model's plain forward, whose graph hooks then hand
each site to the worker's eager path (``GraphBuffers.eager``), the same code an
``enforce_eager`` engine runs. ``eager_reason`` says when: a steer or a read at a site
not built in, an operation without a table form (a top-k feature clamp), two steers on one token at one site, a gate the forward that
reads it must decide (a per-token condition; a prompt condition on a steer over that
prompt), or more than the buffers hold (``GraphFull``). Only those forwards: a prompt gate
on its prompt runs its prefill uncompiled and its decode compiled. The worker counts them
by reason (``steerlab_uncompiled``). Deciding those gates inside the graph was built and
measured: a 21-site stack of width 128 under inductor took 1929 us a call at one token
against 732 without it (248 with no reads, gates or LoReFT at all), and twice the compile
time, a tax on every forward for two rarely used kinds of gate.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Container, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from steerlab.core import reft
from steerlab.core.ops import STRENGTHS, form_of, table
from steerlab.core.ops.table import NUMBERS, WIDE, apply_terms, form_columns
from steerlab.core.reft import LoReFT, low_rank_edit
from steerlab.core.sites import Site
from steerlab.engine.vllm import graph_reads, hooks
from steerlab.engine.vllm.batch import ForwardBatch, SiteSteer
from steerlab.engine.vllm.graph_reads import GraphFull, GraphReads
from steerlab.engine.vllm.sites import layout_for

Gate = Callable[[str, SiteSteer], torch.Tensor]  # where a gated steer may act: [tokens] bool
GRAPH_ENV = "STEERLAB_VLLM_GRAPH"  # set by load_vllm while vLLM starts its workers
ROWS = 32  # distinct steers one site may read in one forward
LOW_RANK = 32  # the ranks of a site's LoReFTs in one forward, summed
# What a built site can hold (``load(..., graph_kinds=...)``; all by default): each ``Form``
# term (``add``: Add; ``proj``: Ablate, Clamp, Cap; ``feat``: a feature clamp; ``rot``:
# Rotate), ``loreft``, and ``reads`` (conditions and monitors). Each costs every forward
# at every built site, steered or not; a forward that needs one not built runs uncompiled.
KINDS = (*STRENGTHS, "loreft", "reads")
TWO_STEERS = "two steers act on one token at one site (the compiled table holds one)"


def cache_root(sites: list[str], kinds: Iterable[str] = KINDS) -> str:
    """vLLM's compile-cache root for models with graph steering at ``sites``, holding
    ``kinds``: its own folder, keyed on the code traced into the graph and on what is
    built in. vLLM keys a saved compiled model on the model's source, not on hooks added
    to it, so an artifact compiled without this steering (or with an older version of it,
    at other sites or holding other kinds) must never be found here, nor one of ours by a
    plain vLLM."""
    base = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.path.expanduser("~"), ".cache", "vllm")  # fmt: skip
    digest = hashlib.sha256()
    traced = (__file__, hooks.__file__, table.__file__, graph_reads.__file__, reft.__file__)
    for module in traced:
        digest.update(Path(module).read_bytes())
    digest.update(json.dumps([sorted(sites), sorted(kinds)]).encode())
    return os.path.join(base, f"steerlab-graph-{digest.hexdigest()[:16]}")


def built_reason(site: str) -> str:
    """Why a forward that steers or reads ``site`` runs uncompiled on a model built
    without it (``load(..., graph=...)``)."""
    return (f"{site} is not built into the compiled graph (load with graph=[{site!r}, ...] "
            "or graph='all' to build it in)")  # fmt: skip


def kinds_reason(needs: Iterable[str], kinds: Container[str], what: str) -> str | None:
    """Why ``what`` runs uncompiled on a graph built with ``kinds`` (``KINDS``), or None:
    it ``needs`` a kind not built in."""
    missing = [kind for kind in needs if kind not in kinds]
    if not missing:
        return None
    return (f"{what} needs {missing[0]!r}, which this graph is not built with (load with "
            f"graph_kinds= naming it)")  # fmt: skip


def graph_reason(op: object, gate: Any = None, on_prompt: bool = False,
                 kinds: Container[str] = KINDS) -> str | None:  # fmt: skip
    """Why a steer's forwards run uncompiled (``skip_compiled``), or None. ``gate``: its
    condition (``core.reads.Gate``) or None; ``on_prompt``: whether it acts on a prompt
    token of the forward; ``kinds``: what the graph holds (``KINDS``). Every site the vLLM
    engine steers is in the graph."""
    form = form_of(op)  # type: ignore[arg-type]
    if isinstance(op, LoReFT):
        why = kinds_reason(["loreft"], kinds, "a LoReFT")
        if why is not None:
            return why
        if op.rank > LOW_RANK:
            return f"a LoReFT of rank {op.rank} (the compiled columns hold {LOW_RANK} a site)"
    elif form is None:
        return f"{type(op).__name__} of this kind has no table form (a top-k feature clamp)"
    else:
        why = kinds_reason(form.terms, kinds, type(op).__name__)
        if why is not None:
            return why
    if gate is not None and gate.per_token:
        return "a per-token condition (read='token') gates a steer in the forward that reads it"
    if gate is not None and on_prompt:
        return "a whole-prompt condition gates a steer on the prompt it reads"
    return None


Touch = tuple[str, object, Any, np.ndarray, bool]  # site, op, gate, tokens touched, any in a prompt


def touches_reason(touches: Iterable[Touch], built: Container[str], reads: Iterable[str] = (),
                   kinds: Container[str] = KINDS) -> str | None:  # fmt: skip
    """Why a forward whose steers touch these tokens, and which reads ``reads`` (the sites
    of its conditions and monitors), must run uncompiled on a model whose graph holds the
    sites ``built`` and the ``kinds``, or None: a site not built in, reads not built in, a
    steer ``graph_reason`` names, or two steers on one token at one site (the table holds
    one). The one rule for the worker (``eager_reason``, this forward's tokens) and
    ``explain`` (the engine's ``uncompiled_reason``, a row's prompt and every token it may
    generate)."""
    for site in reads:
        if site not in built:
            return built_reason(site)
        why = kinds_reason(["reads"], kinds, "a condition or a monitor")
        if why is not None:
            return why
    count: dict[str, np.ndarray] = {}
    for site, op, gate, touched, on_prompt in touches:
        if not touched.any():
            continue
        if site not in built:
            return built_reason(site)
        why = graph_reason(op, gate, gate is not None and on_prompt, kinds)
        if why is not None:
            return why
        count[site] = count.get(site, 0) + touched
        if (count[site] > 1).any():
            return TWO_STEERS
    return None


def eager_reason(batch: ForwardBatch, built: Container[str], reads: Iterable[str] = (),
                 kinds: Container[str] = KINDS) -> str | None:  # fmt: skip
    """Why this forward must run uncompiled on a model whose graph holds ``built`` and the
    ``kinds``, or None (``touches_reason``; ``reads``: the sites this forward's conditions
    and monitors read)."""
    real = len(batch.owner)
    touches: list[Touch] = []
    for site, steers in batch.by_site.items():
        for s in steers:
            touched = s.touched.numpy()
            on_prompt = s.gate is not None and bool((touched[:real] & batch.in_prompt).any())
            touches.append((site, s.op, s.gate, touched, on_prompt))
    return touches_reason(touches, built, reads, kinds)


class GraphBuffers(nn.Module):
    """The steering data a compiled model reads, at fixed addresses (rewritten in place).

    Per site, a table of ``ROWS`` steers (``core.ops.table``'s columns: the vector, its
    unit direction, a rotation's plane axis, each ``Form`` field at alpha 1); per token,
    its alpha and its row.
    """

    alpha: torch.Tensor  # [sites, max tokens]: each token's alpha at each site (0: not steered)
    wide: torch.Tensor  # [sites, ROWS, len(WIDE), d_model]: the table's [d_model] columns
    numbers: torch.Tensor  # [sites, ROWS, len(NUMBERS)]: and its numbers
    index: torch.Tensor  # [sites, max tokens]: the table row each token reads
    applied: torch.Tensor  # [sites]: tokens each site steered in the last forward
    low_rank: torch.Tensor  # [sites, 2, LOW_RANK, d_model]: a site's LoReFTs' R, then W
    low_bias: torch.Tensor  # [sites, LOW_RANK]: and their b
    low_row: torch.Tensor  # [sites, LOW_RANK]: the table row owning each column (-1: none)

    def __init__(self, sites: list[str], max_tokens: int, d_model: int, dtype: torch.dtype,
                 device: torch.device, kinds: Iterable[str] = KINDS) -> None:  # fmt: skip
        super().__init__()
        self.sites = {name: k for k, name in enumerate(sites)}
        self.kinds = frozenset(kinds)  # what the graph computes at each site (``KINDS``)
        self.terms = tuple(t for t in STRENGTHS if t in self.kinds)
        n = len(sites)
        self.register_buffer("alpha", torch.zeros(n, max_tokens, dtype=dtype, device=device))
        self.register_buffer("index", torch.zeros(n, max_tokens, dtype=torch.long, device=device))
        self.register_buffer("applied", torch.zeros(n, dtype=torch.float32, device=device))
        # the table's columns packed in two tensors, so a token's row is two gathers
        wide, numbers = (n, ROWS, len(WIDE), d_model), (n, ROWS, len(NUMBERS))
        self.register_buffer("wide", torch.zeros(wide, dtype=dtype, device=device))
        self.register_buffer("numbers", torch.zeros(numbers, dtype=dtype, device=device))
        low = (n, 2, LOW_RANK, d_model)
        self.register_buffer("low_rank", torch.zeros(low, dtype=dtype, device=device))
        self.register_buffer("low_bias", torch.zeros(n, LOW_RANK, dtype=dtype, device=device))
        self.register_buffer("low_row", torch.full((n, LOW_RANK), -1, device=device))
        self.reads = GraphReads(sites, max_tokens, d_model, device)  # conditions, monitors
        # the forward's last site: it stores the reads (none: a graph with no steering)
        order = sorted(sites, key=lambda name: Site.parse(name).forward_order)
        self.last_site = order[-1] if order else None
        self.written: dict[int, int] = {}  # slot -> tokens the last forward asked it to steer
        self.entries: dict[int, tuple] = {}  # slot -> the (vector key, op) of its table's rows
        # the batch in the buffers now, and its gated steers' masks by steer id (``write``)
        self.last: tuple[ForwardBatch | None, dict[int, torch.Tensor]] = (None, {})
        # (layout, reads, answer) of the last ``eager_reason``: a steady decode asks once
        self.reasoned: tuple[object, frozenset[str], str | None] = (None, frozenset(), None)
        # set while a forward runs uncompiled: the worker's eager path, which ``steer`` calls
        self.eager: Callable[[str, torch.Tensor], torch.Tensor | None] | None = None

    def steer(self, site: str, act: torch.Tensor) -> torch.Tensor | None:
        """The steer at ``site`` on ``act [tokens, d]``: traced into the graph, data only.
        In a forward that runs uncompiled: the worker's eager path (never traced)."""
        if self.eager is not None:
            return self.eager(site, act)
        slot = self.sites[site]
        reading = "reads" in self.kinds
        if reading:
            self.reads.before(slot, act)
        tokens = act.shape[0]
        alpha = self.alpha[slot, :tokens].to(act.dtype)
        index = self.index[slot, :tokens]
        wide = self.wide[slot][index].to(act.dtype)  # [tokens, len(WIDE), d]
        numbers = self.numbers[slot][index].to(act.dtype)  # [tokens, len(NUMBERS)]
        c = {name: wide[:, k] for k, name in enumerate(WIDE)}
        c.update({name: numbers[:, k] for k, name in enumerate(NUMBERS)})
        for name in self.terms:
            c[name] = c[name] * alpha
        on = alpha != 0
        self.applied[slot] += on.sum().to(torch.float32)
        out = torch.where(on[:, None], apply_terms(act, c, self.terms), act)  # a LoReFT's: act
        if "loreft" in self.kinds:
            own = (self.low_row[slot][None, :] == index[:, None]) & on[:, None]  # [tokens, rank]
            R, W = self.low_rank[slot].to(act.dtype)
            out = out + alpha[:, None] * low_rank_edit(
                act, R, W, self.low_bias[slot].to(act.dtype), own
            )
        if reading:
            self.reads.after(slot, out)
            if site == self.last_site:
                self.reads.finish()
        return out

    def eager_reason(self, batch: ForwardBatch, reads: frozenset[str] = frozenset()) -> str | None:
        """Why this forward runs uncompiled on this graph (``eager_reason``), or None; the
        same as the last forward's for the same layout (``ForwardBatch.layout``: one while a
        decode is steady) and reads, when it feeds no prompt token (a gated steer's answer
        may depend on which tokens are the prompt's)."""
        layout = batch if batch.feeds_prompt else batch.layout
        if self.reasoned[0] is not layout or self.reasoned[1] != reads:
            self.reasoned = (layout, reads, eager_reason(batch, self.sites, reads, self.kinds))
        return self.reasoned[2]

    def write(self, batch: ForwardBatch | None, vectors: dict[str, torch.Tensor],
              gate: Gate | None = None) -> None:  # fmt: skip
        """This forward's steers into the buffers (``batch``: its layout; None: none), a
        gated steer's alphas where ``gate`` lets it act (its row's decision so far). A
        steady decode keeps its layout (``batch.Layouts``): while its gates give the very
        masks they gave the last forward (a prompt gate's, once decided), only the count
        restarts."""
        self.applied.zero_()
        masks = {} if batch is None else {
            id(steer): gate(site, steer)
            for site, steers in batch.by_site.items() for steer in steers
            if steer.gate is not None and gate is not None and bool(steer.touched.any())
        }  # fmt: skip
        last, kept = self.last
        if batch is not None and last is not None and batch.layout is last.layout and (
            masks.keys() == kept.keys() and all(masks[k] is kept[k] for k in masks)
        ):  # fmt: skip
            return
        self.last = (batch, masks)  # a module's setattr costs microseconds: only on a change
        for slot in self.written:
            self.alpha[slot].zero_()
        self.written = {}
        if batch is None:
            return
        for site, steers in batch.by_site.items():
            slot = self.sites[site]
            entries, alpha, index = _merged(site, steers, masks)
            if len(entries) > ROWS:
                raise GraphFull(f"more than {ROWS} distinct steers at one site in one forward")
            if entries != self.entries.get(slot):
                self._table(slot, entries, vectors)
            tokens = alpha.shape[0]
            self.alpha[slot, :tokens].copy_(alpha.to(self.alpha.dtype))
            self.index[slot, :tokens].copy_(index)
            self.written[slot] = int((alpha != 0).sum())

    def _table(self, slot: int, entries: tuple, vectors: dict[str, torch.Tensor]) -> None:
        """Rewrite ``slot``'s table rows: each entry's columns, zero where its form is silent.
        Until the whole table is written, the slot's entries are unknown: a rewrite that
        stops half way (``GraphFull``) is never taken for the last table."""
        missing = [key for key, _ in entries if key not in vectors]
        if missing:
            raise KeyError(f"vector {missing[0]} was never sent to this worker")
        self.entries.pop(slot, None)
        dtype, device = self.alpha.dtype, self.alpha.device
        self.wide[slot].zero_()
        self.numbers[slot].zero_()
        self.low_rank[slot].zero_()
        self.low_bias[slot].zero_()
        self.low_row[slot].fill_(-1)
        used = 0
        for row, (key, op) in enumerate(entries):
            if isinstance(op, LoReFT):  # its own columns; its table row stays zero (act)
                used = self._low_rank(slot, row, op, used)
                continue
            for name, value in form_columns(op, vectors[key], dtype, device).items():
                if name in WIDE:
                    self.wide[slot, row, WIDE.index(name)] = value
                else:
                    self.numbers[slot, row, NUMBERS.index(name)] = value
        self.entries[slot] = entries

    def _low_rank(self, slot: int, row: int, op: LoReFT, used: int) -> int:
        """``op``'s R, W and b into ``slot``'s LoReFT columns from ``used`` on, owned by
        table ``row``; returns the columns now used."""
        end = used + op.rank
        if end > LOW_RANK:
            raise GraphFull(f"LoReFTs of rank more than {LOW_RANK} in all at one site in one "
                            "forward")  # fmt: skip
        t = op.on(self.low_rank.device)
        self.low_rank[slot, 0, used:end] = t["R"].to(self.low_rank.dtype)
        self.low_rank[slot, 1, used:end] = t["W"].to(self.low_rank.dtype)
        self.low_bias[slot, used:end] = t["b"].to(self.low_bias.dtype)
        self.low_row[slot, used:end] = row
        return end

    def shortfall(self) -> list[str]:
        """The sites that steered fewer tokens than the last forward asked of them."""
        if not self.written:
            return []
        applied = self.applied.tolist()
        names = {k: name for name, k in self.sites.items()}
        return [names[slot] for slot, n in self.written.items() if applied[slot] < n]


_Merged = tuple[tuple, torch.Tensor, torch.Tensor]  # a site's table entries, alphas, rows


def _merged(site: str, steers: list[SiteSteer], masks: Mapping[int, torch.Tensor]) -> _Merged:
    """One site's steers as one table: every token has at most one steer at a site (a
    forward with two runs uncompiled, ``eager_reason``), so their alphas are disjoint;
    each token's row is its own steer's (a fused Add's vector by its ``index``), its alpha
    0 where its gate's mask (``masks``, by steer id) shuts."""
    entries: list[tuple[str, Any]] = []
    alpha = torch.zeros_like(steers[0].alphas)
    index = torch.zeros(alpha.shape[0], dtype=torch.long)
    for steer in steers:
        alphas = steer.alphas
        if steer.gate is not None and bool(steer.touched.any()):  # else: nothing to gate
            if id(steer) not in masks:
                raise ValueError(f"a conditioned steer at {site} with no decision to read")
            alphas = alphas * masks[id(steer)].to(alphas.device)
        offset = len(entries)
        entries += [(key, steer.op) for key in steer.vector_keys]
        on = alphas != 0
        alpha = torch.where(on, alphas, alpha)
        own = steer.index if steer.index is not None else torch.zeros_like(index)
        index = torch.where(on, own + offset, index)
    return tuple(entries), alpha, index


def install(model: nn.Module, model_type: str, sites: list[str], max_tokens: int,
            d_model: int, kinds: Iterable[str] = KINDS) -> GraphBuffers:  # fmt: skip
    """Buffers and graph hooks at ``sites`` on ``model``, computing ``kinds`` there (before
    vLLM compiles it). With no sites the buffers only mark the model as compiled: its
    graph is plain vLLM's, and every forward that steers or reads runs uncompiled."""
    param = next(model.parameters())
    buffers = GraphBuffers(sites, max_tokens, d_model, param.dtype, param.device, kinds)
    model.steerlab_graph = buffers  # a submodule: its buffers are the model's
    hooks.install(model, layout_for(model_type), sites, buffers.steer, tagged=False)
    return buffers


def built() -> tuple[list[str], list[str]] | None:
    """The sites this worker's model is to be built with and the kinds they hold
    (``GRAPH_ENV``, JSON that ``load_vllm`` sets while vLLM starts its workers), or None:
    an eager model."""
    value = os.environ.get(GRAPH_ENV)
    if value is None:
        return None
    given = json.loads(value)
    return list(given["sites"]), list(given["kinds"])


def wrap_loader() -> None:
    """Make vLLM's model loader install the graph steering when ``GRAPH_ENV`` is set."""
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    if getattr(BaseModelLoader.load_model, "_steerlab", False):
        return
    original = BaseModelLoader.load_model

    def load_model(self: Any, *args: Any, **kwargs: Any) -> nn.Module:
        model = original(self, *args, **kwargs)
        build = built()
        if build is not None:
            vllm_config = kwargs.get("vllm_config") or args[0]
            text = vllm_config.model_config.hf_config.get_text_config()
            install(model, vllm_config.model_config.hf_config.model_type, build[0],
                    vllm_config.scheduler_config.max_num_batched_tokens,
                    text.hidden_size, build[1])  # fmt: skip
        return model

    load_model._steerlab = True  # type: ignore[attr-defined]
    BaseModelLoader.load_model = load_model  # type: ignore[method-assign]
