"""``sl.evals.steerability``: one batched pass against the loop a researcher would write.

The naive loop runs, for each prompt and alpha, one ``generate`` call, one fluency score
of that completion and one pair of forwards for the first-token KL. steerability runs all
prompts x alphas in one ``generate``, one scoring pass and one forward. Greedy decoding, so
both produce the same completions (checked before timing). Medians of interleaved runs.

    .venv/bin/python benchmarks/bench_evals.py     # rewrites its section of RESULTS.md
"""

from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from sections import table  # noqa: E402

import steerlab as sl  # noqa: E402
from steerlab.evals import steerability  # noqa: E402
from steerlab.vectors.scoring import (  # noqa: E402
    completion_nll,
    kl_divergence,
    next_token_logprobs,
)

SECTION = "## Evaluation: steerability"
ALPHAS = [-8.0, -4.0, 0.0, 4.0, 8.0]


def naive(lm: sl.SteerableModel, steer: sl.Steer, prompts: list[str], new: int) -> list[str]:
    """The loop: one generate, one fluency score and one KL per prompt and alpha."""
    texts = []
    for prompt in prompts:
        for alpha in ALPHAS:
            one = sl.Steer(steer.site, steer.vector, alpha)
            gen = lm.generate(prompt, one, max_new_tokens=new, temperature=0.0)
            completion_nll(lm, gen.prompt_tokens, gen.tokens)
            steered = next_token_logprobs(lm, prompt, [one])
            kl_divergence(steered, next_token_logprobs(lm, prompt))
            texts.append(gen.text[0])
    return texts


def batched(lm: sl.SteerableModel, steer: sl.Steer, prompts: list[str], new: int) -> list[str]:
    res = steerability(lm, steer, prompts, ALPHAS, max_new_tokens=new, temperature=0.0,
                       n_boot=200, progress=False)  # fmt: skip
    return [r["text"] for r in res.rows]


def run() -> list[dict[str, object]]:
    from bench_engine import PROMPT, _gpt2_small, _median_pair

    rows: list[dict[str, object]] = []
    toy = sl.load("steerlab-tiny")
    toy_steer = sl.Steer("blocks.2.hook_resid_pre", torch.randn(toy.d_model), alpha=1.0)
    model, tokenizer = _gpt2_small()
    small = sl.wrap(model, tokenizer)
    small_steer = sl.Steer("blocks.6.hook_resid_pre", torch.randn(768), alpha=1.0)
    cases = [
        ("steerlab-tiny, 8 prompts x 5 alphas, 32 new tokens", toy, toy_steer,
         [f"Once upon a time, story {i}:" for i in range(8)], 32),
        ("GPT-2-small shape, 2 prompts x 5 alphas, 16 new tokens", small, small_steer,
         [f"{PROMPT} {i}" for i in range(2)], 16),
    ]  # fmt: skip
    for name, lm, steer, prompts, new in cases:
        a, b = batched(lm, steer, prompts, new), naive(lm, steer, prompts, new)
        assert a == b, "the batched and naive runs must produce the same completions"
        ours, base = _median_pair(partial(batched, lm, steer, prompts, new),
                                  partial(naive, lm, steer, prompts, new))  # fmt: skip
        rows.append(dict(comparison=f"steerability vs a per-row loop: {name}", ours_s=ours,
                         baseline_s=base, ratio=base / ours, target=">= 3x"))  # fmt: skip
        print(f"{name:<60} ours {ours:6.2f}s  loop {base:6.2f}s  speedup {base / ours:5.2f}x")
    return rows


def main() -> list[str]:
    rows = run()
    return [
        SECTION,
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        f"`benchmarks/bench_evals.py` ({torch.get_num_threads()} CPU threads, torch "
        f"{torch.__version__}). Greedy; both sides produce the same completions and the same "
        "scores (perplexity under the unsteered model, first-token KL). `ratio` is the loop's "
        "time over steerability's (>1 is faster).",
        "",
        *table(rows),
    ]


if __name__ == "__main__":
    from sections import replace_section

    replace_section(main())
