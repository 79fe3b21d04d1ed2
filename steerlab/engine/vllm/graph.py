"""Steering inside vLLM's compiled graph: the plan's steers as data in static buffers.

With ``vllm_args={"enforce_eager": False}`` vLLM compiles the model (torch.compile; on a
GPU, CUDA graphs too). A hook added after that never runs, so steerlab builds its steering
into the model before vLLM compiles it: importing ``worker.py`` in a worker process (vLLM
does, for ``worker_extension_cls``) wraps ``BaseModelLoader.load_model`` (no fork of vLLM),
and, when ``STEERLAB_VLLM_GRAPH`` is set, every model it builds gets:

- buffers at fixed addresses: per site, a table of vectors (``ROWS`` rows), and per token
  of a forward its alpha and the table row it reads (``alpha``, ``index``), and a count of
  the tokens each site steered (``applied``);
- a hook at every graph site (``GRAPH_KINDS`` of every block, and the embedding) that
  computes ``act + alpha * table[index]`` where alpha is not 0: tensors only, traced into
  the compiled graph, holding no value of any request.

Before each forward the worker, in the model's outer module (which vLLM does not compile),
writes that forward's rows into the buffers in place (``write``): the same per-token
layout the eager hooks use (``batch.lay_out_forward``), so positions, per-row alphas and
mixed rows mean the same. After it, ``applied`` is compared with what was written: a
site that steered fewer tokens than asked fails its rows (``SteerHookError``), so a graph
that lost its steering cannot pass unnoticed.

Compiled, steerlab applies ``Add`` only, ungated, one steer per site and row, at the sites
above; the engine refuses anything else before a request is sent, and says why.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from steerlab.core.ops import Add
from steerlab.core.sites import EMBED, Site
from steerlab.engine.vllm import hooks
from steerlab.engine.vllm.batch import ForwardBatch
from steerlab.engine.vllm.sites import layout_for

GRAPH_ENV = "STEERLAB_VLLM_GRAPH"  # set by load_vllm while vLLM starts its workers
GRAPH_KINDS = ("hook_resid_pre", "hook_attn_out", "hook_mlp_out", "hook_resid_post")
ROWS = 32  # distinct vectors one site may read in one forward


def cache_root() -> str:
    """vLLM's compile-cache root for models with graph steering: its own folder, keyed on
    the code traced into the graph. vLLM keys a saved compiled model on the model's source,
    not on hooks added to it, so an artifact compiled without this steering (or with an
    older version of it) must never be found here, nor one of ours by a plain vLLM."""
    base = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.path.expanduser("~"), ".cache", "vllm")  # fmt: skip
    digest = hashlib.sha256()
    for module in (__file__, hooks.__file__):
        digest.update(Path(module).read_bytes())
    return os.path.join(base, f"steerlab-graph-{digest.hexdigest()[:16]}")


def graph_sites(n_layers: int) -> list[str]:
    """The sites the compiled model steers at, in forward order."""
    return [EMBED] + [f"blocks.{layer}.{kind}" for layer in range(n_layers)
                      for kind in GRAPH_KINDS]  # fmt: skip


def graph_reason(site: str, op: object, gated: bool) -> str | None:
    """Why a steer cannot run inside the compiled graph, or None."""
    if type(op) is not Add:  # a subclass of Add may compute something else
        return (f"{type(op).__name__} is applied eagerly only: compiled, steerlab's vLLM "
                "engine applies Add")  # fmt: skip
    if gated:
        return "a condition (when=) is decided eagerly only"
    if Site.parse(site).kind not in (EMBED, *GRAPH_KINDS):
        return f"{site} is steered eagerly only (compiled: the embedding, {', '.join(GRAPH_KINDS)})"
    return None


class GraphBuffers(nn.Module):
    """The steering data a compiled model reads, at fixed addresses (rewritten in place)."""

    alpha: torch.Tensor  # [sites, max tokens]: each token's alpha at each site (0: not steered)
    index: torch.Tensor  # [sites, max tokens]: the table row each token reads
    table: torch.Tensor  # [sites, ROWS, d_model]: the vectors each site reads this forward
    applied: torch.Tensor  # [sites]: tokens each site steered in the last forward

    def __init__(self, sites: list[str], max_tokens: int, d_model: int, dtype: torch.dtype,
                 device: torch.device) -> None:  # fmt: skip
        super().__init__()
        self.sites = {name: k for k, name in enumerate(sites)}
        n = len(sites)
        self.register_buffer("alpha", torch.zeros(n, max_tokens, dtype=dtype, device=device))
        self.register_buffer("index", torch.zeros(n, max_tokens, dtype=torch.long, device=device))
        self.register_buffer("table", torch.zeros(n, ROWS, d_model, dtype=dtype, device=device))
        self.register_buffer("applied", torch.zeros(n, dtype=torch.float32, device=device))
        self.written: dict[int, int] = {}  # slot -> tokens the last forward asked it to steer
        self.keys: dict[int, tuple[str, ...]] = {}  # slot -> the vector keys in its table
        self.last: ForwardBatch | None = None  # the layout in the buffers now

    def steer(self, site: str, act: torch.Tensor) -> torch.Tensor:
        """The steer at ``site`` on ``act [tokens, d]``: traced into the graph, data only."""
        slot = self.sites[site]
        tokens = act.shape[0]
        alpha = self.alpha[slot, :tokens].to(act.dtype)
        vector = self.table[slot][self.index[slot, :tokens]].to(act.dtype)  # [tokens, d]
        on = alpha != 0
        self.applied[slot] += on.sum().to(torch.float32)
        return torch.where(on[:, None], act + alpha[:, None] * vector, act)

    def write(self, batch: ForwardBatch | None, vectors: dict[str, torch.Tensor]) -> None:
        """This forward's steers into the buffers (``batch``: its layout; None: none). A
        steady decode keeps its layout (``batch.Layouts``): then only the count restarts."""
        self.applied.zero_()
        if batch is not None and batch is self.last:
            return
        self.last = batch
        for slot in self.written:
            self.alpha[slot].zero_()
        self.written = {}
        if batch is None:
            return
        for site, steers in batch.by_site.items():
            slot = self.sites[site]
            keys, alpha, index = self._merged(steers)
            if len(keys) > ROWS:
                raise ValueError(f"{len(keys)} distinct vectors at {site} in one forward; the "
                                 f"compiled table holds {ROWS}")  # fmt: skip
            if keys != self.keys.get(slot):
                stacked = torch.stack([vectors[k] for k in keys])
                self.table[slot, : len(keys)].copy_(stacked.to(self.table.dtype))
                self.keys[slot] = keys
            tokens = alpha.shape[0]
            self.alpha[slot, :tokens].copy_(alpha.to(self.alpha.dtype))
            self.index[slot, :tokens].copy_(index)
            self.written[slot] = int((alpha != 0).sum())

    @staticmethod
    def _merged(steers: list[Any]) -> tuple[tuple[str, ...], torch.Tensor, torch.Tensor]:
        """One site's fused Adds (one per positions rule) as one: every token has at most
        one steer at a site (the engine refused two on a row), so their alphas are
        disjoint; each token's row is its own steer's vector."""
        keys: list[str] = []
        alpha = torch.zeros_like(steers[0].alphas)
        index = torch.zeros(alpha.shape[0], dtype=torch.long)
        for steer in steers:
            offset = len(keys)
            keys += steer.vector_keys
            on = steer.alphas != 0
            alpha = torch.where(on, steer.alphas, alpha)
            own = steer.index if steer.index is not None else torch.zeros_like(index)
            index = torch.where(on, own + offset, index)
        return tuple(keys), alpha, index

    def shortfall(self) -> list[str]:
        """The sites that steered fewer tokens than the last forward asked of them."""
        if not self.written:
            return []
        applied = self.applied.tolist()
        names = {k: name for name, k in self.sites.items()}
        return [names[slot] for slot, n in self.written.items() if applied[slot] < n]


def install(model: nn.Module, model_type: str, n_layers: int, max_tokens: int,
            d_model: int) -> GraphBuffers:  # fmt: skip
    """Buffers and graph hooks on ``model`` (before vLLM compiles it)."""
    param = next(model.parameters())
    sites = graph_sites(n_layers)
    buffers = GraphBuffers(sites, max_tokens, d_model, param.dtype, param.device)
    model.steerlab_graph = buffers  # a submodule: its buffers are the model's
    hooks.install(model, layout_for(model_type), sites, buffers.steer, tagged=False)
    return buffers


def wrap_loader() -> None:
    """Make vLLM's model loader install the graph steering when ``GRAPH_ENV`` is set."""
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    if getattr(BaseModelLoader.load_model, "_steerlab", False):
        return
    original = BaseModelLoader.load_model

    def load_model(self: Any, *args: Any, **kwargs: Any) -> nn.Module:
        model = original(self, *args, **kwargs)
        if os.environ.get(GRAPH_ENV):
            vllm_config = kwargs.get("vllm_config") or args[0]
            text = vllm_config.model_config.hf_config.get_text_config()
            install(model, vllm_config.model_config.hf_config.model_type,
                    text.num_hidden_layers,
                    vllm_config.scheduler_config.max_num_batched_tokens,
                    text.hidden_size)  # fmt: skip
        return model

    load_model._steerlab = True  # type: ignore[attr-defined]
    BaseModelLoader.load_model = load_model  # type: ignore[method-assign]
