"""One decode step, a token per row, as a function of tensors only (what gets compiled).

Inputs are the new tokens, their positions, which rows are live, the cache column to
write, the static cache and the steering table; nothing in it depends on a request's
values, so a new alpha, vector, position rule or prompt is new data, not a new graph.
"""

from __future__ import annotations

import torch

from steerlab.core.steer import touched
from steerlab.engine.compiled.families import Family
from steerlab.engine.compiled.tables import slot_of


def steer(
    h: torch.Tensor,  # [B, 1, d]
    at: int,
    table: dict[str, torch.Tensor],
    live: torch.Tensor,  # [B] bool
    pos: torch.Tensor,  # [B] long
) -> torch.Tensor:
    """The steering table's row ``at`` applied to ``h``: ``core.ops.Form``'s terms, each
    with its column; untouched rows stay bit-identical."""
    c = {name: t[at] for name, t in table.items()}
    act = h[:, 0]  # [B, d]
    # every token a decode step feeds was generated: live rows' are, dead rows' are pads
    where = touched(c["on_prompt"], c["on_generated"], c["from_pos"], pos, live)
    gate = live & where & ((c["add"] != 0) | (c["proj"] != 0) | (c["feat"] != 0))  # [B]
    along = (act * c["unit"]).sum(-1)  # [B]
    moved = torch.clamp(along, min=c["low"], max=c["high"]) - along  # [B]
    pre = (act * c["encoder"]).sum(-1) + c["bias"]  # [B]: an SAE feature's pre-activation
    f = torch.relu(pre) * (pre > c["threshold"]).to(act.dtype)
    new = (act + c["add"][:, None] * c["vector"] + (c["proj"] * moved)[:, None] * c["unit"]
           + (c["feat"] * (c["value"] - f))[:, None] * c["vector"])  # fmt: skip
    return torch.where(gate[:, None], new, act)[:, None]


def attend(
    q: torch.Tensor,  # [B, H, 1, hd]
    keys: torch.Tensor,  # [B, KV, S, hd]
    values: torch.Tensor,  # [B, KV, S, hd]
    mask: torch.Tensor,  # [B, S] bool
    scaling: float,
) -> torch.Tensor:  # [B, 1, H * hd]
    batch, heads, _, hd = q.shape
    groups = heads // keys.shape[1]
    q = q.reshape(batch, keys.shape[1], groups, hd)  # query heads grouped by their KV head
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scaling  # [B, KV, G, S]
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    probs = scores.float().softmax(-1).to(q.dtype)
    return torch.matmul(probs, values).reshape(batch, 1, heads * hd)


def decode_step(
    family: Family,
    ids: torch.Tensor,  # [B] long
    pos: torch.Tensor,  # [B] long: position of each new token (1 on dead rows)
    live: torch.Tensor,  # [B] bool
    column: torch.Tensor,  # [1] long: the cache column the new tokens go to
    cache: tuple[torch.Tensor, ...],  # keys per layer, values per layer, mask [B, S]
    table: dict[str, torch.Tensor],
) -> torch.Tensor:  # [B, vocab]
    """Feed one token per row through the static cache; writes the cache in place."""
    n = family.n_layers
    keys, values, mask = cache[:n], cache[n : 2 * n], cache[2 * n]
    mask.index_copy_(1, column, live[:, None])
    positions = pos[:, None]  # [B, 1]
    h = steer(family.embed(ids[:, None]), 0, table, live, pos)
    h, placed = family.place(h, positions)
    for layer in range(n):
        h = steer(h, slot_of(layer, "hook_resid_pre"), table, live, pos)
        q, k, v = family.qkv(layer, h, placed)
        keys[layer].index_copy_(2, column, k)
        values[layer].index_copy_(2, column, v)
        o = attend(q, keys[layer], values[layer], mask, family.scaling(layer))
        a = steer(family.attn_out(layer, o), slot_of(layer, "hook_attn_out"), table, live, pos)
        h = steer(h + a, slot_of(layer, "hook_resid_mid"), table, live, pos)
        m = steer(family.mlp(layer, h), slot_of(layer, "hook_mlp_out"), table, live, pos)
        h = steer(h + m, slot_of(layer, "hook_resid_post"), table, live, pos)
    return family.logits(h)[:, 0]
