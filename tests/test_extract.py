"""extract and its methods: equal to hand computations, validated before any forward."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import steerlab as sl
from steerlab.vectors import extract, pca_diff, probe, single_pair
from steerlab.vectors.extract import data_sha256

POSITIVE = ["I am so happy", "Joy!", "What a lovely, bright day it is"]
NEGATIVE = ["I am so sad", "Pain!!", "What a gloomy day"]
SITES = ["blocks.1.hook_resid_pre", "blocks.2.hook_resid_pre"]


@pytest.fixture(scope="module")
def hf_lm(tiny_dirs) -> sl.SteerableModel:
    """The tiny GPT-2 on the plain HF backend, loaded once for this module."""
    return sl.load(tiny_dirs["gpt2"], backend="hf")


def _resid_pre(model, tokenizer, text: str, layer: int) -> torch.Tensor:
    """The input of block ``layer`` for one unpadded prompt, by a plain forward pre-hook."""
    seen = []

    def hook(_module, args, kwargs):
        seen.append((args[0] if args else kwargs["hidden_states"])[0])

    handle = model.transformer.h[layer].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(torch.tensor([tokenizer(text).input_ids]))
    finally:
        handle.remove()
    return seen[0]  # [pos, d_model]


@pytest.fixture(scope="module")
def reference(tiny_dirs):
    path = tiny_dirs["gpt2"]
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def by_hand(reference) -> dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """Layer -> (positive, negative) block inputs, each prompt run alone: [pos, d_model]."""
    model, tokenizer = reference
    return {
        layer: tuple([_resid_pre(model, tokenizer, t, layer) for t in side] for side in (POSITIVE, NEGATIVE))
        for layer in (1, 2)
    }  # fmt: skip


def test_mean_diff_equals_hand_computation(lm, by_hand, backend):
    vec = extract(lm, POSITIVE, NEGATIVE, SITES, batch_size=2, progress=False)
    for site, layer in zip(SITES, (1, 2)):
        pos, neg = by_hand[layer]
        expected = torch.stack([a[-1] for a in pos]).mean(0) - torch.stack(
            [a[-1] for a in neg]
        ).mean(0)
        torch.testing.assert_close(vec[site], expected, atol=1e-5, rtol=1e-4)
        tokens = torch.cat([a[1:] for a in pos + neg])  # every token but each row's first
        assert vec.provenance.residual_norms[site] == pytest.approx(
            float(tokens.norm(dim=-1).mean()), rel=1e-4
        )
    assert vec.provenance.backend == backend
    assert vec.provenance.method == "mean_diff"
    assert vec.provenance.data_sha256 == data_sha256(POSITIVE, NEGATIVE, "last", False)
    assert lm.hook_count() == 0


def test_token_mean_and_batching(hf_lm, by_hand):
    lm = hf_lm
    vec = extract(lm, POSITIVE, NEGATIVE, SITES[:1], token="mean", progress=False)
    # BOS is left out of the mean: the same token in every prompt carries no contrast.
    pos, neg = (torch.stack([a[1:].mean(0) for a in side]) for side in by_hand[1])
    torch.testing.assert_close(vec[SITES[0]], pos.mean(0) - neg.mean(0), atol=1e-5, rtol=1e-4)
    one_by_one = extract(lm, POSITIVE, NEGATIVE, SITES, batch_size=1, progress=False)
    all_at_once = extract(lm, POSITIVE, NEGATIVE, SITES, batch_size=64, progress=False)
    for site in SITES:
        torch.testing.assert_close(one_by_one[site], all_at_once[site], atol=1e-5, rtol=1e-4)


def test_chat_template_is_applied(hf_lm, tiny_dirs):
    lm = hf_lm
    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs["gpt2"])
    tokenizer.chat_template = "{% for m in messages %}<{{ m['content'] }}>{% endfor %}"
    chat_lm = sl.SteerableModel(lm.backend, tokenizer)
    vec = extract(chat_lm, ["yes"], ["no"], SITES[:1], chat=True, progress=False)
    # The template renders "<yes>" with no BOS; read the same ids by hand.
    acts = {t: chat_lm.run_with_cache([t], SITES[:1], chat=True) for t in ("yes", "no")}
    assert acts["yes"].str_tokens[0] == ["<", "y", "e", "s", ">"]
    expected = acts["yes"][SITES[0]][0, -1] - acts["no"][SITES[0]][0, -1]
    torch.testing.assert_close(vec[SITES[0]], expected)
    assert vec.provenance.chat is True


# --- methods on plain tensors -----------------------------------------------------------


def _clusters(n: int = 6, d: int = 8):
    g = torch.Generator().manual_seed(0)
    axis = torch.zeros(d)
    axis[2] = 1.0
    noise = 0.1 * torch.randn(2, n, d, generator=g)
    return 3 * axis + noise[0], -1 * axis + noise[1], axis


def test_pca_diff_finds_the_shared_axis_with_mean_diff_scale():
    pos, neg, axis = _clusters()
    direction = pca_diff(pos, neg)
    unit = direction / direction.norm()
    assert float(unit @ axis) > 0.99  # sign follows the mean difference
    mean = pos.mean(0) - neg.mean(0)
    assert float(direction.norm()) == pytest.approx(float(mean @ unit), rel=1e-5)
    torch.testing.assert_close(pca_diff(neg, pos), -direction)


def test_single_pair_and_probe():
    pos, neg, axis = _clusters()
    torch.testing.assert_close(single_pair(pos[:1], neg[:1]), pos[0] - neg[0])
    w = probe(pos, neg)
    assert torch.equal(w, probe(pos, neg))  # deterministic
    assert bool((pos @ w).min() > (neg @ w).max())  # separates the training data
    unit = w / w.norm()
    assert float(w.norm()) == pytest.approx(float((pos.mean(0) - neg.mean(0)) @ unit), rel=1e-5)
    assert float(unit @ axis) > 0.5


def test_methods_on_a_model_are_scaled_to_the_mean_difference(hf_lm):
    lm = hf_lm
    ref = extract(lm, POSITIVE, NEGATIVE, SITES, progress=False)
    for method in (pca_diff, probe):
        vec = extract(lm, POSITIVE, NEGATIVE, SITES, method, progress=False)
        assert vec.provenance.method == method.name
        for site in SITES:  # |v| is the mean difference's projection on v's direction
            unit = vec[site] / vec[site].norm()
            assert float(vec[site].norm()) == pytest.approx(float(ref[site] @ unit), rel=1e-4)
    assert all(c > 0.9 for c in vec.cosine(ref).values())  # the probe, here, agrees with CAA


# --- validation before compute ----------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(negative=NEGATIVE[:2], method=pca_diff), ValueError, "3 positive and 2 negative"),
        (dict(method=single_pair), ValueError, "exactly one"),
        (dict(positive=[]), ValueError, "positive is empty"),
        (dict(negative="sad"), TypeError, "list of prompts"),
        (dict(sites=["blocks.1.hook_resid_pr"]), sl.SiteError, "Did you mean"),
        (dict(sites=["blocks.9.hook_resid_pre"]), sl.SiteError, "out of range"),
        (dict(sites=[]), ValueError, "sites is empty"),
        (dict(token="first"), ValueError, "token"),
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(method="mean_diff"), TypeError, "Method"),
    ],
)
def test_bad_arguments_fail_before_any_forward(hf_lm, monkeypatch, kwargs, error, match):
    lm = hf_lm

    def no_forward(*args, **kw):
        raise AssertionError("a forward pass ran before validation finished")

    monkeypatch.setattr(lm, "run_with_cache", no_forward)
    args = dict(positive=POSITIVE, negative=NEGATIVE, sites=SITES, progress=False) | kwargs
    with pytest.raises(error, match=match):
        extract(lm, **args)
