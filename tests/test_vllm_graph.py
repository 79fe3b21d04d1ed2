"""The graph steering's buffers (``engine/vllm/graph.py``) without vLLM: what a worker writes
before a forward, what the traced steer computes from it, and the check after it."""

from __future__ import annotations

import torch

import steerlab as sl
from steerlab.engine import Request, Sampling, Steer
from steerlab.engine.vllm.batch import lay_out_forward, parse_plan
from steerlab.engine.vllm.graph import GraphBuffers, graph_reason, graph_sites
from steerlab.engine.vllm.params import row_tensors, to_vllm

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
    buffers = GraphBuffers(graph_sites(2), 16, 8, torch.float32, torch.device("cpu"))
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


def test_what_the_graph_holds_and_what_it_refuses():
    assert graph_reason(SITE, sl.Add(), gated=False) is None
    assert "Ablate" in graph_reason(SITE, sl.Ablate(), gated=False)
    assert "condition" in graph_reason(SITE, sl.Add(), gated=True)
    assert "resid_mid" in graph_reason("blocks.0.hook_resid_mid", sl.Add(), gated=False)
    assert graph_sites(1) == ["hook_embed", "blocks.0.hook_resid_pre", "blocks.0.hook_attn_out",
                              "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post"]  # fmt: skip
