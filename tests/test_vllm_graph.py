"""The graph steering's buffers (``engine/vllm/graph.py``) without vLLM: what a worker writes
before a forward, what the traced steer computes from it, and the check after it."""

from __future__ import annotations

import pytest
import torch

import steerlab as sl
from steerlab.core.ops import FeatureClamp, operand
from steerlab.core.sites import EMBED, Site
from steerlab.engine import Request, Sampling, Steer
from steerlab.engine.vllm.batch import Layouts, lay_out_forward, parse_plan
from steerlab.engine.vllm.engine import uncompiled_reason
from steerlab.engine.vllm.graph import (
    KINDS,
    TWO_STEERS,
    GraphBuffers,
    cache_root,
    eager_reason,
    graph_reason,
)
from steerlab.engine.vllm.graph_reads import GraphFull
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


def _at(buffers: GraphBuffers, site: str, act: torch.Tensor) -> torch.Tensor:
    """A forward through every site in order (as the model's hooks run), ``act`` at each;
    what ``site`` returns."""
    out = {}
    for name in sorted(buffers.sites, key=lambda name: Site.parse(name).forward_order):
        out[name] = buffers.steer(name, act)
    return out[site]


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
    out = _at(buffers, SITE, act)
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


def _loreft(d: int, rank: int, g: torch.Generator) -> sl.LoReFT:
    R = torch.linalg.qr(torch.randn(d, rank, generator=g))[0].T.contiguous()
    return sl.LoReFT(SITE, R, torch.randn(rank, d, generator=g), torch.randn(rank, generator=g))


def test_every_operation_with_a_form_steers_in_the_graph_as_it_does_eagerly():
    """Each op's own ``__call__`` (what the eager hooks run) against the graph's table
    arithmetic, eight ops (two LoReFTs among them) on eight rows of one forward at one
    site, each its own alpha."""
    d = 8
    g = torch.Generator().manual_seed(0)
    h = torch.Generator().manual_seed(1)
    refts = [_loreft(d, rank, h) for rank in (2, 3)]  # two, stacked in one set of columns
    ops = [sl.Add(), sl.Ablate(), sl.Clamp(1.5), sl.Cap(-0.5, 0.25),
           sl.Rotate(120.0, torch.randn(d, generator=g)), _feature_clamp(d), *refts]  # fmt: skip
    vectors = [torch.randn(d, generator=g) for _ in ops]
    alphas = [2.0, 1.0, 0.5, 1.0, 0.75, 1.0, 1.0, 0.5]
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
    out = _at(buffers, SITE, act)
    for k, (op, v, a) in enumerate(zip(ops, vectors, alphas)):
        mine = act[2 * k : 2 * k + 2]
        want = op(mine, operand(op, v, torch.float32), torch.full((2, 1), a))
        torch.testing.assert_close(out[2 * k : 2 * k + 2], want, rtol=1e-5, atol=1e-5)
        assert not torch.equal(want, mine), op  # each op moves something here
    assert buffers.shortfall() == []


def test_a_graph_built_with_fewer_kinds_computes_them_alike_and_runs_the_rest_uncompiled():
    """``graph_kinds``: a graph holding Add and the projections steers them bit for bit as
    the graph holding every kind does; a steer or a read of a kind it lacks makes its
    forwards run uncompiled (the worker's rule and ``explain``'s), saying which kind; and
    the two graphs never share a compile cache."""
    d, g = 8, torch.Generator().manual_seed(3)
    ops = [sl.Add(), sl.Ablate(), sl.Clamp(1.5), sl.Cap(-0.5, 0.25)]
    rows = {f"r{k}": (Steer(SITE, torch.randn(d, generator=g), 1.5, "all", op),)
            for k, op in enumerate(ops)}  # fmt: skip
    plans, tensors = _plans(rows)
    ids = list(rows)
    batch = lay_out_forward(ids, [2 * k for k in range(len(ids) + 1)],
                            torch.tensor([0, 1] * len(ids)), plans, dict.fromkeys(ids, 2))  # fmt: skip
    lean = ("add", "proj")
    act, outs = torch.randn(2 * len(ids), d, generator=g) * 2, []
    for kinds in (KINDS, lean):
        buffers = GraphBuffers(vllm_sites(2), 16, d, torch.float32, torch.device("cpu"), kinds)
        assert buffers.eager_reason(batch) is None
        buffers.write(batch, tensors)
        outs.append(_at(buffers, SITE, act))
        assert buffers.shortfall() == []
    assert torch.equal(outs[0], outs[1])
    for k in range(len(ops)):  # each row moved
        assert not torch.equal(outs[1][2 * k : 2 * k + 2], act[2 * k : 2 * k + 2])

    v, every = torch.randn(d, generator=g), frozenset(vllm_sites(2))
    rotate, reft = sl.Rotate(90.0, torch.randn(d, generator=g)), _loreft(d, 2, g)
    assert "needs 'rot'" in graph_reason(rotate, kinds=lean)
    assert "needs 'loreft'" in graph_reason(reft, kinds=lean)
    assert "graph_kinds=" in graph_reason(_feature_clamp(d), kinds=lean)
    assert graph_reason(sl.Clamp(1.0), kinds=lean) is None
    assert graph_reason(sl.Add(), kinds=("proj",)) is not None
    forward = _forward({"a": (Steer(SITE, v, 1.0, "all", rotate),)}, {"a": [3]})
    assert "needs 'rot'" in eager_reason(forward, every, (), lean)
    assert eager_reason(forward, every, (), KINDS) is None
    monitor = sl.Monitor("m", SITE, torch.ones(d))
    quiet = _forward({"a": ()}, {"a": [3]})
    assert "needs 'reads'" in eager_reason(quiet, every, {SITE}, lean)
    # a graph's own answer is kept for its last layout, and asked again when the reads change
    assert "needs 'reads'" in buffers.eager_reason(quiet, frozenset({SITE}))
    assert buffers.eager_reason(quiet) is None and buffers.eager_reason(forward) is not None
    assert eager_reason(quiet, every, {SITE}, KINDS) is None
    request = Request((5, 6, 7), (), Sampling(max_new_tokens=4), monitors=(monitor,))
    assert "needs 'reads'" in uncompiled_reason([request], every, frozenset(lean))
    rotated = Request((5, 6, 7), (Steer(SITE, v, 1.0, "all", rotate),), Sampling(max_new_tokens=4))
    assert "needs 'rot'" in uncompiled_reason([rotated], every, frozenset(lean))
    assert uncompiled_reason([rotated], every) is None
    assert cache_root([SITE], lean) != cache_root([SITE]) == cache_root([SITE], KINDS[::-1])


def _forward(rows, positions, prompt_len=3):
    """``rows`` laid out as one forward, each row's tokens at ``positions`` (its own list)."""
    plans, _ = _plans(rows)
    ids = list(rows)
    starts = [0]
    for rid in ids:
        starts.append(starts[-1] + len(positions[rid]))
    flat = torch.tensor([p for rid in ids for p in positions[rid]])
    return lay_out_forward(ids, starts, flat, plans, dict.fromkeys(ids, prompt_len))


def test_the_worker_scrubs_after_any_non_finite_output_and_only_then():
    """``hooks.finite`` decides whether the worker zeroes NaN and inf in the KV cache after a
    steered forward: any NaN or inf anywhere, in a tensor or in a pipeline stage's
    intermediate tensors, reads as not finite; ordinary values read as finite."""
    from types import SimpleNamespace

    from steerlab.engine.vllm.hooks import finite as _finite

    x = torch.randn(16, 128)
    assert _finite(x) and _finite(x.to(torch.bfloat16))
    for bad in (float("nan"), float("inf"), -float("inf")):
        y = x.clone()
        y[7, 100] = bad
        assert not _finite(y) and not _finite(y.to(torch.bfloat16))
        stage = SimpleNamespace(tensors={"hidden_states": x, "residual": y})
        assert not _finite(stage)
    assert _finite(SimpleNamespace(tensors={"hidden_states": x, "residual": x}))
    big = torch.full((4, 4), 3e38)  # finite, but a sum past float32's range: one extra scrub
    assert not _finite(big)


def test_the_forwards_the_graph_cannot_hold_run_uncompiled_and_say_why():
    """``eager_reason`` per forward: a top-k clamp, a per-token gate, a prompt gate on
    its own prompt (its prefill only: the decode after it is compiled, the decision
    folded into the alphas), two steers on a token at one site; plain steers and LoReFT
    stay compiled."""
    mean = sl.Condition(SITE, torch.ones(8))
    token = sl.Condition(SITE, torch.ones(8), read="token")
    v = torch.randn(8)
    reft = sl.LoReFT(SITE, torch.eye(2, 8), torch.zeros(2, 8), torch.zeros(2))
    topk = FeatureClamp(value=1.0, index=0, encoder=torch.randn(8, 16), bias=torch.zeros(16),
                        b_dec_in=torch.zeros(8), architecture="topk", k=2)  # fmt: skip
    prefill, decode = {"a": [0, 1, 2], "b": [0, 1, 2]}, {"a": [3], "b": [3]}
    plain = {"b": (Steer(SITE, v, 1.0, "all", sl.Add()),)}

    every = frozenset(vllm_sites(2))

    def reason(steers, at, built=every, reads=()):
        return eager_reason(_forward({"a": steers, **plain}, at), built, reads)

    assert reason((Steer(SITE, v, 2.0, "all", sl.Add()),), prefill) is None
    assert reason(tuple(reft.steers()), prefill) is None
    assert "no table form" in reason((Steer(SITE, v, 1.0, "all", topk),), decode)
    per_token = (Steer(SITE, v, 2.0, "generated", sl.Add(), when=token),)
    assert reason(per_token, prefill) is None  # it steers no token of the prompt
    assert "per-token" in reason(per_token, decode)
    on_prompt = (Steer(SITE, v, 2.0, "all", sl.Add(), when=mean),)
    assert "prompt it reads" in reason(on_prompt, prefill)
    assert reason(on_prompt, decode) is None
    generated = (Steer(SITE, v, 2.0, "generated", sl.Add(), when=mean),)
    assert reason(generated, prefill) is None and reason(generated, decode) is None
    two = (Steer(SITE, v, 1.0, "all", sl.Add()), Steer(SITE, v, 1.0, "all", sl.Ablate()))
    assert reason(two, decode) == TWO_STEERS
    apart = (Steer(SITE, v, 1.0, "prompt", sl.Add()), Steer(SITE, v, 1.0, "generated", sl.Ablate()))
    assert reason(apart, prefill) is None and reason(apart, decode) is None  # one a token
    wide = sl.LoReFT(SITE, torch.eye(40)[:33], torch.zeros(33, 40), torch.zeros(33))
    assert "rank 33" in reason(tuple(wide.steers()), decode)
    # A graph keeps its answer for a steady decode's layout, but not from a forward that
    # fed a prompt token: a one-token prompt, then its decode, one layout for both.
    plans, _ = _plans({"a": on_prompt})
    layouts, buffers = Layouts(), GraphBuffers(vllm_sites(2), 16, 8, torch.float32,
                                               torch.device("cpu"))  # fmt: skip
    batches = [layouts.forward(["a"], [0, 1], torch.tensor([p]), plans, lambda: {"a": 1})
               for p in range(3)]  # fmt: skip
    assert batches[0].layout is batches[2].layout
    assert "prompt it reads" in buffers.eager_reason(batches[0])
    assert buffers.eager_reason(batches[1]) is None and buffers.eager_reason(batches[2]) is None

    # what ``explain`` foresees, over a row's prompt and the tokens it may generate
    def foreseen(*steers, built=every, monitors=()):
        request = Request((5, 6, 7), steers, Sampling(max_new_tokens=4), monitors=monitors)
        return uncompiled_reason([request], built)

    assert foreseen(*apart) is None and foreseen(*two) == TWO_STEERS
    assert "per-token" in foreseen(*per_token) and "prompt it reads" in foreseen(*on_prompt)
    assert foreseen(*generated) is None and foreseen(*reft.steers()) is None
    assert foreseen(Steer(SITE, v, 0.0, "all", sl.Add(), when=token)) is None  # alpha 0
    assert graph_reason(sl.Add()) is None and graph_reason(reft) is None
    assert "no table form" in graph_reason(topk)
    assert "per-token" in graph_reason(sl.Add(), token)
    assert "prompt it reads" in graph_reason(sl.Add(), mean, on_prompt=True)

    # a model built with steering at other sites (or none): the forwards that steer or
    # read a site it lacks run uncompiled, and say how to build it in
    elsewhere = every - {SITE}
    add = (Steer(SITE, v, 2.0, "all", sl.Add()),)

    def alone(steers, built, reads=()):
        return eager_reason(_forward({"a": steers}, {"a": [3]}), built, reads)

    assert f"{SITE} is not built into the compiled graph" in alone(add, elsewhere)
    assert "graph=" in alone(add, frozenset())
    assert alone(add, every) is None
    assert alone((Steer(SITE, v, 0.0, "all", sl.Add()),), elsewhere) is None  # alpha 0
    assert "not built" in alone((), elsewhere, reads={SITE})
    assert alone((), elsewhere, reads={"hook_embed"}) is None
    assert "not built" in foreseen(*add, built=elsewhere)
    monitor = sl.Monitor("m", SITE, torch.ones(8))
    assert "not built" in foreseen(monitors=(monitor,), built=elsewhere)
    assert foreseen(monitors=(monitor,)) is None


def test_a_steady_decode_writes_its_gated_alphas_once_and_again_for_a_new_mask():
    """``GraphBuffers.write`` keeps a steady decode's alphas while its gates hand back the
    very masks of the last forward (a decided prompt gate's), and writes them again for any
    other mask, even an equal one it cannot know is unchanged."""
    gated = (Steer(SITE, torch.randn(8), 2.0, "all", sl.Add(),
                   when=sl.Condition(SITE, torch.ones(8))),)  # fmt: skip
    plans, vectors = _plans({"a": gated})
    layouts, buffers = Layouts(), GraphBuffers(vllm_sites(2), 16, 8, torch.float32,
                                               torch.device("cpu"))  # fmt: skip
    batches = [layouts.forward(["a"], [0, 1], torch.tensor([p]), plans, lambda: {"a": 3})
               for p in range(3, 7)]  # fmt: skip
    assert all(b.layout is batches[0].layout and b is not batches[0] for b in batches[1:])
    slot, opened, shut = (
        buffers.sites[SITE],
        torch.ones(1, dtype=torch.bool),
        torch.zeros(1, dtype=torch.bool),
    )
    buffers.write(batches[0], vectors, lambda site, steer: opened)
    assert buffers.alpha[slot, 0] == 2.0
    buffers.alpha[slot, 0] = 7.0  # a mark that writing this layout's alphas again would clear
    buffers.write(batches[1], vectors, lambda site, steer: opened)  # the very mask: kept
    assert buffers.alpha[slot, 0] == 7.0 and buffers.written == {slot: 1}
    buffers.write(batches[2], vectors, lambda site, steer: shut)  # another: written
    assert buffers.alpha[slot, 0] == 0.0 and buffers.written == {slot: 0}
    buffers.write(batches[3], vectors, lambda site, steer: opened.clone())  # equal, not it
    assert buffers.alpha[slot, 0] == 2.0


def test_a_table_rewrite_that_outgrows_the_columns_is_never_taken_for_the_last_table():
    """LoReFTs of rank 40 in all at one site: ``GraphFull`` half way through the rewrite
    (that forward runs uncompiled). The next forward with the steers the slot held before
    must write them again, not steer from the half-cleared table."""
    g = torch.Generator().manual_seed(5)
    v = torch.randn(8, generator=g)
    big = [sl.LoReFT(SITE, torch.linalg.qr(torch.randn(8, 8, generator=g))[0].T.contiguous(),
                     torch.randn(8, 8, generator=g), torch.randn(8, generator=g))
           for _ in range(5)]  # fmt: skip
    plain = {"a": (Steer(SITE, v, 2.0, "all", sl.Add()),)}
    buffers = GraphBuffers(vllm_sites(2), 16, 8, torch.float32, torch.device("cpu"))
    positions = {"a": [0, 1, 2]}
    plans, tensors = _plans(plain)
    buffers.write(_forward(plain, positions), tensors)
    heavy = {**plain, **{f"r{k}": tuple(reft.steers()) for k, reft in enumerate(big)}}
    _, more = _plans(heavy)
    with pytest.raises(GraphFull, match="LoReFT"):
        buffers.write(_forward(heavy, {**positions, **dict.fromkeys(heavy, [0])}), more)
    buffers.write(None, more)  # the worker: that forward runs uncompiled
    buffers.write(_forward(plain, positions), tensors)
    act = torch.randn(3, 8, generator=g)
    torch.testing.assert_close(_at(buffers, SITE, act), act + 2.0 * v)


def _reading_rows(d: int):
    """Three requests: ``a`` reads a mean cosine condition (gating a steer on generated
    tokens; it does not fire) and two monitors, ``b`` a last-token projection condition and one monitor, ``c``
    nothing; prompts of 5, 3 and 2 tokens."""
    g = torch.Generator().manual_seed(7)
    mean = sl.Condition("blocks.0.hook_resid_post", torch.randn(d, generator=g), 0.9)
    last = sl.Condition("blocks.1.hook_resid_pre", torch.randn(d, generator=g), 0.1,
                        read="last", score="projection")  # fmt: skip
    monitors = [sl.Monitor(n, s, torch.randn(d, generator=g)) for n, s in
                [("m0", EMBED), ("m1", "blocks.1.hook_resid_post"), ("m2", EMBED)]]  # fmt: skip
    v = torch.randn(d, generator=g)
    steers = {"a": (Steer("blocks.1.hook_resid_pre", v, 3.0, "generated", sl.Add(), when=mean),),
              "b": (Steer("blocks.1.hook_resid_post", v, 2.0, "generated", sl.Add(), when=last),),
              "c": ()}  # fmt: skip
    watch = {"a": tuple(monitors[:2]), "b": (monitors[2],), "c": ()}
    lengths = {"a": 5, "b": 3, "c": 2}
    vectors, plans, requests = {}, {}, {}
    for rid, mine in steers.items():
        requests[rid] = Request(tuple(range(lengths[rid])), mine, Sampling(max_new_tokens=4),
                                rid, monitors=watch[rid])  # fmt: skip
        vectors.update(row_tensors(requests[rid]))
        extra = to_vllm(requests[rid], rid.upper(), revision="", eos_ids=set()).sampling
        plans[rid] = parse_plan(extra.get("extra_args"), vectors)
    return plans, vectors, lengths


FORWARDS = [  # (rows, positions): a's prompt in two chunks, then decodes
    ([("a", [0, 1, 2]), ("b", [0, 1, 2]), ("c", [0, 1])]),
    ([("a", [3, 4]), ("b", [3]), ("c", [2])]),
    ([("a", [5]), ("b", [4]), ("c", [3])]),
]


def test_conditions_and_monitors_read_in_the_graph_equal_the_eager_reads():
    """The graph's reads (``graph_reads.py``: prompt sums by a weights matmul, monitors by
    projections, stored at the last site), fed to one ``WorkerReads``, against the eager
    hooks' reads fed the same activations: the same decisions, scores and traces; the
    gated steers act on generated tokens only where their row fired."""
    from types import SimpleNamespace

    from steerlab.engine.vllm.reads import WorkerReads

    d = 8
    plans, vectors, lengths = _reading_rows(d)
    sites = vllm_sites(2)
    in_order = sorted(sites, key=lambda name: Site.parse(name).forward_order)
    buffers = GraphBuffers(sites, 16, d, torch.float32, torch.device("cpu"))
    graph, eager = WorkerReads(), WorkerReads()
    for reads in (graph, eager):
        for rid, plan in plans.items():
            reads.track(rid, plan, SimpleNamespace(num_prompt_tokens=lengths[rid]))
    g = torch.Generator().manual_seed(11)
    for rows in FORWARDS:
        ids = [rid for rid, _ in rows]
        starts = [0, *torch.tensor([len(p) for _, p in rows]).cumsum(0).tolist()]
        positions = torch.tensor([p for _, ps in rows for p in ps] + [0])  # one pad
        batch = lay_out_forward(ids, starts, positions, plans, lengths)
        errors: dict[str, str] = {}

        def gate(site, steer, batch=batch, errors=errors):
            return graph.mask(site, steer, batch, steer.alphas.shape[0], errors)

        buffers.write(batch, vectors, gate)
        buffers.reads.prepare(batch, graph, errors)
        for site in in_order:  # as the model's hooks run
            act = torch.randn(len(positions), d, generator=g)
            eager.before(site, act, batch, errors)
            out = buffers.steer(site, act)
            eager.after(site, out, batch)
        buffers.reads.feed(batch, graph, errors)
        assert errors == {}
        if rows[0][1] == [5]:  # decoding: each gated steer acts where its row fired
            for rid, site in (("a", "blocks.1.hook_resid_pre"), ("b", "blocks.1.hook_resid_post")):
                k = ids.index(rid)
                fired = eager.rows[rid].decision(plans[rid].gates[0])[0]
                alpha = buffers.alpha[buffers.sites[site], starts[k]].item()
                assert alpha == (plans[rid].of_row(0)[0][1] if fired else 0.0)
    fired = []
    for rid in ("a", "b"):
        got, want = graph.rows[rid].report(), eager.rows[rid].report()
        assert got["decided"] and want["decided"] and got["fired"] == want["fired"]
        fired.append(got["fired"])
        assert abs(got["score"] - want["score"]) < 1e-5
        assert (
            set(got["monitors"])
            == set(want["monitors"])
            == {m.name for m in plans[rid].monitors[0]}
        )
        for name, (at, values) in want["monitors"].items():
            fed = [p for rows in FORWARDS for r, ps in rows if r == rid for p in ps]
            assert got["monitors"][name][0] == at == fed
            torch.testing.assert_close(torch.tensor(got["monitors"][name][1]),
                                       torch.tensor(values), rtol=1e-5, atol=1e-5)  # fmt: skip
    assert "c" not in graph.rows
    assert fired == [False, True]  # a gate that shut and one that let its steer act


def test_the_reads_leave_a_compiled_graph_as_its_outputs():
    """Under torch.compile (fullgraph, guards dropped, as vLLM compiles), the reads the last
    site stores come out of the graph each call, with the values of the buffers written
    for that call, equal to the same sites run eagerly; nothing is recompiled."""
    from types import SimpleNamespace

    from torch._dynamo.utils import counters

    from steerlab.engine.vllm.reads import WorkerReads

    d = 8
    plans, vectors, lengths = _reading_rows(d)
    sites = vllm_sites(2)
    in_order = sorted(sites, key=lambda name: Site.parse(name).forward_order)
    # room for 9 tokens, the first forward's count, as vLLM's first (dummy) forward fills
    # its token budget: a layout that depends on the count would specialise it there
    buffers = GraphBuffers(sites, 9, d, torch.float32, torch.device("cpu"))

    def forward(x: torch.Tensor) -> torch.Tensor:
        for k, site in enumerate(in_order):
            x = buffers.steer(site, torch.tanh(x * (1.0 + 0.1 * k)))
        return x

    compiled = torch.compile(forward, fullgraph=True, dynamic=False,
                             options={"guard_filter_fn": torch.compiler.skip_all_guards_unsafe})  # fmt: skip
    g = torch.Generator().manual_seed(5)
    before = counters["stats"]["unique_graphs"]
    for rows in FORWARDS[:2]:
        reads = WorkerReads()
        for rid, plan in plans.items():
            reads.track(rid, plan, SimpleNamespace(num_prompt_tokens=lengths[rid]))
        ids = [rid for rid, _ in rows]
        starts = [0, *torch.tensor([len(p) for _, p in rows]).cumsum(0).tolist()]
        positions = torch.tensor([p for _, ps in rows for p in ps] + [0])  # one pad
        batch = lay_out_forward(ids, starts, positions, {r: plans[r] for r in ids}, lengths)
        errors: dict[str, str] = {}
        buffers.reads.prepare(batch, reads, errors)
        x = torch.randn(len(positions), d, generator=g)
        torch._dynamo.mark_dynamic(x, 0)  # as vLLM marks the token count
        with torch.no_grad():
            got = compiled(x)
            out = dict(buffers.reads.out)
            buffers.reads.out.clear()
            want = forward(x)
        assert errors == {} and set(out) == {"taps", "monitors"}
        torch.testing.assert_close(got, want)
        for key in out:
            torch.testing.assert_close(out[key], buffers.reads.out[key])
        assert out["taps"].abs().sum() > 0 and out["monitors"].abs().sum() > 0
    assert counters["stats"]["unique_graphs"] == before + 1
