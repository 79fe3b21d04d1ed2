"""Hooks on vLLM's own modules, one per site a call steers, following the family's ``VLLMLayout``.

Every hook calls ``apply(site, act)`` with the residual-stream value at its site,
``[tokens, d_model]``, and writes back what it returns (None: unchanged). In the ``pair``
form a block's stream is ``delta + residual``; a steered value is written into ``delta``
with ``residual`` zeroed on the steered tokens, so the next fused add-and-norm sees
exactly the steered sum (writing back only the difference would round differently from
an in-process model). ``finite`` is the check after each steered forward: whether its
output holds a NaN or an inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from steerlab.core.sites import EMBED, Site
from steerlab.core.tagging import tag
from steerlab.engine.vllm.sites import VLLMLayout

Apply = Callable[[str, torch.Tensor], torch.Tensor | None]
Mark = Callable[[Any], Any]


def _as_is(fn: Any) -> Any:
    return fn


def _pair(delta: torch.Tensor, residual: torch.Tensor | None, name: str,
          apply: Apply) -> tuple[torch.Tensor, torch.Tensor | None] | None:  # fmt: skip
    """Steer ``delta + residual``; None when nothing changed."""
    total = delta if residual is None else delta + residual
    new = apply(name, total)
    if new is None:
        return None
    if residual is None:
        return new, None
    changed = (new != total).any(-1, keepdim=True)  # [tokens, 1]
    return torch.where(changed, new, delta), torch.where(changed, 0.0, residual)


def _output(module: nn.Module, name: str, apply: Apply, mark: Mark) -> RemovableHandle:
    def hook(_m: nn.Module, _args: Any, output: Any) -> Any:
        if isinstance(output, tuple):  # (delta, residual): a pair-form block
            new = _pair(output[0], output[1], name, apply)
            return None if new is None else (*new, *output[2:])
        return apply(name, output)

    return module.register_forward_hook(mark(hook))


def _block_input(block: nn.Module, name: str, apply: Apply, form: str,
                 mark: Mark) -> RemovableHandle:  # fmt: skip
    """``resid_pre``: GPT-2 blocks take ``(hidden,)``; Llama's ``(positions, delta, residual)``."""

    def hook(_m: nn.Module, args: tuple, kwargs: dict) -> Any:
        if form == "full":
            new = apply(name, args[0])
            return None if new is None else ((new, *args[1:]), kwargs)
        pair = _pair(args[1], args[2], name, apply)
        return None if pair is None else ((args[0], *pair, *args[3:]), kwargs)

    return block.register_forward_pre_hook(mark(hook), with_kwargs=True)


def _mid_full(block: nn.Module, attn: nn.Module, name: str, apply: Apply,
              mark: Mark) -> list[RemovableHandle]:  # fmt: skip
    """GPT-2 keeps ``resid_mid`` in a local variable: it is the block input plus the attention
    output, so steering it rewrites the attention output (as the HF backend does)."""
    block_input: list[torch.Tensor] = []

    def remember(_m: nn.Module, args: tuple) -> None:
        block_input[:] = [args[0]]

    def steer(_m: nn.Module, _args: Any, attn_out: torch.Tensor) -> Any:
        resid_pre = block_input[0]
        new_mid = apply(name, resid_pre + attn_out)
        return None if new_mid is None else new_mid - resid_pre

    return [block.register_forward_pre_hook(mark(remember)),
            attn.register_forward_hook(mark(steer))]  # fmt: skip


def _mid_pair(norm: nn.Module, name: str, apply: Apply, mark: Mark) -> RemovableHandle:
    """Llama's post-attention norm takes ``(attn_out, residual)``: their sum is ``resid_mid``."""

    def hook(_m: nn.Module, args: tuple) -> Any:
        pair = _pair(args[0], args[1], name, apply)
        return None if pair is None else (*pair, *args[2:])

    return norm.register_forward_pre_hook(mark(hook))


def install(model: nn.Module, layout: VLLMLayout, sites: Iterable[str], apply: Apply, *,
            tagged: bool = True) -> list[RemovableHandle]:  # fmt: skip
    """Hook ``sites`` (in forward order) that live on this worker; returns the handles.

    With pipeline parallelism a worker holds only some layers: sites elsewhere are skipped
    here and hooked on the worker that holds them. ``tagged`` False: hooks that are part
    of the model (a compiled model's graph steering, ``graph.py``), which no call owns,
    counts or removes.
    """
    mark: Mark = tag if tagged else _as_is
    handles: list[RemovableHandle] = []
    blocks: Any = model.get_submodule(layout.blocks)
    for site in sorted((Site.parse(s) for s in set(sites)), key=lambda s: s.forward_order):
        name = site.name
        if site.kind == EMBED:
            embed = model.get_submodule(layout.embed)
            if _held(embed):
                handles.append(_output(embed, name, apply, mark))
            continue
        block = blocks[site.layer]
        if not _held(block):
            continue
        if site.kind == "hook_resid_pre":
            handles.append(_block_input(block, name, apply, layout.form, mark))
        elif site.kind == "hook_resid_post":
            handles.append(_output(block, name, apply, mark))
        elif site.kind == "hook_attn_out":
            handles.append(_output(block.get_submodule(layout.attn), name, apply, mark))
        elif site.kind == "hook_mlp_out":
            handles.append(_output(block.get_submodule(layout.mlp), name, apply, mark))
        elif layout.mid_norm is not None:
            handles.append(_mid_pair(block.get_submodule(layout.mid_norm), name, apply, mark))
        else:
            handles += _mid_full(block, block.get_submodule(layout.attn), name, apply, mark)
    return handles


def finite(output: Any) -> bool:
    """Whether a forward's output (hidden states; a pipeline stage's intermediate tensors)
    is finite everywhere, read off its float32 sum: one reduction and one sync per steered
    forward. A NaN or inf anywhere makes the sum non-finite; finite values whose sum
    overflows (beyond 3e38) read as not finite too, which costs one needless scrub."""
    if isinstance(output, torch.Tensor) and output.is_floating_point():  # the usual case
        return math.isfinite(output.sum(dtype=torch.float32).item())
    tensors = getattr(output, "tensors", None)  # vLLM's IntermediateTensors
    parts = list(tensors.values()) if isinstance(tensors, dict) else [output]
    floats = [p for p in parts if isinstance(p, torch.Tensor) and p.is_floating_point()]
    if not floats:
        return True
    sums = [p.sum(dtype=torch.float32) for p in floats]
    return math.isfinite((sums[0] if len(sums) == 1 else torch.stack(sums).sum()).item())


def _held(module: nn.Module) -> bool:
    """False for vLLM's placeholder for a layer that another pipeline stage holds."""
    return type(module).__name__ != "PPMissingLayer"
