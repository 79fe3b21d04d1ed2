"""The vLLM engine's plain-data parts, which need no vLLM: requests as vLLM requests, cache
salts, per-token layout of a flattened batch, and the refusals made before vLLM is touched.
The engine itself is tested in ``tests_vllm/`` (``make test-vllm``)."""

from __future__ import annotations

import importlib.util
import math
from types import SimpleNamespace

import pytest
import torch

import steerlab as sl
from steerlab.core.request import TokenScore
from steerlab.engine import Request, Sampling, Steer
from steerlab.engine.scoring import token_scores
from steerlab.engine.vllm.batch import Layouts, Tally, lay_out_forward, parse_plan
from steerlab.engine.vllm.params import cache_salt, expected_tokens, request_seed, to_vllm
from steerlab.engine.vllm.scores import lines_up, prompt_scores, token_score
from steerlab.engine.vllm.sites import layout_for
from steerlab.model import SteerableModel

V = torch.arange(4, dtype=torch.float32) + 1


def _req(*steers: Steer, prompt=(5, 6, 7), stream="s") -> Request:
    return Request(prompt, steers, Sampling(max_new_tokens=4), stream)


def _steer(alpha=2.0, positions="all", op=None, site="blocks.1.hook_resid_pre") -> Steer:
    return Steer(site, V, alpha, positions, op or sl.Add())


def test_scores_map_to_vllms_raw_logprobs_capped_at_the_vocabulary():
    scored = Request((5, 6, 7), (), Sampling(max_new_tokens=0, prompt_logprobs=3, logprobs=40))
    sampling = to_vllm(scored, "r", revision="", eos_ids={1}, vocab=32).sampling
    assert sampling["prompt_logprobs"] == 3 and sampling["logprobs"] == 32
    assert sampling["max_tokens"] == 1  # vLLM samples one; the engine drops it
    plain = to_vllm(_req(), "r", revision="", eos_ids={1}, vocab=32).sampling
    assert plain["prompt_logprobs"] is None and plain["logprobs"] == 0
    assert plain["max_tokens"] == 4 and not plain["detokenize"]


def _lp(logprob: float, rank: int) -> SimpleNamespace:
    return SimpleNamespace(logprob=logprob, rank=rank, decoded_token=None)


def test_vllm_logprob_dicts_become_token_scores_as_the_local_engine_shapes_them():
    # vLLM's dict: the scored token first, then the top N by rank; once if it is among them.
    outside = {9: _lp(-4.0, 7), 2: _lp(-0.5, 1), 3: _lp(-1.5, 2)}
    assert token_score(9, outside, 2) == TokenScore(9, -4.0, ((2, -0.5), (3, -1.5)))
    inside = {3: _lp(-1.5, 2), 2: _lp(-0.5, 1)}
    assert token_score(3, inside, 2) == TokenScore(3, -1.5, ((2, -0.5), (3, -1.5)))
    assert token_score(9, {9: _lp(-4.0, 7)}, 0) == TokenScore(9, -4.0)
    local = token_scores(torch.tensor([[-0.5, -1.5, -4.0]]).log_softmax(-1), torch.tensor([2]), 2)
    lp = local[0]
    vllm_dict = {2: _lp(lp.logprob, 3), **{t: _lp(v, r) for r, (t, v) in enumerate(lp.top, 1)}}
    assert token_score(2, vllm_dict, 2) == lp
    chunk = [None, {6: _lp(-1.0, 1)}, {7: _lp(-2.0, 2), 1: _lp(-0.1, 1)}]
    assert prompt_scores([5, 6, 7], 0, chunk, 1) == [
        None, TokenScore(6, -1.0, ((6, -1.0),)), TokenScore(7, -2.0, ((1, -0.1),))]  # fmt: skip


def test_prompt_scores_that_start_late_do_not_line_up():
    prompt = [5, 6, 7, 8]
    whole = [None, {6: _lp(-1.0, 1)}, {7: _lp(-1.0, 1)}, {8: _lp(-1.0, 1)}]
    assert lines_up(prompt, 0, whole, complete=True)
    assert lines_up(prompt, 0, whole[:2]) and lines_up(prompt, 2, whole[2:], complete=True)
    assert not lines_up(prompt, 0, whole[:2], complete=True)  # short
    assert not lines_up(prompt, 0, [None, {8: _lp(-1.0, 1)}])  # a cached prefix skipped
    assert not lines_up(prompt, 1, whole)  # too many
    assert not lines_up(prompt, 0, whole[1:])  # no None first


def test_unsteered_and_alpha_zero_rows_share_the_plain_cache():
    assert cache_salt(_req(), "") is None
    assert cache_salt(_req(_steer(alpha=0.0)), "") is None
    assert (
        "extra_args" not in to_vllm(_req(_steer(alpha=0.0)), "r", revision="", eos_ids={1}).sampling
    )


def test_the_salt_separates_whatever_changes_the_keys_and_values():
    base = cache_salt(_req(_steer()), "")
    assert base is not None
    assert cache_salt(_req(_steer()), "") == base  # identical steers may share blocks
    assert cache_salt(_req(_steer(alpha=3.0)), "") != base
    assert cache_salt(_req(_steer()), "v2") != base
    assert cache_salt(_req(_steer(op=sl.Clamp(1.0))), "") != base
    assert cache_salt(_req(_steer(site="blocks.2.hook_resid_pre")), "") != base
    # The prompt length matters only where "prompt" / "generated" depend on it.
    assert cache_salt(_req(_steer(), prompt=(5, 6)), "") == base
    gen = cache_salt(_req(_steer(positions="generated")), "")
    assert cache_salt(_req(_steer(positions="generated"), prompt=(5, 6)), "") != gen


def test_steers_travel_by_vector_key_with_their_op_as_data():
    vr = to_vllm(_req(_steer(op=sl.Clamp(3.0), positions=2)), "row-1", revision="", eos_ids={1})
    (data,) = vr.sampling["extra_args"]["steerlab"]["steers"]
    assert data == {"site": "blocks.1.hook_resid_pre", "vector": _steer().vector_key,
                    "alpha": 2.0, "positions": 2, "op": {"name": "clamp", "value": 3.0}}  # fmt: skip
    assert vr.prompt["prompt_token_ids"] == [5, 6, 7] and "cache_salt" in vr.prompt
    assert vr.sampling["stop_token_ids"] == [1] and vr.sampling["ignore_eos"]
    plan = parse_plan(vr.sampling["extra_args"])
    assert plan is not None and plan.names == ("row-1",)


def test_rows_of_one_prompt_share_a_seed():
    a = to_vllm(_req(stream="p0"), "a", revision="", eos_ids=set()).sampling["seed"]
    b = to_vllm(_req(_steer(), stream="p0"), "b", revision="", eos_ids=set()).sampling["seed"]
    c = to_vllm(_req(stream="p1"), "c", revision="", eos_ids=set()).sampling["seed"]
    assert a == b == request_seed(0, "p0") and a != c


def test_a_flattened_batch_gets_per_token_alphas_by_position_rule():
    plans = {
        "x": parse_plan(to_vllm(_req(_steer(positions="prompt")), "X", revision="",
                                eos_ids=set()).sampling["extra_args"]),
        "y": None,
        "z": parse_plan(to_vllm(_req(_steer(alpha=3.0, positions=4)), "Z", revision="",
                                eos_ids=set()).sampling["extra_args"]),
    }  # fmt: skip
    # x: prompt of 3, positions 1..4 this step (2 prompt tokens, 2 generated); y: 1 token;
    # z: one decode token at position 5.
    positions = torch.tensor([1, 2, 3, 4, 9, 5, 0])  # the last is padding
    batch = lay_out_forward(["x", "y", "z"], [0, 4, 5, 6], positions, plans,
                            {"x": 3, "y": 2, "z": 3})  # fmt: skip
    (x_steer, z_steer) = batch.by_site["blocks.1.hook_resid_pre"]
    assert x_steer.alphas.tolist() == [2, 2, 0, 0, 0, 0, 0]
    assert z_steer.alphas.tolist() == [0, 0, 0, 0, 0, 3, 0]
    assert x_steer.rows == [("X", 2)] and z_steer.rows == [("Z", 1)]


def _plans(*rows: tuple[Steer, ...], prefix: str = "r") -> dict:
    return {f"{prefix}{i}": parse_plan(to_vllm(_req(*steers), f"R{i}", revision="",
                                        eos_ids=set()).sampling["extra_args"]) if steers else None
            for i, steers in enumerate(rows)}  # fmt: skip


def _worker_apply(plans: dict, site: str, act: torch.Tensor, vectors: dict) -> torch.Tensor:
    """``act`` [one token per request] through the worker's hooks for ``site``."""
    from steerlab.engine.vllm.worker import SteerWorker

    worker = SteerWorker()
    state = worker._steerlab()
    state.vectors.update({Steer(site, v, 1.0, "all", sl.Add()).vector_key: v
                          for v in vectors.values()})  # fmt: skip
    n = len(plans)
    state.batch = lay_out_forward(list(plans), list(range(n + 1)), torch.full((n,), 9), plans,
                                  dict.fromkeys(plans, 3))  # fmt: skip
    out = worker._steerlab_apply(site, act)
    assert not state.errors
    return act if out is None else out


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm()


def test_add_steers_of_different_requests_fuse_into_one_op_and_stay_exact():
    gen = torch.Generator().manual_seed(0)
    vs = {k: torch.randn(4, generator=gen) for k in range(3)}
    site = "blocks.1.hook_resid_pre"
    rows = [(Steer(site, vs[k % 3], 0.5 + k, "all", sl.Add()),) for k in range(5)] + [()]
    plans = _plans(*rows)
    batch = lay_out_forward(list(plans), list(range(7)), torch.full((6,), 9), plans, {})
    (fused,) = batch.by_site[site]
    assert len(fused.vector_keys) == 3 and fused.index is not None
    act = torch.randn(6, 4, generator=gen)
    got = _worker_apply(plans, site, act, vs)
    for k in range(5):  # each token: its own request's act + alpha * v, bit for bit
        assert torch.equal(got[k], act[k] + torch.tensor(0.5 + k) * vs[k % 3])
    assert torch.equal(got[5], act[5])


def test_each_request_keeps_its_own_order_of_steers_at_a_site():
    gen = torch.Generator().manual_seed(1)
    v, w = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    site = "blocks.1.hook_resid_pre"
    add, ablate = (
        Steer(site, v, 2.0, "all", sl.Add()),
        Steer(site, w, 1.0, "all", sl.Ablate()),
    )
    plans = _plans((add, ablate), (ablate, add))
    act = torch.randn(2, 4, generator=gen)
    got = _worker_apply(plans, site, act, {0: v, 1: w})

    def add_then_ablate(x):
        x = x + 2.0 * v
        return x - (x @ _unit(w)) * _unit(w)

    def ablate_then_add(x):
        x = x - (x @ _unit(w)) * _unit(w)
        return x + 2.0 * v

    assert torch.allclose(got[0], add_then_ablate(act[0]), atol=1e-6)
    assert torch.allclose(got[1], ablate_then_add(act[1]), atol=1e-6)
    assert not torch.allclose(add_then_ablate(act[1]), ablate_then_add(act[1]), atol=1e-3)


def test_layouts_are_reused_while_a_steady_decode_holds():
    site = "blocks.1.hook_resid_pre"
    plans = _plans((Steer(site, V, 1.0, "all", sl.Add()),), ())
    layouts, lens = Layouts(), lambda: dict.fromkeys(plans, 3)
    first = layouts.forward(["r0", "r1"], [0, 1, 2], torch.tensor([5, 7]), plans, lens)
    assert layouts.forward(["r0", "r1"], [0, 1, 2], torch.tensor([6, 8]), plans, lens) is first
    assert layouts.forward(["r0"], [0, 1], torch.tensor([7]), plans, lens) is not first
    # A per-position rule is laid out again at every step (request ids are never reused).
    gen = _plans((Steer(site, V, 1.0, "generated", sl.Add()),), prefix="g")
    lens = lambda: {"g0": 3}  # noqa: E731
    a = layouts.forward(["g0"], [0, 1], torch.tensor([2]), gen, lens)
    b = layouts.forward(["g0"], [0, 1], torch.tensor([3]), gen, lens)
    assert a.by_site[site][0].alphas.tolist() == [0.0]
    assert b.by_site[site][0].alphas.tolist() == [1.0]


def test_a_forward_that_reads_keeps_the_steers_layout_and_gets_its_own_positions():
    """A condition reads every step: the steers' layout (and the operands a worker made
    for it) is kept through a steady decode, but where each token sits is this forward's."""
    site = "blocks.1.hook_resid_pre"
    from steerlab.engine.vllm.params import row_tensors

    when = sl.Condition("blocks.0.hook_resid_pre", V, 0.0, read="token")
    gated = _req(Steer(site, V, 1.0, "all", sl.Add(), when=when))
    extra = to_vllm(gated, "R0", revision="", eos_ids=set()).sampling["extra_args"]
    plans = {"r0": parse_plan(extra, row_tensors(gated)), "r1": None}
    layouts, lens = Layouts(), lambda: dict.fromkeys(plans, 3)
    prefill = layouts.forward(["r0", "r1"], [0, 3, 6], torch.arange(6) % 3, plans, lens)
    first = layouts.forward(["r0", "r1"], [0, 1, 2], torch.tensor([3, 3]), plans, lens)
    second = layouts.forward(["r0", "r1"], [0, 1, 2], torch.tensor([4, 4]), plans, lens)
    assert prefill.by_site is not first.by_site and second.by_site is first.by_site
    assert second is not first and first.pos.tolist() == [3, 3] and second.pos.tolist() == [4, 4]
    assert prefill.in_prompt.tolist() == [True] * 6 and not second.in_prompt.any()
    assert second.owner.tolist() == [0, 1] and second.req_ids == ["r0", "r1"]
    (steer,) = second.by_site[site]
    assert steer.gate is not None and steer.rows == [("R0", 1)]


def test_a_tally_sums_each_rows_tokens_over_forwards_however_its_lists_repeat():
    """What the workers report as each row's tokens steered: a steady decode adds the same
    ``rows`` list forward after forward, a new layout a new list, some lists equal."""
    prefill, decode = [("a", 3), ("b", 2)], [("a", 1), ("b", 1)]
    again = [("a", 1), ("b", 1)]  # equal to ``decode``, another list: counted on its own
    tally, want = Tally(), {"a": 0, "b": 0}
    for rows, times in ((prefill, 1), (decode, 5), (again, 2), (decode, 3)):
        for _ in range(times):
            tally.add(rows)
            for row, n in rows:
                want[row] += n
    assert tally.sums() == want == {"a": 13, "b": 12}
    tally.sums().pop("a")  # a finished row is forgotten; the rest go on
    tally.add([("b", 4)])
    assert tally.sums() == {"b": 16}
    tally.clear()
    assert tally.sums() == {}


def test_expected_tokens_count_only_what_was_fed():
    # Prompt of 3, 4 generated: positions 0..5 were fed (the last sampled token never is).
    assert expected_tokens(_req(_steer()), cached=0, generated=4) == 6
    assert expected_tokens(_req(_steer()), cached=2, generated=4) == 4  # prefix-cache hits
    assert expected_tokens(_req(_steer(positions="prompt")), cached=0, generated=4) == 3
    assert expected_tokens(_req(_steer(positions="generated")), cached=0, generated=4) == 3
    assert expected_tokens(_req(_steer(positions="generated")), cached=0, generated=1) == 0
    assert expected_tokens(_req(_steer(positions=5)), cached=0, generated=4) == 1
    assert expected_tokens(_req(_steer(alpha=0.0)), cached=0, generated=4) == 0


def test_unknown_families_are_refused():
    assert layout_for("qwen2").form == "pair" and layout_for("gpt2").form == "full"
    with pytest.raises(ValueError, match="no site table"):
        layout_for("gemma2")


def test_vllm_only_arguments_are_refused_elsewhere():
    with pytest.raises(ValueError, match="only apply to backend='vllm'"):
        sl.load("steerlab-tiny", backend="hf", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        sl.load("steerlab-tiny", backend="vllm", device="cpu")


def test_without_vllm_the_error_says_how_to_get_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))  # fmt: skip
    with pytest.raises(ImportError, match=r"steerlab\[vllm\]"):
        sl.load("steerlab-tiny", backend="vllm")


class _RemoteEngine:
    """An engine whose model lives in other processes, as vLLM's does."""

    kind, n_layers, d_model, n_ctx = "vllm", 4, 128, 128

    def sites(self) -> list[str]:
        return ["blocks.0.hook_resid_pre"]


def test_a_model_in_other_processes_is_refused_by_amplify_and_model():
    from transformers import AutoTokenizer

    from steerlab.toy import asset_path

    tokenizer = AutoTokenizer.from_pretrained(asset_path("steerlab-tiny"))
    remote = SteerableModel(None, tokenizer, name="remote", engine=_RemoteEngine())  # type: ignore[arg-type]
    local = sl.load("steerlab-tiny", backend="hf")
    with pytest.raises(ValueError, match="cannot share a step"):
        sl.amplify(remote, local, beta=1.0)
    with pytest.raises(ValueError, match="backend='hf'"):
        sl.amplify(local, remote, beta=1.0)
    with pytest.raises(AttributeError, match="not in this one"):
        remote.model  # noqa: B018
    with pytest.raises(ValueError, match="a backend, an engine"):
        SteerableModel(None, tokenizer)


def test_a_folder_of_pickled_weights_is_refused_on_vllm_too(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(ValueError, match="pickled .bin"):
        sl.load(str(tmp_path), backend="vllm")


def _gated_request(when, monitors=(), prompt=(5, 6, 7, 8, 9), alpha=2.0) -> Request:
    steer = Steer("blocks.2.hook_resid_pre", V, alpha, "generated", sl.Add(), when)
    return Request(prompt, (steer,), Sampling(max_new_tokens=4), "s", monitors=monitors)


def test_rows_that_read_travel_with_their_tensors_and_never_share_cached_blocks():
    from steerlab.engine.vllm.params import row_tensors, sent_steers

    c = sl.Condition("blocks.1.hook_resid_pre", V.flip(0), threshold=0.1)
    m = sl.Monitor("m", "blocks.0.hook_resid_post", V * 3)
    request = _gated_request(c, (m,), alpha=0.0)
    assert sent_steers(request) == request.steers  # alpha 0: it still reports its decision
    assert live_of(request) == ()
    salts = {to_vllm(request, "r", revision="", eos_ids=set()).prompt["cache_salt"]
             for _ in range(2)}  # fmt: skip
    assert len(salts) == 2  # a salt of its own each time: no prefix-cache reads
    extra = to_vllm(request, "r", revision="", eos_ids=set()).sampling["extra_args"]
    plan = parse_plan(extra, row_tensors(request))
    assert plan is not None and plan.gates == [c] and plan.monitors == ((m,),)
    assert torch.equal(plan.monitors[0][0].direction, m.direction)
    plain = Request((5, 6), (), Sampling(max_new_tokens=2), "s")
    assert "cache_salt" not in to_vllm(plain, "p", revision="", eos_ids=set()).prompt


def live_of(request: Request) -> tuple:
    from steerlab.engine.vllm.params import live_steers

    return live_steers(request)


def test_a_worker_sums_a_prompt_fed_in_chunks_once_and_gates_by_the_decision():
    """Two requests, prompts of 5 fed as positions 0-2, then 3-4 (with a repeat of 3-4, as
    after a preemption), then one decode token each: the decision equals the formula on
    the whole prompt's mean; only the firing row is steered; monitors keep every position."""
    from steerlab.engine.vllm.params import row_tensors
    from steerlab.engine.vllm.worker import SteerWorker

    gen = torch.Generator().manual_seed(5)
    c = torch.randn(4, generator=gen)
    cond = sl.Condition("blocks.1.hook_resid_pre", c, threshold=0.0, score="projection")
    m = sl.Monitor("m", "blocks.2.hook_resid_pre", torch.randn(4, generator=gen))
    requests = {"a": _gated_request(cond, (m,)), "b": _gated_request(cond, (m,))}
    acts = {
        "a": torch.randn(6, 4, generator=gen) + 2 * c,
        "b": torch.randn(6, 4, generator=gen) - 2 * c,
    }
    worker = SteerWorker()
    state = worker._steerlab()
    plans = {}
    for rid, request in requests.items():
        state.vectors.update(row_tensors(request))
        extra = to_vllm(request, rid.upper(), revision="", eos_ids=set()).sampling["extra_args"]
        plans[rid] = parse_plan(extra, state.vectors)
        state.reads.track(rid, plans[rid], SimpleNamespace(num_prompt_tokens=5))
    steered = {}
    buffer = torch.zeros(8, dtype=torch.long)  # vLLM rewrites one positions buffer each step
    for positions in ([0, 1, 2], [3, 4], [3, 4], [5]):
        state.reads.new_forward()
        n = len(positions)
        buffer.zero_()
        buffer[: 2 * n] = torch.tensor(positions * 2)
        state.batch = lay_out_forward(["a", "b"], [0, n, 2 * n], buffer, plans,
                                      {"a": 5, "b": 5})  # fmt: skip
        x = torch.cat([acts["a"][positions], acts["b"][positions], torch.zeros(8 - 2 * n, 4)])
        assert worker._steerlab_apply("blocks.1.hook_resid_pre", x) is None  # read only
        out = worker._steerlab_apply("blocks.2.hook_resid_pre", x)
        steered[positions[0]] = (x if out is None else out)[: 2 * n]
    assert not state.errors
    generated = 2.0 * V * torch.tensor([0, 0, 0, 0, 0, 1.0])[:, None]  # row a's steer
    _assert_reports(state, acts, cond, m, {"a": acts["a"] + generated, "b": acts["b"]})
    # position 5 (a generated token): row a steered by alpha * V, row b untouched
    assert torch.equal(steered[5][0], acts["a"][5] + 2.0 * V)
    assert torch.equal(steered[5][1], acts["b"][5])
    assert torch.equal(steered[0], torch.cat([acts["a"][[0, 1, 2]], acts["b"][[0, 1, 2]]]))


def test_a_steady_decode_that_reads_steers_each_forward_by_its_rows_decisions():
    """Two rows gated by one prompt condition, steered at every position, each with a
    monitor; a prefill of both whole prompts, then a steady decode whose forwards share one
    layout (what a worker works out once for it, ``WorkerReads.reading``): at every forward
    the firing row is steered at its own token and the other is not, and the monitors hold
    every position, as the formulas say."""
    from steerlab.engine.vllm.params import row_tensors
    from steerlab.engine.vllm.worker import SteerWorker

    gen = torch.Generator().manual_seed(7)
    c = torch.randn(4, generator=gen)
    cond = sl.Condition("blocks.1.hook_resid_pre", c, threshold=0.0, score="projection")
    m = sl.Monitor("m", "blocks.2.hook_resid_pre", torch.randn(4, generator=gen))
    site = "blocks.2.hook_resid_pre"
    worker = SteerWorker()
    state = worker._steerlab()
    plans = {}
    for rid in ("a", "b"):
        request = Request((5, 6, 7, 8, 9), (Steer(site, V, 2.0, "all", sl.Add(), cond),),
                          Sampling(max_new_tokens=4), "s", monitors=(m,))  # fmt: skip
        state.vectors.update(row_tensors(request))
        extra = to_vllm(request, rid.upper(), revision="", eos_ids=set()).sampling["extra_args"]
        plans[rid] = parse_plan(extra, state.vectors)
        state.reads.track(rid, plans[rid], SimpleNamespace(num_prompt_tokens=5))
    acts = {"a": torch.randn(9, 4, generator=gen) + 2 * c,
            "b": torch.randn(9, 4, generator=gen) - 2 * c}  # fmt: skip
    lens = lambda: {"a": 5, "b": 5}  # noqa: E731
    fed = [(list(range(5)), [0, 5, 10])] + [([p], [0, 1, 2]) for p in range(5, 9)]
    layouts, seen = [], {"a": acts["a"].clone(), "b": acts["b"].clone()}
    for positions, starts in fed:
        state.reads.new_forward()
        state.batch = state.layouts.forward(["a", "b"], starts, torch.tensor(positions * 2),
                                            plans, lens)  # fmt: skip
        layouts.append(state.batch.layout)
        x = torch.cat([acts["a"][positions], acts["b"][positions]])
        assert worker._steerlab_apply("blocks.1.hook_resid_pre", x) is None  # read only
        out = worker._steerlab_apply(site, x)
        n = len(positions)
        assert out is not None
        torch.testing.assert_close(out[:n], acts["a"][positions] + 2.0 * V)  # row a fires
        assert torch.equal(out[n:], acts["b"][positions])
        seen["a"][positions] = out[:n]
    assert not state.errors
    assert layouts[0] is not layouts[1] and all(lay is layouts[1] for lay in layouts[2:])
    _assert_reports(state, acts, cond, m, seen)


def _assert_reports(state, acts, cond, monitor, seen) -> None:
    """The rows' reports: row a's prompt gate fired and row b's did not, each scored by the
    formula on its whole prompt's mean (5 tokens); the monitor read every position fed, of
    the activations ``seen`` after the steers."""
    from steerlab.core.reads import score

    reports = {r.name: r.report() for r in state.reads.rows.values()}
    for rid, want_fired in (("a", True), ("b", False)):
        want = score(acts[rid][:5].mean(0, keepdim=True), cond.direction, "projection")
        got = reports[rid.upper()]
        assert got["fired"] is want_fired and abs(got["score"] - float(want)) < 1e-6
        positions, values = got["monitors"][monitor.name]
        assert positions == list(range(len(seen[rid])))
        torch.testing.assert_close(torch.tensor(values), seen[rid] @ _unit(monitor.direction))


def test_a_gap_in_the_prompt_fails_the_row_and_a_late_decision_is_an_error():
    from steerlab.engine.vllm.params import row_tensors
    from steerlab.engine.vllm.worker import SteerWorker

    cond = sl.Condition("blocks.1.hook_resid_pre", V)
    request = Request((5, 6, 7, 8, 9), (Steer("blocks.2.hook_resid_pre", V, 2.0, "all",
                                                 sl.Add(), cond),), Sampling(max_new_tokens=2), "s")  # fmt: skip
    worker = SteerWorker()
    state = worker._steerlab()
    state.vectors.update(row_tensors(request))
    plans = {"a": parse_plan(to_vllm(request, "A", revision="", eos_ids=set())
                             .sampling["extra_args"], state.vectors)}  # fmt: skip
    state.reads.track("a", plans["a"], SimpleNamespace(num_prompt_tokens=5))
    state.batch = lay_out_forward(["a"], [0, 3], torch.tensor([0, 1, 2]), plans, {"a": 5})
    x = torch.randn(3, 4)
    worker._steerlab_apply("blocks.1.hook_resid_pre", x)
    out = worker._steerlab_apply("blocks.2.hook_resid_pre", x)
    assert "chunked prefill" in state.errors["A"]  # the steer acts on a prompt not yet read
    assert out is None or torch.equal(out, x)  # and nothing was steered
    state.errors.clear()
    state.batch = lay_out_forward(["a"], [0, 1], torch.tensor([4]), plans, {"a": 5})
    worker._steerlab_apply("blocks.1.hook_resid_pre", torch.randn(1, 4))
    assert "was not fed" in state.errors["A"]  # positions 3 skipped: a cache hit, say


def test_what_vllm_cannot_decide_exactly_is_refused_with_why():
    from steerlab.engine.vllm.engine import reads_reason

    cond = sl.Condition("blocks.1.hook_resid_pre", V)

    def gated(positions) -> Request:
        steer = Steer("blocks.2.hook_resid_pre", V, 2.0, positions, sl.Add(), cond)
        return Request(tuple(range(10)), (steer,), Sampling(), "s")

    # With chunked prefill on, any prompt may be split: a steer on prompt tokens is refused.
    assert reads_reason([gated("generated")], stages=1, chunks_prompts=True) is None
    assert reads_reason([gated(10)], stages=1, chunks_prompts=True) is None  # past the prompt
    for positions in ("all", "prompt", "last:2", 9):
        why = reads_reason([gated(positions)], stages=1, chunks_prompts=True)
        assert why is not None and "enable_chunked_prefill" in why
        assert reads_reason([gated(positions)], stages=1, chunks_prompts=False) is None
    per_token = sl.Condition("blocks.1.hook_resid_pre", V, read="token")
    token_steer = Steer("blocks.2.hook_resid_pre", V, 2.0, "all", sl.Add(), per_token)
    assert reads_reason([Request((1, 2), (token_steer,), Sampling(), "s")], stages=1,
                        chunks_prompts=True) is None  # fmt: skip
    assert "pipeline stages" in reads_reason([gated("generated")], stages=2, chunks_prompts=False)
    monitored = Request((5, 6), (), Sampling(), "s",
                        monitors=(sl.Monitor("m", "blocks.0.hook_resid_post", V),))  # fmt: skip
    assert reads_reason([monitored], stages=2, chunks_prompts=True) is None


def test_a_condition_with_nothing_to_read_never_fires_as_on_the_local_engine():
    """``reads_from`` at the prompt's end: no token read, a NaN score, no fire (the local
    engine's ``prompt_score``), rather than a decision that never comes."""
    from steerlab.engine.gate import GateState
    from steerlab.engine.vllm.params import row_tensors
    from steerlab.engine.vllm.reads import RowReads

    cond = sl.Condition("blocks.1.hook_resid_pre", V)
    request = Request((5, 6, 7), (Steer("blocks.2.hook_resid_pre", V, 2.0, "generated",
                                           sl.Add(), cond),), Sampling(), "s", reads_from=3)  # fmt: skip
    extra = to_vllm(request, "A", revision="", eos_ids=set()).sampling["extra_args"]
    pool = GateState((), (), [0], [0])  # a worker's, for every request that reads
    reads = RowReads(parse_plan(extra, row_tensors(request)), 3, pool, slot=0)
    report = reads.report()
    assert report["decided"] and report["fired"] is False and math.isnan(report["score"])


def test_worker_reports_merge_stage_by_stage_and_rank_by_rank():
    from steerlab.engine.vllm.reads import merge_reports

    early = {"fired": True, "score": 0.5, "decided": True, "monitors": {"a": [[0, 1], [1.0, 2.0]]}}
    late = {"fired": None, "score": None, "decided": True, "monitors": {"b": [[0, 1], [3.0, 4.0]]}}
    merged = merge_reports({"R": [early, dict(early), late]})["R"]  # two TP ranks, one more stage
    assert merged["fired"] is True and merged["score"] == 0.5 and merged["decided"]
    assert merged["monitors"] == {"a": [[0, 1], [1.0, 2.0]], "b": [[0, 1], [3.0, 4.0]]}
    undecided = {**early, "fired": None, "score": None, "decided": False}
    assert not merge_reports({"R": [early, undecided]})["R"]["decided"]
