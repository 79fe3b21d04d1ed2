"""Benchmark: ``sweep`` (all alphas in one batch per layer) against one generation per cell.

8 alphas x 4 layers x 8 prompts on ``steerlab-tiny`` when its asset exists, else on a
random GPT-2 of about the same size. Both sides compute the same metrics (score,
perplexity under the unsteered model, first-token KL). Writes ``RESULTS_sweep.md``.

    .venv/bin/python benchmarks/bench_sweep.py [MODEL_FOLDER]

A folder argument (an HF-format GPT-2, e.g. a fresh ``steerlab.toy.train`` output)
replaces the toy asset.
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import torch

import steerlab as sl
from steerlab.vectors import extract, sweep
from steerlab.vectors.scoring import (
    completion_nll,
    kl_divergence,
    next_token_logprobs,
    pooled_perplexity,
)

ALPHAS = [-8.0, -4.0, -2.0, 0.0, 2.0, 4.0, 6.0, 8.0]
PROMPTS = [
    "Once upon a time, there was a",
    "One day, a little fox",
    "Mia looked at the",
    "The sun was",
    "Tom and Lily went to the",
    "In the morning, Ben",
    "There was a small",
    "Anna said,",
]
POSITIVE = ["Mia was happy and smiled.", "It was a wonderful, sweet day."]
NEGATIVE = ["Mia was sad and cried.", "It was a grim, rotten day."]
MAX_NEW_TOKENS = 24


def model(folder: str | None = None) -> tuple[sl.SteerableModel, str]:
    from steerlab.toy import asset_path

    if folder is not None:
        return sl.load(folder, backend="hf"), folder
    if (asset_path("steerlab-tiny") / "config.json").exists():
        return sl.load("steerlab-tiny", backend="hf"), "steerlab-tiny"
    from steerlab.testing import char_tokenizer, tiny_model

    random_gpt2 = tiny_model("gpt2", n_layers=4, d_model=128, n_ctx=256)
    return sl.wrap(random_gpt2, char_tokenizer()), "random GPT-2 (4 layers, d_model 128)"


def score(text: str) -> float:
    return sum(c.isalpha() for c in text) / max(len(text), 1)


def naive(lm, vec, layers) -> list[dict]:
    """One prompt and one alpha per ``generate`` call, every metric row by row."""
    options = dict(max_new_tokens=MAX_NEW_TOKENS)
    base = {p: next_token_logprobs(lm, [p]) for p in PROMPTS}
    for p in PROMPTS:  # the baseline, as sweep computes it
        gen = lm.generate(p, **options)
        completion_nll(lm, gen.prompt_tokens, gen.tokens)
    records = []
    for layer in layers:
        site = f"blocks.{layer}.hook_resid_pre"
        for alpha in ALPHAS:
            texts, nlls, kls = [], [], []
            for p in PROMPTS:
                steers = vec.at(site).steers(alpha=alpha)
                gen = lm.generate(p, steers, **options)
                texts.append(gen.text[0])
                nlls += completion_nll(lm, gen.prompt_tokens, gen.tokens)
                kls.append(float(kl_divergence(next_token_logprobs(lm, [p], steers), base[p])[0]))
            records.append(
                {
                    "site": site,
                    "alpha": alpha,
                    "texts": texts,
                    "perplexity": pooled_perplexity(nlls),
                    "score": sum(map(score, texts)) / len(texts),
                    "kl": sum(kls) / len(kls),
                }  # fmt: skip
            )
    return records


def main() -> None:
    # One thread: on a shared, busy CPU, torch's two-thread kernels stall waiting for a
    # descheduled partner (batched ops measured 30x slower), which would time the machine.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    lm, which = model(sys.argv[1] if len(sys.argv) > 1 else None)
    print(f"model: {which}")
    layers = list(range(4))  # every layer of a 4-layer model
    sites = [f"blocks.{i}.hook_resid_pre" for i in layers]
    vec = extract(lm, POSITIVE, NEGATIVE, sites, progress=False).relative() / 4

    lm.generate(PROMPTS[0], max_new_tokens=2)  # warm-up
    start = time.perf_counter()
    table = sweep(lm, vec, PROMPTS, ALPHAS, layers=layers, score=score,
                  max_new_tokens=MAX_NEW_TOKENS, progress=False)  # fmt: skip
    t_sweep = time.perf_counter() - start
    start = time.perf_counter()
    cells = naive(lm, vec, layers)
    t_naive = time.perf_counter() - start

    same = sum(
        c["texts"] == table.completions[c["site"], c["alpha"]] for c in cells
    )  # batched rows should equal rows generated alone
    ratio = t_sweep / t_naive
    grid = f"{len(ALPHAS)} alphas x {len(layers)} layers x {len(PROMPTS)} prompts"
    lines = [
        "# Sweep benchmark",
        "",
        f"{grid}, {MAX_NEW_TOKENS} new tokens, greedy, on {which} (hf backend, CPU, "
        f"{torch.get_num_threads()} threads, {platform.machine()}).",
        "Both sides compute score, perplexity under the unsteered model and first-token KL.",
        "",
        "| method | generate calls | time (s) |",
        "|---|---:|---:|",
        f"| `sl.sweep` (all prompts x alphas in one batch per layer) | {1 + len(layers)} | {t_sweep:.2f} |",
        f"| naive loop (one prompt, one alpha per call) | {len(PROMPTS) * (1 + len(layers) * len(ALPHAS))} | {t_naive:.2f} |",
        f"| **ratio sweep / naive** | | **{ratio:.3f}x** (target <= 0.25x) |",
        "",
        f"Cells whose completions match the naive loop exactly: {same}/{len(cells)}.",
        "Measured in one run on a shared machine: a figure, not a guarantee.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    (Path(__file__).parent / "RESULTS_sweep.md").write_text(text)


if __name__ == "__main__":
    main()
