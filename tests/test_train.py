"""``sl.train``: BiPO and LoReFT on a frozen model, through the engine, on every backend.

The BiPO loss is checked against the paper's formula computed here from plain transformers
log-probabilities, and its gradient against finite differences; the model is checked
bit-identical with no hook left, through an exception and a KeyboardInterrupt."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import load_tiny

import steerlab as sl
from steerlab.train import loop

BIPO = importlib.import_module("steerlab.train.bipo")  # the modules (the package's names are
REFT = importlib.import_module("steerlab.train.reft")  # the functions)

SITE = "blocks.1.hook_resid_pre"
PAIRS = [
    sl.Preference("The day was", " happy and bright.", " sad and cold."),
    sl.Preference("Tom felt", " glad and warm.", " scared and cold."),
    sl.Preference("At the sea", " we laughed.", " we cried."),
]
EXAMPLES = [sl.Example("Once upon a time", " a boat."), sl.Example("The fox", " swam at sea.")]


def weights(lm) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in lm.model.named_parameters()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("method", ["bipo", "reft"])
def test_training_runs_on_every_backend_and_leaves_the_model_as_it_was(lm, method):
    before, flags = weights(lm), [p.requires_grad for p in lm.model.parameters()]
    if method == "bipo":
        vec, history = sl.train.bipo(lm, PAIRS, site=SITE, epochs=2, lr=1e-2, batch_size=2,
                                     progress=False)  # fmt: skip
        steer = vec * 2
        assert vec.provenance.method == "bipo" and len(vec.provenance.data_sha256) == 64
        assert '"last_loss"' in vec.provenance.training
    else:
        steer, history = sl.train.reft(lm, EXAMPLES, site="blocks.1.hook_resid_post", rank=2,
                                       positions="first:1+last:1", epochs=2, batch_size=1,
                                       progress=False)  # fmt: skip
        assert steer.rank == 2
    assert history.steps == 4 and all(math.isfinite(x) for x in history.loss)
    assert history.tokens > 0
    assert same(weights(lm), before) and lm.hook_count() == 0
    assert [p.requires_grad for p in lm.model.parameters()] == flags
    lm.generate("Hi", steer=steer, max_new_tokens=2)  # a trained steer steers


def test_the_same_seed_gives_bit_identical_parameters(toy_lm):
    a, _ = sl.train.reft(toy_lm, EXAMPLES, site=SITE, epochs=2, seed=3, progress=False)
    b, _ = sl.train.reft(toy_lm, EXAMPLES, site=SITE, epochs=2, seed=3, progress=False)
    c, _ = sl.train.reft(toy_lm, EXAMPLES, site=SITE, epochs=2, seed=4, progress=False)
    assert all(torch.equal(a.tensors()[n], b.tensors()[n]) for n in ("R", "W", "b"))
    assert not torch.equal(a.W, c.W)
    v1, _ = sl.train.bipo(toy_lm, PAIRS, site=SITE, epochs=3, batch_size=1, seed=3,
                          progress=False)  # fmt: skip
    v2, _ = sl.train.bipo(toy_lm, PAIRS, site=SITE, epochs=3, batch_size=1, seed=3,
                          progress=False)  # fmt: skip
    assert torch.equal(v1.directions[SITE], v2.directions[SITE])


def test_trained_r_keeps_orthonormal_rows(toy_lm):
    reft, _ = sl.train.reft(toy_lm, EXAMPLES, site=SITE, rank=4, epochs=5, lr=5e-2,
                            progress=False)  # fmt: skip
    gram = reft.R.double() @ reft.R.double().T
    assert torch.allclose(gram, torch.eye(4, dtype=torch.float64), atol=1e-5)


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_an_interrupted_run_leaves_the_model_untouched(toy_lm, monkeypatch, error):
    before = weights(toy_lm)
    flags = [p.requires_grad for p in toy_lm.model.parameters()]
    calls = {"n": 0}
    real = loop.continuation_logprobs

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:  # mid-epoch, after an optimizer step
            raise error
        return real(*args, **kwargs)

    monkeypatch.setattr(BIPO, "continuation_logprobs", failing)
    with pytest.raises(type(error)):
        sl.train.bipo(toy_lm, PAIRS, site=SITE, epochs=3, batch_size=1, progress=False)
    assert same(weights(toy_lm), before) and toy_lm.hook_count() == 0
    assert [p.requires_grad for p in toy_lm.model.parameters()] == flags
    toy_lm.generate("Hi", max_new_tokens=1)  # the call guard let go


def test_a_nan_loss_stops_at_its_step(toy_lm, monkeypatch):
    before = weights(toy_lm)
    real = loop.continuation_logprobs
    calls = {"n": 0}

    def poisoned(*args, **kwargs):
        logp, fed = real(*args, **kwargs)
        calls["n"] += 1
        return (logp * math.nan if calls["n"] == 3 else logp), fed

    monkeypatch.setattr(REFT, "continuation_logprobs", poisoned)
    with pytest.raises(sl.train.TrainingError, match="step 3 \\(epoch 2\\)"):
        sl.train.reft(toy_lm, EXAMPLES, site=SITE, epochs=3, batch_size=1, progress=False)
    assert same(weights(toy_lm), before) and toy_lm.hook_count() == 0


def _plain_logprob(hf, ids: list[int], n_prompt: int, v: torch.Tensor | None) -> torch.Tensor:
    """Summed log-probability of ids[n_prompt:] under plain transformers, v added at block 1's
    input at every position (a torch pre-hook written here, not steerlab's)."""
    block = hf.transformer.h[1]

    def pre(_m, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        h = h + v
        return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})

    handle = block.register_forward_pre_hook(pre, with_kwargs=True) if v is not None else None
    try:
        logp = hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    finally:
        if handle is not None:
            handle.remove()
    return sum(logp[t - 1, ids[t]] for t in range(n_prompt, len(ids)))


def test_the_bipo_loss_is_the_papers_formula_and_its_gradient_matches_finite_differences(
    toy_lm, toy_hf
):
    pair, beta, d = PAIRS[0], 0.1, -1.0
    v = torch.randn(toy_lm.d_model, generator=torch.Generator().manual_seed(0))
    tok = toy_lm.tokenizer
    prompt = tok(pair.prompt)["input_ids"]
    rows = [prompt + tok(c, add_special_tokens=False)["input_ids"]
            for c in (pair.chosen, pair.rejected)]  # fmt: skip

    def by_hand(vector: torch.Tensor) -> torch.Tensor:
        pc, pr = (_plain_logprob(toy_hf, r, len(prompt), d * vector) for r in rows)
        rc, rr = (_plain_logprob(toy_hf, r, len(prompt), None) for r in rows)
        return -F.logsigmoid(torch.tensor(d * beta) * ((pc - rc) - (pr - rr)))

    engine = loop.local_engine(toy_lm)
    chosen, rejected = (sl.train.data.rows_of(tok, pair.prompt, c)
                        for c in (pair.chosen, pair.rejected))  # fmt: skip
    param = torch.nn.Parameter(v.clone())
    at = loop.check_site(engine, SITE)
    with loop.frozen_call(engine, "test") as call:
        state = {"d": 0.0}
        loop.attach_edit(engine, at, call, "all",
                         lambda: (lambda a: a + state["d"] * param) if state["d"] else None)  # fmt: skip
        ref, _ = loop.continuation_logprobs(engine, call, [chosen, rejected], grad=False)
        state["d"] = d
        pol, _ = loop.continuation_logprobs(engine, call, [chosen, rejected], grad=True)
        loss = sl.train.bipo_loss(pol[:1], pol[1:], ref[:1].detach(), ref[1:].detach(), d, beta)
        loss.backward()
    with torch.no_grad():
        assert float(loss) == pytest.approx(float(by_hand(v)), abs=1e-5)
        grad = param.grad
        assert grad is not None and float(grad.norm()) > 0
        eps = 1e-2
        for i in torch.randperm(toy_lm.d_model, generator=torch.Generator().manual_seed(1))[:4]:
            e = torch.zeros_like(v)
            e[i] = eps
            numeric = (by_hand(v + e) - by_hand(v - e)) / (2 * eps)
            assert float(grad[i]) == pytest.approx(float(numeric), rel=0.05, abs=2e-4)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda lm: sl.train.bipo(lm, [], site=SITE), "No pairs"),
        (lambda lm: sl.train.reft(lm, [], site=SITE), "No examples"),
        (lambda lm: sl.Preference("p", " same", " same"), "chosen equals rejected"),
        (lambda lm: sl.train.reft(lm, EXAMPLES, site=SITE, rank=0), "rank must be"),
        (lambda lm: sl.train.reft(lm, EXAMPLES, site=SITE, rank=129), "rank must be"),
        (lambda lm: sl.train.bipo(lm, PAIRS, site=SITE, lr=math.nan), "lr must be a finite"),
        (lambda lm: sl.train.bipo(lm, PAIRS, site=SITE, beta=math.inf), "beta must be a finite"),
        (lambda lm: sl.train.bipo(lm, PAIRS, site=SITE, epochs=0), "epochs must be"),
        (lambda lm: sl.train.reft(lm, EXAMPLES, site=SITE, epochs=-1), "epochs must be"),
        (lambda lm: sl.train.reft(lm, EXAMPLES, site="blocks.9.hook_resid_pre"), "blocks"),
        (lambda lm: sl.train.reft(lm, EXAMPLES, site=SITE, positions="first:0"), "positions"),
        (lambda lm: sl.train.bipo(lm, EXAMPLES, site=SITE), "not sl.Preference"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_before_any_compute(toy_lm, monkeypatch, call, match):
    def never(*args, **kwargs):
        raise AssertionError("computed before refusing")

    monkeypatch.setattr(BIPO, "continuation_logprobs", never)
    monkeypatch.setattr(REFT, "continuation_logprobs", never)
    with pytest.raises((sl.SteerError, ValueError), match=match):
        call(toy_lm)
    assert toy_lm.hook_count() == 0


def test_vllm_takes_trained_steers_but_does_not_train():
    class Remote:
        engine = type("VLLMEngine", (), {"kind": "vllm"})()

    with pytest.raises(sl.SteerError, match="vLLM takes trained steers"):
        sl.train.bipo(Remote(), PAIRS, site=SITE)


def test_the_history_shows_progress(toy_lm, capsys):
    _, history = sl.train.reft(toy_lm, EXAMPLES, site=SITE, epochs=2, batch_size=1,
                               held_out=EXAMPLES[:1])  # fmt: skip
    assert "reft" in capsys.readouterr().err  # the tqdm bar
    assert len(history.held_out) == 2 and history.held_out[-1][0] == history.steps
    assert "reft: 4 steps" in repr(history)


def test_a_tiny_llama_trains_too(tiny_dirs):
    lm = load_tiny(tiny_dirs, "llama", "hf")
    before = weights(lm)
    reft, _ = sl.train.reft(lm, EXAMPLES, site="blocks.0.hook_resid_post", epochs=1,
                            progress=False)  # fmt: skip
    assert same(weights(lm), before) and lm.hook_count() == 0


def test_the_training_figure_shows_the_loss_and_the_held_out_loss(toy_lm):
    _, history = sl.train.reft(toy_lm, EXAMPLES, site=SITE, epochs=2, batch_size=1,
                               held_out=EXAMPLES[:1], progress=False)  # fmt: skip
    fig = sl.plots.training(history)
    assert list(fig.data[0].y) == history.loss
    assert list(fig.data[1].x) == [s for s, _ in history.held_out]
