"""One plan per call (``engine/plan.py``) and one gate state for every engine (``engine/gate.py``).

The plan is what every engine reads; these tests hold its shape (per-row alphas as one
tensor, the wire form by name), the benchmark's whole grid as one engine call, and the gate
state's arithmetic against sums written out here with plain torch.
"""

from __future__ import annotations

import json

import pytest
import torch

import steerlab as sl
from steerlab.core.request import Request
from steerlab.core.steer import Steer, at_alphas
from steerlab.engine import plan as plan_module
from steerlab.engine.gate import GateState
from steerlab.engine.plan import Plan, plan_from_data

SITE = "blocks.1.hook_resid_pre"


def _steer(seed: int = 0, **kw) -> Steer:
    return Steer(SITE, torch.randn(8, generator=torch.Generator().manual_seed(seed)), **kw)


def test_rows_that_share_a_steer_share_one_plan_steer_with_a_tensor_of_alphas():
    a, b = _steer(0), _steer(1, positions="generated")
    rows = [Request((1, 2), (Steer.of(a, 2.0),)), Request((3,), (Steer.of(b, 1.5), Steer.of(a, -1.0))),
            Request((4,), ())]  # fmt: skip
    plan = Plan.of(rows)
    assert plan.rows == 3 and len(plan.steers) == 2
    by_positions = {s.positions: s for s in plan.steers}
    assert by_positions["all"].alphas.tolist() == [2.0, -1.0, 0.0]
    assert by_positions["generated"].alphas.tolist() == [0.0, 1.5, 0.0]
    # each row keeps its own order, and its alphas exactly as given
    assert [(s.positions, alpha) for s, alpha in plan.of_row(1)] == [("generated", 1.5),
                                                                     ("all", -1.0)]  # fmt: skip
    assert plan.of_row(2) == []


def test_a_row_travels_as_its_plan_by_name_and_reads_back_the_same():
    cond = sl.Condition("blocks.0.hook_resid_post", torch.ones(8), threshold=0.1)
    monitor = sl.Monitor("m", "blocks.1.hook_resid_post", torch.arange(8.0))
    steer = Steer(SITE, torch.ones(8), 1.0, "generated", sl.Clamp(2.0), cond)
    request = Request((5, 6, 7), (Steer.of(steer, 0.1), Steer.of(_steer(3), 0.0)),
                      monitors=(monitor,), reads_from=1)  # fmt: skip
    plan = Plan.of([request])
    one = plan.only(0, "row-7")
    assert len(one.steers) == 1  # the alpha-0 steer without a gate changes nothing: not sent
    data = json.loads(json.dumps(one.to_data()))  # plain JSON all the way
    assert set(data) == {"row", "steers", "monitors", "reads_from"}
    assert set(data["steers"][0]) == {"site", "vector", "alpha", "positions", "op", "when"}
    back = plan_from_data(data, one.tensors())
    assert back.names == ("row-7",) and back.reads_from == (1,)
    ((s, alpha),) = back.of_row(0)
    assert alpha == 0.1  # the row's own float, not float32's 0.10000000149
    assert s.site == SITE and s.positions == "generated" and s.op == sl.Clamp(2.0)
    assert s.gate == cond and back.monitors == ((monitor,),)
    assert torch.equal(one.tensors()[s.vector], steer.vector)  # type: ignore[index]


def test_a_reader_that_keeps_its_steers_reads_a_steer_once_and_each_row_keeps_its_alpha(
        monkeypatch):  # fmt: skip
    cond = sl.Condition("blocks.0.hook_resid_post", torch.ones(8), threshold=0.1)
    steer = Steer(SITE, torch.ones(8), 1.0, "generated", sl.Clamp(2.0), cond)
    other = Steer.of(steer, 0.5)  # the same but for where it acts: a steer of its own
    other = Steer(other.site, other.vector, 0.5, "all", other.op, other.when)
    steers = [Steer.of(steer, 0.5), Steer.of(steer, -3.0), other, Steer.of(steer, 0.5)]
    rows = [Plan.of([Request((5, 6), (s,))]).only(0, f"r{i}") for i, s in enumerate(steers)]
    tensors = rows[0].tensors()
    datas = [json.loads(json.dumps(r.to_data())) for r in rows]
    read: dict = {}
    calls = []
    real = plan_module.steer_from_data
    monkeypatch.setattr(plan_module, "steer_from_data",
                        lambda *a, **k: calls.append(1) or real(*a, **k))  # fmt: skip
    kept = [plan_from_data(d, tensors, read) for d in datas]
    monkeypatch.undo()
    assert len(calls) == 2 and len(read) == 2  # rows 1 and 3 differ from row 0 by alpha alone
    for d, back in zip(datas, kept):
        fresh = plan_from_data(d, tensors)
        assert back.names == fresh.names
        assert [(s.site, s.vector, s.positions, s.op, s.gate, a) for s, a in back.of_row(0)] == [
            (s.site, s.vector, s.positions, s.op, s.gate, a) for s, a in fresh.of_row(0)]  # fmt: skip
    assert [a for back in kept for _, a in back.of_row(0)] == [0.5, -3.0, 0.5, 0.5]
    assert [s.positions for back in kept for s, _ in back.of_row(0)] == ["generated"] * 2 + [
        "all", "generated"]  # fmt: skip
    # an alpha read from what was kept is checked as a fresh read checks it
    for alpha in (float("inf"), float("nan")):
        bad = json.loads(json.dumps(datas[0]))
        bad["steers"][0]["alpha"] = alpha
        with pytest.raises(sl.SteerError, match="finite") as kept_error:
            plan_from_data(bad, tensors, read)
        with pytest.raises(sl.SteerError, match="finite") as fresh_error:
            plan_from_data(bad, tensors)
        assert kept_error.value.field == fresh_error.value.field == "alpha"
    # data that writes the same JSON as a steer kept, but that the reader refuses, is refused
    floats = json.loads(json.dumps(datas[0]))
    floats["steers"][0]["vector"] = [1.0] * 8  # the wire form's other vector: a list of floats
    plan_from_data(floats, tensors, read)
    odd = json.loads(json.dumps(floats))
    odd["steers"][0]["vector"] = (1.0,) * 8  # a tuple: JSON writes it as that list
    odd["steers"][0]["alpha"] = 2.0
    with pytest.raises(sl.SteerError, match="vector must be") as kept_error:
        plan_from_data(odd, tensors, read)
    with pytest.raises(sl.SteerError, match="vector must be") as fresh_error:
        plan_from_data(odd, tensors)
    assert str(kept_error.value) == str(fresh_error.value)


def test_a_gated_plan_zeroes_a_prompt_gate_where_it_did_not_fire_and_nowhere_else():
    cond = sl.Condition("blocks.0.hook_resid_post", torch.ones(8))
    gated, plain = Steer(SITE, torch.ones(8), when=cond), _steer(4)
    rows = [Request((1,), (Steer.of(gated, 3.0), Steer.of(plain, 1.0))) for _ in range(3)]
    plan = Plan.of(rows).gated(lambda gate: torch.tensor([True, False, True]))
    by_gate = {s.gate is not None: s for s in plan.steers}
    assert by_gate[True].alphas.tolist() == [3.0, 0.0, 3.0]
    assert by_gate[False].alphas.tolist() == [1.0, 1.0, 1.0]
    assert [a for _, a in plan.of_row(1)] == [0.0, 1.0]


def test_the_benchmarks_grid_is_one_engine_call_with_one_steer_of_140_alphas(toy_lm, monkeypatch):
    """One prompt template x 14 factors x 10 instructions, as ``evals.benchmark`` asks."""
    factors = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0]
    instructions = [f"Tell me about thing {i}." for i in range(10)]
    steer = Steer("blocks.2.hook_resid_pre", torch.ones(toy_lm.d_model) / 10)
    calls, plans = [], []
    stream, of = toy_lm.engine.stream, Plan.of.__func__  # type: ignore[attr-defined]

    def counted(requests, **kw):
        calls.append(len(requests))
        return stream(requests, **kw)

    def recorded(cls, requests, names=()):
        plans.append(of(cls, requests, names))
        return plans[-1]

    monkeypatch.setattr(toy_lm.engine, "stream", counted)
    monkeypatch.setattr(plan_module.Plan, "of", classmethod(recorded))
    out = toy_lm.generate(instructions, at_alphas([steer], factors), max_new_tokens=2)
    assert calls == [140] and len(out.text) == 140
    (plan,) = {id(p): p for p in plans if p.rows == 140}.values()
    (planned,) = plan.steers
    want = torch.tensor(factors * 10, dtype=torch.float32)  # prompt-major rows
    assert torch.equal(planned.alphas, want)


# --- GateState against sums written out here ---------------------------------------------


def test_a_prompt_fed_in_chunks_and_again_is_read_once_with_its_last_token():
    torch.manual_seed(0)
    cond = sl.Condition("blocks.0.hook_resid_post", torch.randn(4), read="mean")
    last = sl.Condition("blocks.0.hook_resid_post", torch.randn(4), read="last")
    gate = sl.any_of(cond, last)
    acts = torch.randn(6, 4)
    state = GateState([gate], [cond, last], reads_from=[1], prompt_len=[6])
    row = torch.zeros(3, dtype=torch.long)
    for chunk in ([0, 1, 2], [3, 4, 5], [3, 4, 5]):  # the last chunk fed again
        at = torch.tensor(chunk)
        for c in (cond, last):
            gap = state.update(c, acts[at], row, at)
            assert not gap.any()
        if chunk == [0, 1, 2]:
            assert not state.decided(gate)[2].any()  # half the prompt read: not done
    fired, score, done = state.decided(gate)
    assert done.all()
    mean = acts[1:].mean(0)  # from reads_from on, each position once
    assert torch.allclose(state.sums[cond][0] / state.counts[cond][0], mean)
    assert torch.equal(state.lasts[last][0], acts[5])
    assert state.counts[cond].tolist() == [5.0]


def test_a_skipped_position_is_reported_and_padding_is_never_read():
    cond = sl.Condition("blocks.0.hook_resid_post", torch.ones(2))
    state = GateState([cond], [cond], reads_from=[0, 0], prompt_len=None)
    act = torch.arange(12.0).reshape(2, 3, 2)  # [batch, seq, d]
    pos = torch.tensor([[-1, 0, 1], [0, 1, 2]])  # row 0 left-padded
    rows = torch.tensor([[0, 0, 0], [1, 1, 1]])
    assert not state.update(cond, act, rows, pos).any()
    assert state.counts[cond].tolist() == [2.0, 3.0]
    assert torch.equal(state.sums[cond][0], act[0, 1:].sum(0))
    gap = state.update(cond, act[:1, :1] + 100, torch.tensor([[0]]), torch.tensor([[5]]))
    assert gap.tolist() == [True, False]  # row 0 jumped from position 2 to 5


def test_a_row_with_nothing_to_read_scores_nan_and_never_fires():
    cond = sl.Condition("blocks.0.hook_resid_post", torch.ones(2))
    state = GateState([cond], [cond], reads_from=[3], prompt_len=[3])
    fired, score, done = state.decided(cond)
    assert done.tolist() == [True] and fired.tolist() == [False] and score.isnan().all()


def test_spread_gives_each_run_its_first_rows_reads():
    cond = sl.Condition("blocks.0.hook_resid_post", torch.ones(2))
    state = GateState([cond], [cond], reads_from=[0] * 4)
    act, pos = torch.randn(2, 3, 2), torch.arange(3).expand(2, 3)
    state.update(cond, act, torch.tensor([0, 2])[:, None].expand(2, 3), pos)
    state.spread(2)
    assert torch.equal(state.sums[cond][1], state.sums[cond][0])
    assert torch.equal(state.sums[cond][3], act[1].sum(0))
    assert state.next_pos[cond].tolist() == [3, 3, 3, 3]


def test_a_pool_row_given_again_starts_afresh_and_rows_past_the_pool_are_made():
    """A vLLM worker's pool (``seat``): a row given to a new request reads from nothing,
    from its own ``reads_from``, up to its own prompt's end; growing keeps what was read."""
    torch.manual_seed(2)
    cond = sl.Condition("blocks.0.hook_resid_post", torch.randn(3), read="mean",
                        score="projection")  # fmt: skip
    pool = GateState((), (), [0], [0])
    pool.seat(0, 0, 4)
    acts = torch.randn(9, 3)
    assert not pool.update(cond, acts[:4], torch.zeros(4, dtype=torch.long), torch.arange(4)).any()
    pool.seat(2, 1, 3)  # past the pool's one row: made, and row 0's reads kept
    assert pool.n >= 3 and torch.allclose(pool.sums[cond][0], acts[:4].sum(0))
    pool.seat(0, 2, 5)  # row 0 given to a new request
    rows = torch.tensor([0] * 5 + [2] * 4)
    pos = torch.tensor([0, 1, 2, 3, 4, 0, 1, 2, 3])
    assert not pool.update(cond, acts, rows, pos).any()
    fired, score, done = pool.decided(cond)
    unit = cond.direction / cond.direction.norm()
    assert torch.allclose(score[0], acts[2:5].mean(0) @ unit, atol=1e-5)  # 2..4, none earlier
    assert torch.allclose(score[2], acts[6:8].mean(0) @ unit, atol=1e-5)  # 1..2: its prompt's end
    assert done[0] and done[2]
    pool.drop(())
    assert cond not in pool.sums and not pool.decided(cond)[2][0]  # nothing read for it now


@pytest.mark.parametrize("read", ["mean", "last"])
def test_the_decision_is_the_cores_score_of_what_was_read(read):
    torch.manual_seed(1)
    direction = torch.randn(4)
    cond = sl.Condition("blocks.0.hook_resid_post", direction, threshold=0.0, read=read,
                        score="projection")  # fmt: skip
    acts = torch.randn(2, 5, 4)
    state = GateState([cond], [cond], reads_from=[0, 2])
    rows = torch.tensor([0, 1])[:, None].expand(2, 5)
    state.update(cond, acts, rows, torch.arange(5).expand(2, 5))
    fired, score, _ = state.decided(cond)
    h = torch.stack([acts[0].mean(0), acts[1, 2:].mean(0)]) if read == "mean" else acts[:, -1]
    want = h @ direction / direction.norm()
    assert torch.allclose(score, want, atol=1e-5)
    assert fired.tolist() == (want > 0).tolist()
