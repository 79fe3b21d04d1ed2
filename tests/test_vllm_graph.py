"""The graph steering's buffers (``engine/vllm/graph.py``) without vLLM: what a worker writes
before a forward, what the traced steer computes from it, and the check after it."""

from __future__ import annotations

import torch

import steerlab as sl
from steerlab.core.ops import FeatureClamp, operand
from steerlab.engine import Request, Sampling, Steer
from steerlab.engine.vllm.batch import lay_out_forward, parse_plan
from steerlab.engine.vllm.graph import GraphBuffers, graph_reason
from steerlab.engine.vllm.params import row_tensors, to_vllm
from steerlab.engine.vllm.sites import vllm_sites

SITE = "blocks.1.hook_resid_pre"


def _plans(rows):
    vectors, plans = {}, {}
    for rid, steers in rows.items():
        request = Request((5, 6, 7), steers, Sampling(max_new_tokens=4), rid)
        vectors.update(row_tensors(request))
        extra = to_vllm(request, rid.upper(), revision="", eos_ids=set()).sampling
        plans[rid] = parse_plan(extra.get("extra_args"), vectors) if steers else None
    return plans, vectors


def test_a_forward_is_written_as_per_token_alphas_and_rows_and_steered_by_hand():
    v, w = torch.randn(8), torch.randn(8)
    plans, vectors = _plans({
        "a": (Steer(SITE, v, 2.0, "all", sl.Add()),),
        "b": (Steer(SITE, w, -1.0, "generated", sl.Add()),),  # another positions rule
        "c": (),
    })  # fmt: skip
    # a: 3 prompt tokens; b: its last prompt token and one generated; c: one token
    positions = torch.tensor([0, 1, 2, 2, 3, 0, 0])  # the last is padding
    batch = lay_out_forward(["a", "b", "c"], [0, 3, 5, 6], positions, plans,
                            {"a": 3, "b": 3, "c": 3})  # fmt: skip
    assert len(batch.by_site[SITE]) == 2  # two fused Adds, one per positions rule
    buffers = GraphBuffers(vllm_sites(2), 16, 8, torch.float32, torch.device("cpu"))
    buffers.write(batch, vectors)
    slot = buffers.sites[SITE]
    assert buffers.alpha[slot, :7].tolist() == [2.0, 2.0, 2.0, 0.0, -1.0, 0.0, 0.0]
    act = torch.randn(7, 8)
    out = buffers.steer(SITE, act)
    want = act.clone()
    want[:3] += 2.0 * v
    want[4] += -1.0 * w
    torch.testing.assert_close(out, want)
    assert torch.equal(out[[3, 5, 6]], act[[3, 5, 6]])  # untouched rows bit-identical
    assert buffers.shortfall() == []
    buffers.applied.zero_()  # as if the graph had not steered
    assert buffers.shortfall() == [SITE]
    buffers.write(None, vectors)  # after the forward: nothing left to steer with
    assert not buffers.alpha.any() and buffers.shortfall() == []


def _feature_clamp(d: int) -> FeatureClamp:
    g = torch.Generator().manual_seed(3)
    return FeatureClamp(index=0, value=2.5, architecture="jumprelu", threshold=0.1,
                           encoder=torch.randn(d, generator=g), bias=torch.tensor(0.2),
                           b_dec_in=torch.randn(d, generator=g) * 0.1)  # fmt: skip


def test_every_operation_with_a_form_steers_in_the_graph_as_it_does_eagerly():
    """Each op's own ``__call__`` (what the eager hooks run) against the graph's table
    arithmetic, five ops on five rows of one forward at one site, each its own alpha."""
    d = 8
    g = torch.Generator().manual_seed(0)
    ops = [sl.Add(), sl.Ablate(), sl.Clamp(1.5), sl.Cap(-0.5, 0.25),
           sl.Rotate(120.0, torch.randn(d, generator=g)), _feature_clamp(d)]  # fmt: skip
    vectors = [torch.randn(d, generator=g) for _ in ops]
    alphas = [2.0, 1.0, 0.5, 1.0, 0.75, 1.0]
    rows = {f"r{k}": (Steer(SITE, v, a, "all", op),)
            for k, (op, v, a) in enumerate(zip(ops, vectors, alphas))}  # fmt: skip
    plans, tensors = _plans(rows)
    ids = list(rows)
    starts = [2 * k for k in range(len(ids) + 1)]  # two tokens a row
    positions = torch.tensor([0, 1] * len(ids))
    batch = lay_out_forward(ids, starts, positions, plans, dict.fromkeys(ids, 2))
    buffers = GraphBuffers(vllm_sites(2), 16, d, torch.float32, torch.device("cpu"))
    buffers.write(batch, tensors)
    act = torch.randn(2 * len(ids), d, generator=g) * 2
    out = buffers.steer(SITE, act)
    for k, (op, v, a) in enumerate(zip(ops, vectors, alphas)):
        mine = act[2 * k : 2 * k + 2]
        want = op(mine, operand(op, v, torch.float32), torch.full((2, 1), a))
        torch.testing.assert_close(out[2 * k : 2 * k + 2], want, rtol=1e-5, atol=1e-5)
        assert not torch.equal(want, mine), op  # each op moves something here
    assert buffers.shortfall() == []


def test_what_the_graph_holds_and_what_it_refuses():
    assert graph_reason(sl.Add(), gated=False) is None
    assert graph_reason(sl.Ablate(), gated=False) is None
    reft = sl.LoReFT(SITE, torch.eye(2, 8), torch.zeros(2, 8), torch.zeros(2))
    assert "no table form" in graph_reason(reft, gated=False)
    assert "condition" in graph_reason(sl.Add(), gated=True)
