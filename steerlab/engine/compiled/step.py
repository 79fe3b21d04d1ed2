"""One decode step, a token per row, as a function of tensors only (what gets compiled).

Inputs are the new tokens, their positions, which rows are live, the cache column to
write, the static cache and the steering table; nothing in it depends on a request's
values, so a new alpha, vector, position rule or prompt is new data, not a new graph.
What the step computes is specialised per ``Spec``: the table slots a batch steers, the
``core.ops.Form`` terms its operations use, and the slots its monitors read. A batch of
additions at one site computes one addition at that site and nothing else; each spec is
its own graph, cached.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from steerlab.core.ops.table import apply_terms
from steerlab.core.positions import touched
from steerlab.engine.compiled.families import Family
from steerlab.engine.compiled.tables import slot_of


class Spec(NamedTuple):
    """What a batch needs of the step: the slots its steers steer and the terms they use
    (sorted), and the slot each of its monitors reads (in the monitors' order). Plain
    tuples: the compiler keys its graphs on their values."""

    slots: tuple[int, ...] = ()
    terms: tuple[str, ...] = ()
    reads: tuple[int, ...] = ()


def steer(
    h: torch.Tensor,  # [B, 1, d]
    at: int,
    table: dict[str, torch.Tensor],
    live: torch.Tensor,  # [B] bool
    pos: torch.Tensor,  # [B] long
    spec: Spec,
) -> torch.Tensor:
    """The steering table's row ``at`` applied to ``h``: ``core.ops.Form``'s terms that
    ``spec`` names, each with its column; untouched rows stay bit-identical."""
    if at not in spec.slots:
        return h
    c = {name: t[at] for name, t in table.items()}
    act = h[:, 0]  # [B, d]
    terms = spec.terms
    # every token a decode step feeds was generated: live rows' are, dead rows' are pads
    where = touched(c["on_prompt"], c["on_generated"], c["from_pos"], pos, live)
    on = torch.zeros_like(live)
    for term in terms:
        on = on | (c[term] != 0)
    gate = live & where & on  # [B]
    new = apply_terms(act, c, terms)
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
    spec: Spec,
    ids: torch.Tensor,  # [B] long
    pos: torch.Tensor,  # [B] long: position of each new token (1 on dead rows)
    live: torch.Tensor,  # [B] bool
    column: torch.Tensor,  # [1] long: the cache column the new tokens go to
    cache: tuple[torch.Tensor, ...],  # keys per layer, values per layer, mask [B, S]
    table: dict[str, torch.Tensor],
    read_units: torch.Tensor,  # [monitors, d]: each monitor's unit direction
) -> tuple[torch.Tensor, torch.Tensor]:  # logits [B, vocab], monitor values [monitors, B]
    """Feed one token per row through the static cache; writes the cache in place. Each
    monitor reads ``h·u`` at its slot, after the steer there."""
    n = family.n_layers
    keys, values, mask = cache[:n], cache[n : 2 * n], cache[2 * n]
    mask.index_copy_(1, column, live[:, None])
    positions = pos[:, None]  # [B, 1]
    read: dict[int, torch.Tensor] = {}

    def at(x: torch.Tensor, slot: int) -> torch.Tensor:
        x = steer(x, slot, table, live, pos, spec)
        for k, where in enumerate(spec.reads):
            if where == slot:
                read[k] = (x[:, 0] * read_units[k]).sum(-1)
        return x

    h = at(family.embed(ids[:, None]), 0)
    h, placed = family.place(h, positions)
    for layer in range(n):
        h = at(h, slot_of(layer, "hook_resid_pre"))
        q, k, v = family.qkv(layer, h, placed)
        keys[layer].index_copy_(2, column, k)
        values[layer].index_copy_(2, column, v)
        o = attend(q, keys[layer], values[layer], mask, family.scaling(layer))
        a = at(family.attn_out(layer, o), slot_of(layer, "hook_attn_out"))
        h = at(h + a, slot_of(layer, "hook_resid_mid"))
        m = at(family.mlp(layer, h), slot_of(layer, "hook_mlp_out"))
        h = at(h + m, slot_of(layer, "hook_resid_post"))
    reads = [read[k] for k in range(len(spec.reads))]
    monitored = torch.stack(reads) if reads else h.new_zeros((0, ids.shape[0]))
    return family.logits(h)[:, 0], monitored
