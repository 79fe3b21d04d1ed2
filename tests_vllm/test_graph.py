"""steerlab-tiny on vLLM compiled (``enforce_eager=False``, ``graph="all"``): steering built
into the compiled graph (``engine/vllm/graph.py``), checked against plain HF with hooks
(``tests/reference.py``), never recompiled for a new steer, kept out of the prefix cache of
other steers, and running uncompiled the forwards it cannot hold."""

from __future__ import annotations

import os

import pytest
import torch
from reference import RefSteer, greedy

import steerlab as sl
from steerlab.core.ops import FeatureClamp

PROMPTS = ["Once upon a time", "The sea was", "Tell me a story about the forest.", "A cat"]
NEW = 12


def _vec(seed: int, scale: float = 0.4) -> torch.Tensor:
    return torch.randn(128, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.fixture(scope="module")
def compiled(lm):
    """The session's engine: compiled, with the steering inside at every site."""
    return lm


def test_vllm_compiles_the_model_with_the_steering_inside(compiled):
    (worker,) = compiled.engine.rpc("steerlab_describe")
    assert worker["compilation_mode"] != 0 and not worker["enforce_eager"] and worker["graph"]
    assert compiled.explain(PROMPTS[0], sl.Steer("blocks.1.hook_resid_pre", _vec(0), 2.0)
                            ).startswith("vllm compiled")  # fmt: skip


# One continuous batch: unsteered rows beside steered ones, every graph site kind, every
# position form, per-row alphas, and rows with other vectors at one site (one table).
ROWS = [
    [],
    [RefSteer("blocks.1.hook_resid_pre", _vec(1), 2.0)],
    [RefSteer("blocks.1.hook_resid_pre", _vec(11), -3.0, "generated")],
    [RefSteer("blocks.2.hook_resid_post", _vec(2), 3.0, "prompt")],
    [RefSteer("blocks.0.hook_mlp_out", _vec(3), 3.0, "generated")],
    [RefSteer("blocks.3.hook_attn_out", _vec(4), 4.0, 3)],
    [RefSteer("hook_embed", _vec(5), 2.0)],
    [RefSteer("blocks.2.hook_resid_pre", _vec(6), 5.0, "first:2+last:2")],
    [RefSteer("blocks.1.hook_resid_pre", _vec(1), 6.0), RefSteer("blocks.3.hook_resid_post",
                                                                 _vec(7), 2.0, "last:3")],
    [],
]  # fmt: skip


def _requests(lm, rows):
    from steerlab.engine import Request, Sampling, Steer

    out = []
    for i, row in enumerate(rows):
        ids = tuple(lm.tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"])
        steers = tuple(Steer(s.site, s.vector, s.alpha, s.positions, sl.Add()) for s in row)
        out.append(Request(ids, steers, Sampling(max_new_tokens=NEW), f"r{i}"))
    return out


def test_steered_rows_in_one_batch_equal_plain_hf_with_hooks(compiled, hf):
    requests = _requests(compiled, ROWS)
    done = compiled.engine.run(requests)
    for i, (request, row) in enumerate(zip(requests, ROWS)):
        want = greedy(hf, list(request.prompt), row, NEW, compiled.eos_ids)
        assert done[i].tokens == want, i
    plain = greedy(hf, list(requests[1].prompt), [], NEW, compiled.eos_ids)
    assert done[1].tokens != plain  # the steers do something here
    assert compiled.hook_count() == 0


def test_twenty_new_steers_compile_nothing_new(compiled, hf):
    compiled.generate(PROMPTS[0], sl.Steer("blocks.1.hook_resid_pre", _vec(100), 1.0),
                      max_new_tokens=4)  # fmt: skip
    (before,) = compiled.engine.rpc("steerlab_graphs")
    for k in range(20):
        v, alpha = _vec(200 + k), 0.5 + k / 4
        out = compiled.generate(PROMPTS[k % 4], sl.Steer("blocks.2.hook_resid_pre", v, alpha),
                                max_new_tokens=6)  # fmt: skip
        if k % 7 == 0:
            ref = [RefSteer("blocks.2.hook_resid_pre", v, alpha)]
            assert out.tokens[0] == greedy(hf, out.prompt_tokens[0], ref, 6, compiled.eos_ids)
    assert compiled.engine.rpc("steerlab_graphs") == [before] and before >= 1


def test_a_steered_prefix_is_never_served_to_another_steer(compiled, hf):
    prompt = "Once upon a time, there was a little fox named Rosa who lived by the sea. " * 2
    v, w = _vec(30), _vec(31)
    first = compiled.generate(prompt, sl.Steer("blocks.1.hook_resid_pre", v, 3.0), max_new_tokens=6)
    plain = compiled.generate(prompt, max_new_tokens=6)
    other = compiled.generate(prompt, sl.Steer("blocks.1.hook_resid_pre", w, 3.0), max_new_tokens=6)
    ids = first.prompt_tokens[0]
    assert plain.tokens[0] == greedy(hf, ids, [], 6, compiled.eos_ids)
    ref = [RefSteer("blocks.1.hook_resid_pre", w, 3.0)]
    assert other.tokens[0] == greedy(hf, ids, ref, 6, compiled.eos_ids)
    assert first.tokens[0] != plain.tokens[0]


def _cond(seed: int) -> sl.Condition:
    return sl.Condition("blocks.1.hook_resid_post", _vec(seed), read="token")


def _topk():
    """A top-k feature clamp: whether a feature is on depends on the others (no table form)."""
    g = torch.Generator().manual_seed(3)
    return FeatureClamp(value=1.0, index=0, encoder=torch.randn(128, 16, generator=g),
                           bias=torch.zeros(16), b_dec_in=torch.zeros(128), architecture="topk",
                           k=2)  # fmt: skip


@pytest.mark.parametrize("steer, what", [
    (lambda: sl.Steer("blocks.1.hook_resid_pre", _vec(41), 1.0, op=_topk()), "no table form"),
    (lambda: sl.Steer("blocks.2.hook_resid_pre", _vec(42), 1.0, "all",
                      when=sl.Condition("blocks.1.hook_resid_post", _vec(43))),
     "prompt it reads"),
    (lambda: sl.Steer("blocks.2.hook_resid_pre", _vec(42), 1.0, "generated", when=_cond(44)),
     "per-token"),
    (lambda: [sl.Steer("blocks.1.hook_resid_pre", _vec(44), 1.0),
              sl.Steer("blocks.1.hook_resid_pre", _vec(45), 1.0)], "two steers act on one token"),
])  # fmt: skip
def test_what_the_graph_cannot_hold_runs_uncompiled_and_equals_the_eager_engine(
    compiled, eager, steer, what
):
    """Each, on two prompts in one batch: the compiled engine runs the forwards that need
    it through vLLM's ``skip_compiled`` and the eager path (counted, with why), and its
    tokens equal the eager engine's."""
    assert what in compiled.explain(PROMPTS[0], steer()) and "run uncompiled" in \
        compiled.explain(PROMPTS[0], steer())  # fmt: skip
    before = compiled.engine.rpc("steerlab_uncompiled")[0]
    kwargs = dict(max_new_tokens=6, stop_at_eos=False)
    got = compiled.generate(PROMPTS[:2], steer(), **kwargs)
    after = compiled.engine.rpc("steerlab_uncompiled")[0]
    ran = {why: n - before.get(why, 0) for why, n in after.items() if n > before.get(why, 0)}
    assert len(ran) == 1 and what in next(iter(ran)), ran
    want = eager.generate(PROMPTS[:2], steer(), **kwargs)
    assert got.tokens == want.tokens
    torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs))
    plain = compiled.generate(PROMPTS[:2], **kwargs)
    assert got.logprobs != plain.logprobs  # it steered
    assert compiled.hook_count() == 0


def test_a_forward_that_outgrows_the_buffers_runs_uncompiled_and_equals_the_eager_engine(
    compiled, eager
):
    """Nine monitors at one site (the graph reads eight): that call's forwards run
    uncompiled, counted with why, and every trace equals the eager engine's."""
    monitors = {f"m{k}": ("blocks.2.hook_resid_post", _vec(60 + k)) for k in range(9)}
    kwargs = dict(max_new_tokens=4, stop_at_eos=False, monitor=monitors)
    before = compiled.engine.rpc("steerlab_uncompiled")[0]
    got, want = compiled.generate(PROMPTS[:2], **kwargs), eager.generate(PROMPTS[:2], **kwargs)
    after = compiled.engine.rpc("steerlab_uncompiled")[0]
    ran = {why: n - before.get(why, 0) for why, n in after.items() if n > before.get(why, 0)}
    assert list(ran) == ["more than 8 monitors at one site in one forward"], ran
    assert got.tokens == want.tokens
    for name in monitors:
        for part in ("prompt", "generated"):
            torch.testing.assert_close(getattr(got.monitors[name], part),
                                       getattr(want.monitors[name], part), atol=1e-5,
                                       rtol=1e-4)  # fmt: skip


def test_operations_at_every_site_kind_in_one_compiled_batch_equal_hf(compiled, hf):
    """Every operation with a table form, at every site kind (resid_mid included), each
    row its own, in one continuous batch: tokens equal plain HF with hooks."""
    from steerlab.engine import Request, Sampling, Steer

    toward = _vec(90)
    rows = [
        (sl.Ablate(), RefSteer("blocks.2.hook_mlp_out", _vec(80), 1.0, "generated", "ablate")),
        (sl.Clamp(6.0), RefSteer("blocks.1.hook_resid_post", _vec(81), 1.0, "all", "clamp", 6.0)),
        (sl.Cap(1.0, 1.5), RefSteer("blocks.1.hook_resid_mid", _vec(82), 0.5, 4, "cap",
                                    low=1.0, high=1.5)),
        (sl.Rotate(150.0, toward), RefSteer("blocks.2.hook_resid_pre", _vec(83), 1.0, "all",
                                            "rotate", toward=toward, angle=150.0)),
        (sl.Add(), RefSteer("blocks.0.hook_resid_mid", _vec(84), 6.0, "prompt")),
    ]  # fmt: skip
    requests = []
    for i, (op, ref) in enumerate(rows):
        ids = tuple(compiled.tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"])
        steer = Steer(ref.site, ref.vector, ref.alpha, ref.positions, op)
        requests.append(Request(ids, (steer,), Sampling(max_new_tokens=NEW), f"op{i}"))
    done = compiled.engine.run(requests)
    for i, (request, (_, ref)) in enumerate(zip(requests, rows)):
        assert done[i].tokens == greedy(hf, list(request.prompt), [ref], NEW, compiled.eos_ids), i
    assert compiled.hook_count() == 0


@pytest.fixture(scope="module")
def compiled_tp2():
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    model = sl.load("steerlab-tiny", backend="vllm", tensor_parallel_size=2, max_model_len=128,
                    vllm_args={"enforce_eager": False}, graph="all")  # fmt: skip
    yield model
    model.engine.close()
    del os.environ["VLLM_CPU_OMP_THREADS_BIND"], os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"]


def test_tensor_parallel_2_compiled_rows_equal_hf(compiled_tp2, hf):
    """Both ranks add the whole vector inside their graphs (the block input is replicated
    after each all-reduce), as the eager hooks do."""
    workers = compiled_tp2.engine.rpc("steerlab_describe")
    assert len(workers) == 2 and all(w["graph"] and not w["enforce_eager"] for w in workers)
    v = _vec(50)
    out = compiled_tp2.generate(PROMPTS[:2], sl.Steer("blocks.1.hook_resid_pre", v, [0.0, 3.0]),
                                max_new_tokens=NEW)  # fmt: skip
    for row, prompt in enumerate(out.prompt_tokens):
        ref = [RefSteer("blocks.1.hook_resid_pre", v, out.alphas[row][0])]
        assert out.tokens[row] == greedy(hf, prompt, ref, NEW, compiled_tp2.eos_ids), row
    assert out.tokens[1] != out.tokens[0]


def test_tensor_parallel_2_compiled_conditions_and_monitors_equal_the_local_engine(compiled_tp2,
                                                                                   hf):  # fmt: skip
    """A CAST condition (half the rows fire) and a monitor, read inside both ranks' graphs:
    the same decisions, scores, tokens and traces as the in-process engine; a per-token
    gate, run uncompiled on both ranks: the same tokens."""
    from reads_parity import PROMPTS as READ_PROMPTS
    from reads_parity import cast, condition, median_threshold, steer_of

    ref = cast(median_threshold(compiled_tp2, hf))
    kwargs = dict(steer=steer_of(ref, condition(ref)), max_new_tokens=NEW, stop_at_eos=False,
                  monitor={"m": ("blocks.2.hook_resid_post", _vec(51))})  # fmt: skip
    local = sl.load("steerlab-tiny", backend="hf")
    got = compiled_tp2.generate(READ_PROMPTS, **kwargs)
    want = local.generate(READ_PROMPTS, **kwargs)
    assert got.tokens == want.tokens and got.fired.tolist() == want.fired.tolist()
    assert 0 < int(got.fired.sum()) < len(READ_PROMPTS)
    torch.testing.assert_close(got.condition_scores, want.condition_scores, atol=1e-5, rtol=1e-4)
    for part in ("prompt", "generated"):
        torch.testing.assert_close(getattr(got.monitors["m"], part),
                                   getattr(want.monitors["m"], part), atol=1e-4, rtol=1e-4,
                                   equal_nan=True)  # fmt: skip
    # a per-token gate: both ranks run the same forwards uncompiled (their all-reduces meet)
    token = dict(kwargs, steer=sl.Steer("blocks.2.hook_resid_pre", ref.vector, 4.0,
                                        when=_cond(52)))  # fmt: skip
    before = compiled_tp2.engine.rpc("steerlab_uncompiled")
    got = compiled_tp2.generate(READ_PROMPTS, **token)
    assert got.tokens == local.generate(READ_PROMPTS, **token).tokens
    plain = local.generate(READ_PROMPTS, max_new_tokens=NEW, stop_at_eos=False)
    assert got.tokens != plain.tokens  # the gate let the steer act somewhere
    after = compiled_tp2.engine.rpc("steerlab_uncompiled")
    ran = [{why: n - b.get(why, 0) for why, n in a.items()} for a, b in zip(after, before)]
    assert ran[0] == ran[1] and sum(ran[0].values()) >= NEW - 1, ran


def test_tensor_parallel_2_compiled_later_calls_are_exact_after_an_overflowing_steer(
    compiled_tp2, hf
):  # fmt: skip
    """Issue 49, compiled on two ranks: an overflowing steer, alone and beside a plain and a
    steered row, fails its call; every later call is exact (each rank scrubs its shard)."""
    from failures import LONG, assert_later_calls_exact, overflowing, request_for

    from steerlab.core.errors import NonFiniteError

    lm = compiled_tp2
    assert_later_calls_exact(lm, hf)
    with pytest.raises(NonFiniteError, match=r"alpha=1e\+08"):
        lm.generate(PROMPTS[0] * 8, overflowing(), max_new_tokens=5)
    beside = [request_for(lm, LONG[1], False), request_for(lm, LONG[0], True)]
    with pytest.raises(NonFiniteError, match="row 2"):
        lm.engine.run([*beside, request_for(lm, PROMPTS[0] * 4, False, 5, overflow=True)])
    assert_later_calls_exact(lm, hf)


def test_pipeline_parallel_is_refused_compiled_before_vllm_starts():
    with pytest.raises(ValueError, match="pipeline"):
        sl.load("steerlab-tiny", backend="vllm", pipeline_parallel_size=2,
                vllm_args={"enforce_eager": False})  # fmt: skip
