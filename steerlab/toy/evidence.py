"""Proof that the toy asset steers, using nothing but plain HF modules and forward hooks.

Deliberately independent of steerlab's engine: the asset must be validated on its own,
and the engine's tests can then compare against these numbers. ``python -m
steerlab.toy.evidence`` prints the effect-vs-fluency tables in the model card.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import GPT2LMHeadModel, PreTrainedTokenizerBase

from steerlab.toy.metrics import concept_coverage, mean_concept_score, perplexity

NEUTRAL_PROMPT = "Once upon a time, there was a"

# Contrastive openings: each pair differs only in the concept's words.
CONTRAST_PAIRS: dict[str, list[tuple[str, str]]] = {
    "sentiment": [
        ("Mia the fox was happy and smiled.", "Mia the fox was sad and cried."),
        ("Tom felt glad. The day was bright.", "Tom felt scared. The day was gloomy."),
        ("Lily laughed. Everything was lovely.", "Lily sighed. Everything was terrible."),
        ("Ben was cheerful and full of joy.", "Ben was lonely and full of fear."),
        ("Anna sang, warm and happy.", "Anna frowned, cold and sad."),
        ("Sam smiled with hope and love.", "Sam cried with pain and sorrow."),
        ("It was a wonderful, bright day.", "It was a terrible, broken day."),
        ("Max laughed and felt glad.", "Max sighed and felt scared."),
    ],
    "setting": [
        ("Mia the fox lived by the sea.", "Mia the fox lived in the forest."),
        ("Tom walked along the beach.", "Tom walked along the trail."),
        ("The waves rolled over the sand.", "The leaves rustled in the trees."),
        ("Lily found a shell on the shore.", "Lily found an acorn in the woods."),
        ("Ben saw a crab and a boat.", "Ben saw an owl and a fern."),
        ("The gulls flew over the water.", "The owls hooted among the pines."),
        ("Anna looked at the ocean.", "Anna looked at the grove."),
        ("A starfish lay in the bay.", "A mushroom grew in the glade."),
    ],
}


@contextmanager
def add_to_resid_pre(model: GPT2LMHeadModel, layer: int, vector: torch.Tensor) -> Iterator[None]:
    """Add ``vector`` to the input of block ``layer`` (``hook_resid_pre``) at every position.

    >>> # with add_to_resid_pre(model, 2, 4.0 * v): model(ids)
    """

    def hook(module, args, kwargs):
        if args:
            return (args[0] + vector, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + vector}

    handle = model.transformer.h[layer].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@torch.no_grad()
def resid_pre(model: GPT2LMHeadModel, tokenizer, text: str, layer: int) -> torch.Tensor:
    """Residual stream entering block ``layer`` for ``text``: ``[pos, d_model]``, BOS included."""
    captured: list[torch.Tensor] = []

    def hook(module, args, kwargs):
        captured.append((args[0] if args else kwargs["hidden_states"])[0])

    handle = model.transformer.h[layer].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        model(torch.tensor([tokenizer(text).input_ids]))
    finally:
        handle.remove()
    return captured[0]


def mean_difference(model: GPT2LMHeadModel, tokenizer, concept: str, layer: int) -> torch.Tensor:
    """Pole A minus pole B: mean resid_pre over each opening's tokens (BOS skipped), averaged.

    >>> # v = mean_difference(model, tok, "sentiment", layer=2)  # [d_model]
    """

    def mean_over(texts: list[str]) -> torch.Tensor:
        return torch.stack([resid_pre(model, tokenizer, t, layer)[1:].mean(0) for t in texts]).mean(
            0
        )

    pairs = CONTRAST_PAIRS[concept]
    return mean_over([a for a, _ in pairs]) - mean_over([b for _, b in pairs])


@torch.no_grad()
def sample(
    model: GPT2LMHeadModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    n: int = 32,
    max_new_tokens: int = 48,
    temperature: float = 1.0,
    seed: int = 0,
) -> list[str]:
    """``n`` sampled completions of ``prompt`` (text after the prompt, cut at EOS).

    >>> # sample(model, tok, "Once upon a time,", n=2)
    """
    generator = torch.Generator().manual_seed(seed)
    prompt_ids = tokenizer(prompt).input_ids
    ids = torch.tensor([prompt_ids] * n)  # [n, pos]
    for _ in range(max_new_tokens):
        logits = model(ids[:, -model.config.n_positions :]).logits[:, -1]  # [n, vocab]
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], dim=1)
    texts: list[str] = []
    for row in ids[:, len(prompt_ids) :].tolist():
        if tokenizer.eos_token_id in row:
            row = row[: row.index(tokenizer.eos_token_id)]
        texts.append(str(tokenizer.decode(row, skip_special_tokens=True)))
    return texts


@dataclass(frozen=True)
class Row:
    """One alpha's effect (concept score) and fluency (perplexity under the unsteered model)."""

    alpha: float
    score: float
    coverage: float
    perplexity: float
    example: str


def sweep(
    model: GPT2LMHeadModel,
    tokenizer: PreTrainedTokenizerBase,
    concept: str,
    layer: int,
    alphas: list[float],
    prompt: str = NEUTRAL_PROMPT,
    n: int = 32,
    seed: int = 0,
) -> list[Row]:
    """Steer with ``alpha * mean_difference`` for each alpha; score the sampled completions.

    >>> # sweep(model, tok, "sentiment", 2, [0.0, 4.0, -4.0])[0].score  # baseline near 0.5
    """
    vector = mean_difference(model, tokenizer, concept, layer)
    rows = []
    for alpha in alphas:
        with add_to_resid_pre(model, layer, alpha * vector):
            texts = sample(model, tokenizer, prompt, n=n, seed=seed)
        rows.append(
            Row(
                alpha,
                mean_concept_score(texts, concept),
                concept_coverage(texts, concept),
                perplexity(model, [prompt] * n, texts, tokenizer),
                texts[0],
            )
        )
    return rows


def format_table(concept: str, layer: int, rows: list[Row]) -> str:
    """Markdown table of a sweep."""
    lines = [
        f"**{concept}**, layer {layer} resid_pre, {NEUTRAL_PROMPT!r}",
        "",
        "| alpha | concept score | coverage | perplexity | first sample |",
        "|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.alpha:g} | {r.score:.2f} | {r.coverage:.2f} | {r.perplexity:.2f} | {r.example[:70]!r} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from steerlab.toy import asset_path

    torch.set_num_threads(2)
    path = asset_path("steerlab-tiny")
    lm = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    for name in ("sentiment", "setting"):
        print(
            format_table(
                name, 2, sweep(lm, tok, name, 2, [-8, -4, -3, -2.5, -2, -1, 0, 1, 2, 2.5, 3, 4, 8])
            )
        )
        print()
