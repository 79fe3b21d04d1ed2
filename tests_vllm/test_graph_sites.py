"""A compiled engine built with steering at one site (``graph=[...]``), and the default mode.

Steers and reads at the built site run inside the compiled graph; those elsewhere run
their forwards uncompiled (vLLM's ``skip_compiled`` and the eager path), exactly, and
``explain`` says which. Every row is checked against plain HF with hooks
(``tests/reference.py``). The default on a CPU is eager, and says why.
"""

from __future__ import annotations

import pytest
import torch
from reference import RefSteer, greedy

import steerlab as sl

BUILT = "blocks.1.hook_resid_pre"
ELSEWHERE = "blocks.2.hook_resid_post"
PROMPTS = ["Once upon a time", "The sea was calm and", "A cat"]
NEW = 8


def _vec(seed: int) -> torch.Tensor:
    return torch.randn(128, generator=torch.Generator().manual_seed(seed)) * 0.5


@pytest.fixture(scope="module")
def one_site():
    model = sl.load("steerlab-tiny", backend="vllm", max_model_len=128, graph=[BUILT],
                    vllm_args={"block_size": 32, "enable_chunked_prefill": False,
                               "enforce_eager": False})  # fmt: skip
    yield model
    model.engine.close()


def _uncompiled(lm) -> int:
    return sum(sum(w.values()) for w in lm.engine.rpc("steerlab_uncompiled"))


def test_steers_at_the_built_site_run_compiled_and_elsewhere_uncompiled(one_site, hf):
    (worker,) = one_site.engine.rpc("steerlab_describe")
    assert worker["graph"] and worker["compilation_mode"] != 0
    assert one_site.engine.graph_sites == {BUILT}
    rows = [[], [RefSteer(BUILT, _vec(1), 3.0)], [RefSteer(BUILT, _vec(2), -2.0, "generated")]]

    def run(rows):
        from steerlab.engine import Request, Sampling, Steer

        requests = []
        for i, row in enumerate(rows):
            ids = tuple(one_site.tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"])
            steers = tuple(Steer(s.site, s.vector, s.alpha, s.positions, sl.Add()) for s in row)
            requests.append(Request(ids, steers, Sampling(max_new_tokens=NEW), f"r{i}"))
        done = one_site.engine.run(requests)
        return [list(r.prompt) for r in requests], [c.tokens for c in done]

    def reference(prompts, rows):
        return [greedy(hf, p, row, NEW, one_site.eos_ids) for p, row in zip(prompts, rows)]

    before = _uncompiled(one_site)
    prompts, tokens = run(rows)
    assert tokens == reference(prompts, rows)
    assert _uncompiled(one_site) == before  # all inside the graph
    assert tokens[1] != reference(prompts, [[], [], []])[1]  # the steer does something

    elsewhere = [[], [RefSteer(ELSEWHERE, _vec(3), 3.0)], [RefSteer(BUILT, _vec(1), 3.0)]]
    prompts, tokens = run(elsewhere)
    assert tokens == reference(prompts, elsewhere)
    counts = {}
    for worker in one_site.engine.rpc("steerlab_uncompiled"):
        counts.update(worker)
    assert any(ELSEWHERE in reason and "not built" in reason for reason in counts)
    assert _uncompiled(one_site) > before
    assert one_site.hook_count() == 0

    said = one_site.explain(PROMPTS[0], sl.Steer(ELSEWHERE, _vec(3), 3.0))
    assert said.startswith("vllm compiled (loaded with vllm_args={'enforce_eager': False})")
    assert "built in at 1 site" in said and f"{ELSEWHERE} is not built" in said
    assert "run uncompiled" not in one_site.explain(PROMPTS[0], sl.Steer(BUILT, _vec(3), 3.0))


def test_a_monitor_at_a_site_not_built_in_reads_uncompiled_and_exactly(one_site):
    """Against the in-process hf engine (checked against plain HF elsewhere)."""
    local = sl.load("steerlab-tiny", backend="hf")
    steer = sl.Steer(BUILT, _vec(1), 2.0)
    for site in (ELSEWHERE, BUILT):
        monitor = {"m": (site, _vec(4))}
        kwargs = dict(max_new_tokens=NEW, stop_at_eos=False, monitor=monitor)
        got, want = one_site.generate(PROMPTS, steer, **kwargs), local.generate(PROMPTS, steer,
                                                                                 **kwargs)  # fmt: skip
        assert got.tokens == want.tokens
        for part in ("prompt", "generated"):
            torch.testing.assert_close(getattr(got.monitors["m"], part),
                                       getattr(want.monitors["m"], part), atol=1e-4,
                                       rtol=1e-4, equal_nan=True)  # fmt: skip
        said = one_site.explain(PROMPTS[0], monitor=monitor)
        assert ("not built" in said) == (site == ELSEWHERE), said


def test_a_graph_built_with_fewer_kinds_runs_them_compiled_and_the_rest_uncompiled(hf):
    """``graph_kinds=["add", "proj"]``: Add and Ablate at the built site run compiled, a
    Rotate there runs its forwards uncompiled and says which kind it needs; every row
    equals plain HF with hooks."""
    from steerlab.engine import Request, Sampling, Steer

    lean = sl.load("steerlab-tiny", backend="vllm", max_model_len=128, graph=[BUILT],
                   graph_kinds=["proj", "add"],
                   vllm_args={"block_size": 32, "enable_chunked_prefill": False,
                              "enforce_eager": False})  # fmt: skip
    try:
        (worker,) = lean.engine.rpc("steerlab_describe")
        assert worker["graph"] and worker["kinds"] == ["add", "proj"]
        toward = _vec(9)
        steers = {"add": sl.Add(), "ablate": sl.Ablate(), "rotate": sl.Rotate(60.0, toward)}
        refs = {
            "add": RefSteer(BUILT, _vec(1), 3.0),
            "ablate": RefSteer(BUILT, _vec(2), 1.0, op="ablate"),
            "rotate": RefSteer(BUILT, _vec(3), 1.0, op="rotate", toward=toward, angle=60.0),
        }

        def run(kinds):
            requests, rows = [], []
            for i, kind in enumerate(kinds):
                ids = tuple(lean.tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"])
                ref = refs.get(kind)
                steer = () if ref is None else (
                    Steer(BUILT, ref.vector, ref.alpha, "all", steers[kind]),)  # fmt: skip
                requests.append(Request(ids, steer, Sampling(max_new_tokens=NEW), f"r{i}"))
                rows.append([] if ref is None else [ref])
            got = [c.tokens for c in lean.engine.run(requests)]
            want = [greedy(hf, list(r.prompt), row, NEW, lean.eos_ids)
                    for r, row in zip(requests, rows)]  # fmt: skip
            assert got == want, kinds

        run(["none", "add", "ablate"])
        assert _uncompiled(lean) == 0  # all inside the lean graph
        run(["none", "rotate"])
        (counts,) = lean.engine.rpc("steerlab_uncompiled")
        assert list(counts) == ["Rotate needs 'rot', which this graph is not built with (load "
                                "with graph_kinds= naming it)"], counts  # fmt: skip
        said = lean.explain(PROMPTS[0], sl.Steer(BUILT, _vec(3), 1.0, op=steers["rotate"]))
        assert "computing only ['add', 'proj']" in said and "needs 'rot'" in said
        assert "run uncompiled" not in lean.explain(PROMPTS[0], sl.Steer(BUILT, _vec(3), 1.0))
    finally:
        lean.engine.close()


def test_graph_is_checked_before_vllm_starts():
    with pytest.raises(ValueError, match="not one of this model's sites"):
        sl.load("steerlab-tiny", backend="vllm", graph=["blocks.9.hook_resid_pre"],
                vllm_args={"enforce_eager": False})  # fmt: skip
    with pytest.raises(ValueError, match="runs eagerly"):
        sl.load("steerlab-tiny", backend="vllm", graph="all")  # eager: the CPU's default
    for kinds, match in (("add", "a list of"), (["add", "fold"], "names 'fold'"),
                         ([], "names 'nothing'")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            sl.load("steerlab-tiny", backend="vllm", graph=[BUILT], graph_kinds=kinds,
                    vllm_args={"enforce_eager": False})  # fmt: skip
    with pytest.raises(ValueError, match="no site is built in"):
        sl.load("steerlab-tiny", backend="vllm", graph_kinds=["add"],
                vllm_args={"enforce_eager": False})  # fmt: skip
    with pytest.raises(ValueError, match="'all' or a list"):
        sl.load("steerlab-tiny", backend="vllm", graph="blocks.1.hook_resid_pre",
                vllm_args={"enforce_eager": False})  # fmt: skip
