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

import numpy as np
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


def _touched(positions: Any, pos: np.ndarray, prompt_len: np.ndarray) -> np.ndarray:
    """Which tokens (absolute positions ``pos``, their rows' prompt lengths) a steer touches."""
    if positions == "all":
        return np.ones(pos.shape, dtype=bool)
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
    """Per-token alphas of every distinct steer in this forward, vectorised over tokens."""
    n_tokens = positions.shape[0]
    steered = [i for i, rid in enumerate(req_ids) if plans.get(rid) is not None]
    batch = ForwardBatch(rows=[plans[req_ids[i]].row for i in steered])  # type: ignore[union-attr]
    if not steered:
        return batch
    bounds = np.asarray(starts)
    counts = np.diff(bounds)
    owner = np.repeat(np.arange(len(req_ids)), counts)  # [real tokens] request index
    pos = positions[: len(owner)].to("cpu", torch.long).numpy()
    prompt_len = np.array([prompt_lens.get(rid, 0) for rid in req_ids])[owner]
    alphas: dict[tuple, np.ndarray] = {}  # steer key -> alpha per request
    for i in steered:
        for key, alpha in plans[req_ids[i]].steers:  # type: ignore[union-attr]
            alphas.setdefault(key, np.zeros(len(req_ids), dtype=np.float32))[i] = alpha
    for key, per_request in alphas.items():
        site, vector_key, where, op = key
        token_alpha = per_request[owner] * _touched(where, pos, prompt_len)
        full = np.zeros(n_tokens, dtype=np.float32)
        full[: len(owner)] = token_alpha
        touched_per_request = np.bincount(owner[token_alpha != 0], minlength=len(req_ids))
        rows = [(plans[req_ids[i]].row, int(touched_per_request[i]))  # type: ignore[union-attr]
                for i in np.flatnonzero(per_request)]  # fmt: skip
        alpha_t = torch.from_numpy(full)
        batch.by_site.setdefault(site, []).append(
            SiteSteer(vector_key, op_from_data(dict(op)), alpha_t, alpha_t != 0, rows)
        )
    return batch
