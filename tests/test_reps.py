"""``sl.train.reps`` and ``reft(objective="reps")``: RePS (Wu et al., 2025) on a frozen model.

``reps_loss`` is checked against the paper's formula written out here in plain Python, and
its gradient against finite differences; ``history.loss[0]`` against the loss computed from
plain transformers with torch pre-hooks written here (the steering and the suppression
edits, β from the unsteered model); the model is checked untouched, with no hook left.
On the toy, the pre-trained RePS vector moves held-out openings to happy at the factor the
benchmark chooses on the selection split."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import steerlab as sl

SITE = "blocks.2.hook_resid_pre"
BLOCK = 2  # SITE is the input of transformer.h[2]
PAIRS = [
    sl.Preference("The day was", " happy and bright.", " sad and cold."),
    sl.Preference("Tom felt", " glad and warm, and he sang.", " scared."),
    # a rendered chat prompt carries its own BOS: the row holds one BOS, not two
    sl.Preference(
        "<|bos|><|user|>\nTell me a sad story.\n<|assistant|>\n",
        "Mia smiled at the sea.",
        "Mia cried in the cold woods.",
    ),  # fmt: skip
]
TRAINED = Path(__file__).parents[1] / "tutorials" / "trained" / "sentiment.reps.safetensors"


def weights(lm) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in lm.model.named_parameters()}


# --- the loss, by hand -----------------------------------------------------------------


def _loss_by_hand(pw, pl, rw, rl, lw, ll) -> float:
    """``mean −log σ((β/|w|)·log p(w) − (1/|l|)·log p(l))``, β = max(log p₀(l) − log p₀(w), 1)."""
    total = 0.0
    for i in range(len(pw)):
        beta = max(rl[i] - rw[i], 1.0)
        margin = beta * pw[i] / lw[i] - pl[i] / ll[i]
        # −log σ(m) = log(1 + e^(−m)), written so that neither sign overflows
        total += (
            math.log1p(math.exp(-margin)) if margin > 0 else -margin + math.log1p(math.exp(margin))
        )
    return total / len(pw)


def test_reps_loss_is_the_papers_formula():
    g = torch.Generator().manual_seed(0)
    n = 7
    pw, pl = -30 * torch.rand(n, generator=g), -30 * torch.rand(n, generator=g)
    # some pairs with β above 1 (the reference prefers l), some clamped to 1
    rw = -30 * torch.rand(n, generator=g)
    rl = rw + torch.tensor([5.0, 0.2, -3.0, 12.0, 1.0, 0.9, -0.5])
    lw = torch.randint(1, 20, (n,), generator=g).float()
    ll = torch.randint(1, 20, (n,), generator=g).float()
    got = sl.train.reps_loss(pw, pl, rw, rl, lw, ll)
    want = _loss_by_hand(*(t.tolist() for t in (pw, pl, rw, rl, lw, ll)))
    assert got.shape == () and float(got) == pytest.approx(want, rel=1e-6)
    zero = torch.zeros(1)
    assert float(sl.train.reps_loss(zero, zero, zero, zero, torch.ones(1), torch.ones(1))) == \
        pytest.approx(math.log(2))  # fmt: skip


def test_reps_loss_gradient_matches_finite_differences_and_beta_is_not_differentiated():
    g = torch.Generator().manual_seed(1)
    n = 5
    rw = -20 * torch.rand(n, generator=g, dtype=torch.float64)
    rl = rw + torch.tensor([4.0, 0.1, -2.0, 7.0, 1.5], dtype=torch.float64)
    lw = torch.tensor([3.0, 5.0, 1.0, 8.0, 2.0], dtype=torch.float64)
    ll = torch.tensor([4.0, 2.0, 6.0, 1.0, 3.0], dtype=torch.float64)
    pw = (-10 * torch.rand(n, generator=g, dtype=torch.float64)).requires_grad_()
    pl = (-10 * torch.rand(n, generator=g, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda a, b: sl.train.reps_loss(a, b, rw, rl, lw, ll), (pw, pl), eps=1e-6, atol=1e-7
    )
    # the gradient in closed form: d/dpw = −σ(−m)·β/|w| / n, d/dpl = σ(−m)/|l| / n
    beta = (rl - rw).clamp(min=1.0)
    m = beta * pw.detach() / lw - pl.detach() / ll
    s = torch.sigmoid(-m)
    loss = sl.train.reps_loss(pw, pl, rw, rl, lw, ll)
    gw, gl = torch.autograd.grad(loss, (pw, pl))
    assert torch.allclose(gw, -s * beta / lw / n) and torch.allclose(gl, s / ll / n)
    # β comes from the reference and is not differentiated: no gradient reaches it
    ref_w, ref_l = rw.clone().requires_grad_(), rl.clone().requires_grad_()
    out = sl.train.reps_loss(pw.detach(), pl.detach(), ref_w, ref_l, lw, ll)
    assert not out.requires_grad or all(
        g is None or not g.any()
        for g in torch.autograd.grad(out, (ref_w, ref_l), allow_unused=True)
    )


# --- history.loss[0] against plain transformers with hooks -------------------------------


def _prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The prompt as the model reads it: the tokenizer's BOS, never two of them."""
    ids = list(tokenizer(prompt)["input_ids"])
    while len(ids) > 1 and ids[0] == ids[1] == tokenizer.bos_token_id:
        ids = ids[1:]
    return ids


def _logprob(hf, prompt: list[int], cont: list[int], edit) -> float:
    """Summed log p(cont | prompt) under plain transformers, ``edit`` applied to block 2's
    input at every position (a torch pre-hook written here, not steerlab's)."""

    def pre(_module, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        h = edit(h)
        return ((h, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": h})

    handle = (hf.transformer.h[BLOCK].register_forward_pre_hook(pre, with_kwargs=True)
              if edit is not None else None)  # fmt: skip
    ids = prompt + cont
    try:
        with torch.no_grad():
            logp = hf(torch.tensor([ids])).logits[0].double().log_softmax(-1)
    finally:
        if handle is not None:
            handle.remove()
    return float(sum(logp[t - 1, ids[t]] for t in range(len(prompt), len(ids))))


def test_the_first_loss_equals_plain_transformers_with_hooks(toy_lm, toy_hf):
    """With one factor, α is known; with every pair in the first batch, the batch order
    does not matter to the mean. Both with and without the suppression half."""
    alpha = 3.0
    init = 0.3 * torch.randn(toy_lm.d_model, generator=torch.Generator().manual_seed(5))
    v = init.double()

    def steer(h):  # h + (α + b)·v, b = 0 before the first update
        return h + (alpha * v).to(h.dtype)

    def null(h):  # h − (ReLU(h·v + b)/‖v‖²)·v, b = 0
        latent = torch.relu(h.double() @ v)
        return h - ((latent / v.dot(v))[..., None] * v).to(h.dtype)

    tok = toy_lm.tokenizer
    steering, suppression = [], []  # (log p(w), log p(l), log p₀(w), log p₀(l), |w|, |l|)
    for pair in PAIRS:
        prompt = _prompt_ids(tok, pair.prompt)
        c, r = (tok(t, add_special_tokens=False)["input_ids"] for t in (pair.chosen, pair.rejected))
        ref_c, ref_r = _logprob(toy_hf, prompt, c, None), _logprob(toy_hf, prompt, r, None)
        steering.append((_logprob(toy_hf, prompt, c, steer), _logprob(toy_hf, prompt, r, steer),
                         ref_c, ref_r, len(c), len(r)))  # fmt: skip
        # suppression: w = rejected, l = chosen, the concept nulled in both
        suppression.append((_logprob(toy_hf, prompt, r, null), _logprob(toy_hf, prompt, c, null),
                            ref_r, ref_c, len(r), len(c)))  # fmt: skip
    for suppress in (True, False):
        vec, history = sl.train.reps(toy_lm, PAIRS, site=SITE, epochs=1, lr=0.04,
                                     factors=[alpha], batch_size=8, suppress=suppress,
                                     init=init.clone(), seed=0, progress=False)  # fmt: skip
        assert history.steps == 1 and len(history.loss) == 1
        want = _loss_by_hand(*zip(*(steering + suppression if suppress else steering)))
        assert history.loss[0] == pytest.approx(want, rel=1e-4, abs=1e-5), suppress
        # the vector moved from init; b is recorded, not part of the vector
        assert not torch.equal(vec.directions[SITE] * vec.scale, init)
        assert vec.provenance.method == "reps" and '"bias"' in vec.provenance.training


def test_training_leaves_the_model_as_it_was_and_the_seed_decides_everything(toy_lm):
    before = weights(toy_lm)
    flags = [p.requires_grad for p in toy_lm.model.parameters()]
    options = {"site": SITE, "epochs": 2, "batch_size": 2, "factors": [2, 4, 6],
               "progress": False}  # fmt: skip
    a, history = sl.train.reps(toy_lm, PAIRS, seed=3, **options)
    assert history.steps == 4 and all(math.isfinite(x) for x in history.loss)
    assert toy_lm.hook_count() == 0
    assert all(torch.equal(p, before[n]) for n, p in weights(toy_lm).items())
    assert [p.requires_grad for p in toy_lm.model.parameters()] == flags
    b, _ = sl.train.reps(toy_lm, PAIRS, seed=3, **options)
    c, _ = sl.train.reps(toy_lm, PAIRS, seed=4, **options)
    va, vb, vc = (x.directions[SITE] * x.scale for x in (a, b, c))
    assert torch.equal(va, vb) and not torch.equal(va, vc)


def test_training_shows_a_progress_bar_over_its_steps(toy_lm, capsys):
    _, history = sl.train.reps(toy_lm, PAIRS, site=SITE, epochs=2, batch_size=2, factors=[2])
    err = capsys.readouterr().err  # the tqdm bar
    assert "reps" in err and "4/4" in err
    assert "reps: 4 steps" in repr(history)


def test_reft_with_the_reps_objective_returns_a_loreft_and_leaves_the_model(toy_lm):
    before = weights(toy_lm)
    reft, history = sl.train.reft(toy_lm, PAIRS, site="blocks.2.hook_resid_post", rank=2,
                                  objective="reps", epochs=2, batch_size=2, seed=0,
                                  progress=False)  # fmt: skip
    assert isinstance(reft, sl.LoReFT) and reft.rank == 2
    assert history.steps == 4 and all(math.isfinite(x) for x in history.loss)
    assert toy_lm.hook_count() == 0
    assert all(torch.equal(p, before[n]) for n, p in weights(toy_lm).items())
    again, _ = sl.train.reft(toy_lm, PAIRS, site="blocks.2.hook_resid_post", rank=2,
                             objective="reps", epochs=2, batch_size=2, seed=0, progress=False)  # fmt: skip
    assert all(torch.equal(reft.tensors()[n], again.tensors()[n]) for n in ("R", "W", "b"))
    out = toy_lm.generate("Once upon a time", steer=reft, max_new_tokens=2)  # it steers
    assert len(out.text) == 1
    with pytest.raises(sl.SteerError, match="not sl.Preference"):  # RePS learns pairs
        sl.train.reft(toy_lm, [sl.Example("p", " t")], site=SITE, objective="reps")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"factors": []}, "factors is empty"),
    ({"factors": [2.0, math.nan]}, "finite"),
    ({"factors": "246"}, "list of numbers"),
    ({"init": torch.zeros(3)}, "init must be"),
    ({"init": torch.zeros(128)}, "non-zero"),
    ({"epochs": 0}, "epochs must be"),
])  # fmt: skip
def test_bad_input_is_refused_before_any_compute(toy_lm, monkeypatch, kwargs, match):
    def never(*args, **kw):
        raise AssertionError("computed before refusing")

    monkeypatch.setattr(type(toy_lm.model), "forward", never)
    with pytest.raises(sl.SteerError, match=match):
        sl.train.reps(toy_lm, PAIRS, site=SITE, progress=False, **kwargs)
    assert toy_lm.hook_count() == 0


# --- on the toy ------------------------------------------------------------------------


def test_the_trained_reps_vector_makes_held_out_openings_happy_at_its_chosen_factor(toy_lm):
    """The vector ``scripts/train_tutorial12.py`` trains with the defaults on
    ``steerlab.toy.concept_data("sentiment")`` (a minute or more on CPU, too long to train
    here). The benchmark chooses its factor from AxBench's grid on the selection split; at
    that factor, stories for the test split's instructions (held out: the pairs ask for sad
    stories, these for a setting) score ≥ 0.85 on the toy's own lexicon
    (``mean_concept_score``, the happy share of sentiment words, texts with none skipped).

    The toy's ten places are asked two ways ("the sea", "a sea"; a benchmark refuses a
    repeated instruction): with five selection samples a factor, the 0-2 ratings tie across
    factors and a tie goes to the lowest, a choice made by noise.
    Each test instruction is then asked six times at the chosen factor (60 stories)."""
    from steerlab.evals.methods import VECTOR_FACTORS
    from steerlab.toy import ToyJudge, mean_concept_score

    assert TRAINED.exists(), f"{TRAINED} is missing: run scripts/train_tutorial12.py reps"
    vec = sl.SteeringVector.load(TRAINED)
    places = ("sea", "forest", "beach", "woods", "shore", "grove", "ocean", "glade", "harbor",
              "trail")  # fmt: skip
    asks = [f"Tell me a story about {a} {p}." for a in ("the", "a") for p in places]
    data = sl.evals.ConceptData("happiness", instructions=asks)
    method = sl.evals.Method("reps", make=lambda lm, d, site: vec, factors=VECTOR_FACTORS)
    res = sl.evals.benchmark(toy_lm, [data], [method], site=SITE, judge=ToyJudge(toy_lm),
                             max_new_tokens=20, seed=0, n_boot=50, progress=False)  # fmt: skip
    (row,) = list(res.table)
    held = [s["instruction"] for s in res.samples
            if s["factor"] == row["factor"] and s["split"] == "test"] * 6  # fmt: skip
    assert len(held) == 60
    options = {"max_new_tokens": 20, "temperature": 1.0, "seed": 0, "chat": True}
    steered = toy_lm.generate(held, steer=vec * row["factor"], **options).text
    plain = toy_lm.generate(held, **options).text
    assert mean_concept_score(steered) >= 0.85, (mean_concept_score(steered), row["factor"])
    assert mean_concept_score(plain) < 0.7  # the toy alone tells happy and sad stories alike
