"""Inside a vLLM worker: which request each token of a forward belongs to, and its steers.

vLLM flattens a step's requests into one token axis. Before each forward the worker reads
the model runner's batch (request ids in order, and ``query_start_loc``, the cumulative
token counts) and the ``positions`` the model is called with, and lays every distinct
steer of the step out as a per-token alpha, zero where a token is not steered. Sites then
apply each steer exactly as ``steerlab.steering.apply`` does in-process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from steerlab.steering.ops import Operation, op_from_data

DATA_KEY = "steerlab"  # the key of a request's steers in SamplingParams.extra_args


@dataclass(frozen=True)
class RowPlan:
    """One request's steers, parsed once: ``(steer key, alpha)`` each."""

    row: str  # steerlab's id for the request (vLLM may rename its own)
    steers: tuple[tuple[tuple, float], ...]


def parse_plan(extra_args: dict[str, Any] | None) -> RowPlan | None:
    """The steers a request carries, or None for an unsteered request."""
    data = (extra_args or {}).get(DATA_KEY)
    if not data:
        return None
    steers = []
    for s in data["steers"]:
        op = s["op"]
        key = (s["site"], s["vector"], s["positions"], tuple(sorted(op.items())))
        steers.append((key, float(s["alpha"])))
    return RowPlan(str(data["row"]), tuple(steers))


@dataclass
class SiteSteer:
    """One distinct steer at one site over this forward's tokens."""

    vector_key: str
    op: Operation
    alphas: torch.Tensor  # [tokens], 0 where not steered
    touched: torch.Tensor  # [tokens] bool
    rows: list[tuple[str, int]]  # (row id, tokens it steers in this forward)


@dataclass
class ForwardBatch:
    """Every steer of one forward, by site name."""

    by_site: dict[str, list[SiteSteer]] = field(default_factory=dict)
    rows: list[str] = field(default_factory=list)  # steered rows in this forward


def _touched(positions: Any, pos: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Which of one request's tokens (absolute positions ``pos``) a steer touches."""
    if positions == "all":
        return torch.ones_like(pos, dtype=torch.bool)
    if positions == "prompt":
        return pos < prompt_len
    if positions == "generated":
        return pos >= prompt_len
    return pos >= int(positions)


def lay_out_forward(
    req_ids: list[str],
    starts: list[int],  # [len(req_ids) + 1], cumulative token counts
    positions: torch.Tensor,  # [tokens] absolute position of each token (may be padded)
    plans: dict[str, RowPlan | None],
    prompt_lens: dict[str, int],
) -> ForwardBatch:
    """Per-token alphas of every distinct steer in this forward."""
    n_tokens = positions.shape[0]
    pos_cpu = positions.to("cpu", torch.long)
    grouped: dict[tuple, SiteSteer] = {}
    batch = ForwardBatch()
    for i, rid in enumerate(req_ids):
        plan = plans.get(rid)
        if plan is None:
            continue
        lo, hi = starts[i], starts[i + 1]
        batch.rows.append(plan.row)
        for key, alpha in plan.steers:
            site, vector_key, where, op = key
            if key not in grouped:
                grouped[key] = SiteSteer(
                    vector_key, op_from_data(dict(op)), torch.zeros(n_tokens),
                    torch.zeros(n_tokens, dtype=torch.bool), [],
                )  # fmt: skip
                batch.by_site.setdefault(site, []).append(grouped[key])
            entry = grouped[key]
            mask = _touched(where, pos_cpu[lo:hi], prompt_lens[rid])
            entry.touched[lo:hi] |= mask
            entry.alphas[lo:hi] = torch.where(mask, alpha, entry.alphas[lo:hi])
            entry.rows.append((plan.row, int(mask.sum())))
    return batch
