"""Train ``steerlab-tiny-sae``, a standard (ReLU) SAE on steerlab-tiny's residual stream.

Run ``python -m steerlab.toy.train_sae`` (``make toy-sae``): one CPU thread, seed 0, a
couple of minutes. It reads ``blocks.2.hook_resid_pre`` (the input of the middle block, where
the toy's steering vectors work) with a plain forward pre-hook on the HF model, trains the
SAE, measures it on held-out labelled stories, and writes
``steerlab/toy/assets/steerlab-tiny-sae/`` in SAELens's format: ``cfg.json``,
``sae_weights.safetensors``, ``training.json`` (every figure) and the model card
``README.md`` (rendered from ``training.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2LMHeadModel

from steerlab.core.identity import config_sha256
from steerlab.features.load import TOY_SAES
from steerlab.features.sae import SAE
from steerlab.toy import asset_path
from steerlab.toy.corpus import documents, make_story
from steerlab.toy.evidence import NEUTRAL_PROMPT, add_to_resid_pre, mean_difference, sample
from steerlab.toy.metrics import concept_coverage, mean_concept_score, perplexity

NAME = "steerlab-tiny-sae"


@dataclass(frozen=True)
class Recipe:
    """Everything that decides the weights; stored in ``training.json``."""

    seed: int = 0
    threads: int = 1
    layer: int = 2  # blocks.{layer}.hook_resid_pre
    n_documents: int = 4000  # training corpus: steerlab.toy.corpus.documents(seed=seed + 1)
    d_sae: int = 512
    l1: float = 2.0  # on f_i * |W_dec[i]|, per token, against the summed squared error
    l1_warmup: int = 500
    steps: int = 4000
    batch_tokens: int = 1024
    lr: float = 1e-3
    n_eval_stories: int = 400  # held out: make_story(random.Random(seed + 2)), labelled
    mean_diff_alpha: float = 2.5  # the toy's card value for the sentiment mean-diff vector
    feature_alphas: tuple[float, ...] = (8.0, 16.0, 32.0)

    @property
    def site(self) -> str:
        return f"blocks.{self.layer}.hook_resid_pre"


@torch.no_grad()
def residuals(
    model: GPT2LMHeadModel, tokenizer, texts: list[str], layer: int
) -> list[torch.Tensor]:
    """Each text's residual entering block ``layer``: ``[pos, d_model]``, BOS included.

    >>> model = AutoModelForCausalLM.from_pretrained(asset_path("steerlab-tiny"))
    >>> tokenizer = AutoTokenizer.from_pretrained(asset_path("steerlab-tiny"))
    >>> residuals(model, tokenizer, ["Once upon a time."], 2)[0].shape
    torch.Size([6, 128])
    """
    out: list[torch.Tensor] = []
    captured: list[torch.Tensor] = []

    def hook(module, args, kwargs):
        captured.append(args[0] if args else kwargs["hidden_states"])

    handle = model.transformer.h[layer].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for start in range(0, len(texts), 64):
            ids = tokenizer(texts[start : start + 64]).input_ids
            ids = [x[: model.config.n_positions] for x in ids]
            width = max(len(x) for x in ids)
            batch = torch.full(
                (len(ids), width), tokenizer.pad_token_id
            )  # [batch, pos], right-padded
            mask = torch.zeros(len(ids), width, dtype=torch.long)
            for row, x in enumerate(ids):
                batch[row, : len(x)], mask[row, : len(x)] = torch.tensor(x), 1
            captured.clear()
            model(input_ids=batch, attention_mask=mask)
            out += [captured[0][row, : len(x)].clone() for row, x in enumerate(ids)]
    finally:
        handle.remove()
    return out


def train(
    x: torch.Tensor, recipe: Recipe
) -> tuple[dict[str, torch.Tensor], list[tuple[int, float, float]]]:
    """Plain SGD on ``x [tokens, d_in]``: squared error + l1 * sum(f_i * |W_dec[i]|).

    Returns the weights and ``(step, mse, l0)`` every 250 steps.

    >>> x = torch.randn(2048, 128, generator=torch.Generator().manual_seed(0))
    >>> weights, history = train(x, Recipe(steps=10, d_sae=64))
    step    10  mse ...
    >>> weights["W_dec"].shape, [step for step, mse, l0 in history]
    (torch.Size([64, 128]), [10])
    """
    generator = torch.Generator().manual_seed(recipe.seed)
    d_in = x.shape[1]
    W_dec = torch.randn(recipe.d_sae, d_in, generator=generator)
    W_dec = W_dec / W_dec.norm(dim=-1, keepdim=True) * 0.1
    params = {
        "W_enc": W_dec.T.clone().contiguous(),
        "W_dec": W_dec,
        "b_enc": torch.zeros(recipe.d_sae),
        "b_dec": x.mean(0),
    }
    for p in params.values():
        p.requires_grad_(True)
    optimizer = torch.optim.Adam(params.values(), lr=recipe.lr)
    history: list[tuple[int, float, float]] = []
    for step in range(1, recipe.steps + 1):
        batch = x[torch.randint(0, x.shape[0], (recipe.batch_tokens,), generator=generator)]
        f = torch.relu((batch - params["b_dec"]) @ params["W_enc"] + params["b_enc"])
        x_hat = f @ params["W_dec"] + params["b_dec"]
        mse = (x_hat - batch).pow(2).sum(-1).mean()
        sparsity = (f * params["W_dec"].norm(dim=-1)).sum(-1).mean()
        coefficient = recipe.l1 * min(1.0, step / recipe.l1_warmup)
        loss = mse + coefficient * sparsity
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 250 == 0 or step == recipe.steps:
            l0 = float((f > 0).float().sum(-1).mean())
            history.append((step, float(mse.detach()), l0))
            print(f"step {step:5d}  mse {history[-1][1]:8.3f}  l0 {l0:6.2f}", flush=True)
    return {n: p.detach() for n, p in params.items()}, history


@torch.no_grad()
def reconstruction(sae: SAE, x: torch.Tensor) -> dict[str, float]:
    """Fraction of variance explained, mean L0 and dead features over ``x [tokens, d_in]``.

    >>> sae = sl.load_sae("steerlab-tiny-sae")
    >>> x = lm.run_with_cache(["Once upon a time, there was a cat."], sites=[sae.site])[sae.site][0]
    >>> {k: round(v, 2) for k, v in reconstruction(sae, x).items()}
    {'fraction_variance_explained': 1.0, 'l0': 5.09, 'dead_features': 463, 'tokens': 11}
    """
    f = sae.encode(x)
    x_hat = sae.decode(f)
    fve = 1 - float((x - x_hat).pow(2).sum() / (x - x.mean(0)).pow(2).sum())
    return {
        "fraction_variance_explained": fve,
        "l0": float((f > 0).float().sum(-1).mean()),
        "dead_features": int(((f > 0).sum(0) == 0).sum()),
        "tokens": x.shape[0],
    }


@torch.no_grad()
def concept_features(
    sae: SAE, story_residuals: list[torch.Tensor], labels: list[bool], top: int = 3
) -> list[dict]:
    """Features ranked by Cohen's d of their mean activation per story, pole A against pole B.

    Each story's activation is the mean over its tokens after BOS. Returns the ``top``
    features towards each pole, with d and the mean activation on either side.

    >>> model = AutoModelForCausalLM.from_pretrained(asset_path("steerlab-tiny"))
    >>> tokenizer = AutoTokenizer.from_pretrained(asset_path("steerlab-tiny"))
    >>> stories = [make_story(random.Random(i), positive=i % 2 == 0) for i in range(8)]
    >>> held_out = residuals(model, tokenizer, [s.text for s in stories], 2)
    >>> sae = sl.load_sae("steerlab-tiny-sae")
    >>> concept_features(sae, held_out, [s.positive for s in stories])[0]["feature"]
    165
    """
    means = torch.stack([sae.encode(r[1:]).mean(0) for r in story_residuals])  # [stories, d_sae]
    pole = torch.tensor(labels)
    a, b = means[pole], means[~pole]
    pooled = ((a.var(0) + b.var(0)) / 2).sqrt().clamp_min(1e-6)
    d = (a.mean(0) - b.mean(0)) / pooled
    rows = []
    for sign in (1, -1):
        for i in torch.argsort(sign * d, descending=True)[:top].tolist():
            rows.append({"feature": i, "d": float(d[i]), "mean_a": float(a[:, i].mean()),
                         "mean_b": float(b[:, i].mean())})  # fmt: skip
    return rows


@torch.no_grad()
def steering_rows(model, tokenizer, vectors: dict[str, torch.Tensor], layer: int) -> list[dict]:
    """Concept scores of 32 sampled completions of the neutral prompt, steered by each vector.

    As ``steerlab.toy.evidence``: a plain pre-hook adds the vector at every position of block
    ``layer``'s input; 48 new tokens, temperature 1, seed 0; perplexity under the unsteered model.

    >>> steering_rows(model, tok, {"feature 499 x 16": 16 * sae.W_dec[499]}, 2)  # a minute and more on CPU  # doctest: +SKIP
    """
    rows = []
    for name, vector in vectors.items():
        with add_to_resid_pre(model, layer, vector):
            texts = sample(model, tokenizer, NEUTRAL_PROMPT, n=32, seed=0)
        rows.append({
            "steer": name, "norm": float(vector.norm()),
            "sentiment": mean_concept_score(texts, "sentiment"),
            "sentiment_coverage": concept_coverage(texts, "sentiment"),
            "setting": mean_concept_score(texts, "setting"),
            "perplexity": perplexity(model, [NEUTRAL_PROMPT] * 32, texts, tokenizer),
            "example": texts[0][:80],
        })  # fmt: skip
    return rows


def main(recipe: Recipe, out: Path = TOY_SAES[NAME]) -> dict:
    """Train, measure, and write the SAE folder with its record and card.

    >>> main(Recipe(), Path("/tmp/my-toy-sae"))["held_out"]["l0"]  # trains for minutes  # doctest: +SKIP
    """
    random.seed(recipe.seed)
    torch.manual_seed(recipe.seed)
    torch.set_num_threads(recipe.threads)
    torch.use_deterministic_algorithms(True)
    started = time.perf_counter()
    path = asset_path("steerlab-tiny")
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    x, stories, eval_residuals = _data(model, tokenizer, recipe)
    data_s = time.perf_counter() - started
    print(
        f"{x.shape[0]:,} training tokens, {sum(len(r) for r in eval_residuals):,} held out",
        flush=True,
    )

    t0 = time.perf_counter()
    weights, history = train(x, recipe)
    train_s = time.perf_counter() - t0
    sae = _sae(weights, model, recipe)

    t0 = time.perf_counter()
    measured = _measure(model, tokenizer, sae, stories, eval_residuals, recipe)
    eval_s = time.perf_counter() - t0

    sae.save(out)
    record = {
        "recipe": asdict(recipe),
        "site": recipe.site,
        "training_tokens": x.shape[0],
        "torch": torch.__version__,
        "seconds": {"data": data_s, "train": train_s, "eval": eval_s},
        "history": history,
        **measured,
        "content_hash": sae.content_hash,
    }
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "README.md").write_text(card(record))
    return record


def _data(model: GPT2LMHeadModel, tokenizer, recipe: Recipe) -> tuple[torch.Tensor, list, list]:
    """The training residuals ``[tokens, d_model]``, the held-out stories and their residuals."""
    texts = list(documents(recipe.n_documents, seed=recipe.seed + 1))
    x = torch.cat(residuals(model, tokenizer, texts, recipe.layer))  # [tokens, d_model]
    rng = random.Random(recipe.seed + 2)
    stories = [make_story(rng) for _ in range(recipe.n_eval_stories)]
    eval_residuals = residuals(model, tokenizer, [s.text for s in stories], recipe.layer)
    return x, stories, eval_residuals


def _sae(weights: dict[str, torch.Tensor], model: GPT2LMHeadModel, recipe: Recipe) -> SAE:
    """The trained weights as an ``SAE``, with the metadata SAELens's format carries."""
    metadata = {
        "model_name": "steerlab-tiny",
        "model_config_sha256": config_sha256(model.config),
        "hook_name": recipe.site,
        "trained_by": "steerlab.toy.train_sae",
    }
    return SAE(
        weights["W_enc"], weights["W_dec"], weights["b_enc"], weights["b_dec"], recipe.site,
        model_name="steerlab-tiny", source=NAME, metadata=metadata,
        model_config_sha256=metadata["model_config_sha256"],
    )  # fmt: skip


def _measure(model: GPT2LMHeadModel, tokenizer, sae: SAE, stories: list, eval_residuals: list,
             recipe: Recipe) -> dict:  # fmt: skip
    """The record's measurements, in its order: reconstruction, concept features, steering."""
    held_out = reconstruction(sae, torch.cat(eval_residuals))
    concepts = {
        "sentiment": concept_features(sae, eval_residuals, [s.positive for s in stories]),
        "setting": concept_features(sae, eval_residuals, [s.sea for s in stories]),
    }
    best_pos, best_neg = concepts["sentiment"][0]["feature"], concepts["sentiment"][3]["feature"]
    mean_diff = mean_difference(model, tokenizer, "sentiment", recipe.layer)
    vectors = {"none": torch.zeros_like(mean_diff)}
    vectors[f"mean-diff x {recipe.mean_diff_alpha:g}"] = recipe.mean_diff_alpha * mean_diff
    vectors[f"mean-diff x {-recipe.mean_diff_alpha:g}"] = -recipe.mean_diff_alpha * mean_diff
    for feature in (best_pos, best_neg):
        for alpha in recipe.feature_alphas:
            vectors[f"feature {feature} x {alpha:g}"] = alpha * sae.W_dec[feature]
    steering = steering_rows(model, tokenizer, vectors, recipe.layer)
    cosines = {
        str(i): float(torch.nn.functional.cosine_similarity(sae.W_dec[i], mean_diff, 0))
        for i in (best_pos, best_neg)
    }
    return {
        "held_out": held_out,
        "concepts": concepts,
        "best_sentiment_features": {"positive": best_pos, "negative": best_neg},
        "cosine_with_mean_diff": cosines,
        "mean_diff_norm": float(mean_diff.norm()),
        "decoder_norms": {str(i): float(sae.W_dec[i].norm()) for i in (best_pos, best_neg)},
        "steering": steering,
    }


def card(record: dict) -> str:
    """The model card, every figure taken from ``record``.

    >>> print(card(json.loads((TOY_SAES[NAME] / "training.json").read_text())))
    # steerlab-tiny-sae
    ...
    """
    return "\n".join(_card_method(record) + _card_concepts(record) + _card_steering(record))


def _card_method(record: dict) -> list[str]:
    """The card's title and how the SAE was made and measured."""
    recipe, held = record["recipe"], record["held_out"]
    seconds = record["seconds"]
    return [
        f"# {NAME}",
        "",
        f"A standard (ReLU) sparse autoencoder on `steerlab-tiny`'s `{record['site']}`, shipped with",
        "steerlab in SAELens's format (`cfg.json` + `sae_weights.safetensors`), so",
        '`sl.load_sae("steerlab-tiny-sae")` works offline and SAELens\'s `SAE.load_from_disk` reads it.',
        "",
        "## How it was made",
        "",
        "`python -m steerlab.toy.train_sae` (`make toy-sae`): seed "
        f"{recipe['seed']}, {recipe['threads']} thread, deterministic algorithms.",
        "",
        "| | |",
        "|---|---|",
        f"| site | `{record['site']}` (d_in 128), BOS included |",
        f"| features | {recipe['d_sae']} (4x d_in), ReLU, `apply_b_dec_to_input` on |",
        f"| data | {record['training_tokens']:,} tokens of {recipe['n_documents']:,} documents "
        f"(`steerlab.toy.corpus.documents(seed={recipe['seed'] + 1})`) |",
        f"| training | {recipe['steps']:,} Adam steps x {recipe['batch_tokens']} tokens, lr {recipe['lr']:g}; "
        f"loss = summed squared error + {recipe['l1']:g} x sum(f_i x norm(W_dec[i])), l1 warmed up over "
        f"{recipe['l1_warmup']} steps |",
        f"| wall time | {seconds['data']:.0f} s data + {seconds['train']:.0f} s training + "
        f"{seconds['eval']:.0f} s measuring |",
        "",
        f"## Measured on {recipe['n_eval_stories']} held-out stories ({held['tokens']:,} tokens)",
        "",
        "Stories from `make_story(random.Random(seed + 2))`, which carry their sentiment and setting labels.",
        "",
        "| | |",
        "|---|---|",
        f"| fraction of variance explained | {held['fraction_variance_explained']:.3f} |",
        f"| L0 (mean active features per token) | {held['l0']:.2f} |",
        f"| dead features (never active on these tokens) | {held['dead_features']} of {recipe['d_sae']} |",
    ]


def _card_concepts(record: dict) -> list[str]:
    """The card's table of the features that track each concept."""
    lines = [
        "",
        "## Features that track the concepts",
        "",
        "Per story, each feature's mean activation over its tokens (BOS left out); ranked by",
        "Cohen's d between the two poles (sentiment: positive vs negative; setting: sea vs forest).",
        "",
        "| concept | feature | d | mean on pole A | mean on pole B |",
        "|---|---:|---:|---:|---:|",
    ]
    for concept, rows in record["concepts"].items():
        for row in rows:
            lines.append(
                f"| {concept} | {row['feature']} | {row['d']:+.2f} | {row['mean_a']:.3f} | {row['mean_b']:.3f} |"
            )
    return lines


def _card_steering(record: dict) -> list[str]:
    """The card's comparison of steering by features and by the mean-diff vector."""
    best = record["best_sentiment_features"]
    cos = record["cosine_with_mean_diff"]
    norms = record["decoder_norms"]
    lines = [
        "",
        "## Steering with the best sentiment feature against the mean-diff vector",
        "",
        f"The best positive feature is {best['positive']} and the best negative one {best['negative']}; "
        f"their decoder rows have norms {norms[str(best['positive'])]:.3f} and {norms[str(best['negative'])]:.3f} "
        f"and cosines {cos[str(best['positive'])]:+.2f} and {cos[str(best['negative'])]:+.2f} with the toy's "
        f"sentiment mean-diff vector (norm {record['mean_diff_norm']:.2f}; `steerlab.toy.evidence.mean_difference`, "
        'which `sl.extract(..., token="mean")` reproduces).',
        "`alpha x W_dec[i]` (as `sl.Steer(sae.site, sae.feature(i), alpha)`) is added at every position with a",
        "plain pre-hook; 32 completions of `Once upon a time, there was a`, 48 tokens, temperature 1, seed 0;",
        "perplexity under the unsteered model; sentiment is the share of positive words, setting the share of sea words.",
        "steerlab-tiny stores sentiment and setting along nearly one axis (tutorial 02: cosine about -0.8), so",
        "the setting column shows how far each steer drags the setting along with the sentiment.",
        "",
        "| steer | norm added | sentiment | sentiment coverage | setting | perplexity |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in record["steering"]:
        lines.append(
            f"| {row['steer']} | {row['norm']:.2f} | {_fmt(row['sentiment'])} | {row['sentiment_coverage']:.2f} "
            f"| {_fmt(row['setting'])} | {row['perplexity']:.2f} |"
        )
    return lines + ["", f"Content hash (`sae.content_hash`): `{record['content_hash']}`.", ""]


def _fmt(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2f}"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=Recipe.steps)
    parser.add_argument("--l1", type=float, default=Recipe.l1)
    parser.add_argument("--out", type=Path, default=TOY_SAES[NAME])
    args = parser.parse_args()
    main(Recipe(steps=args.steps, l1=args.l1), args.out)
