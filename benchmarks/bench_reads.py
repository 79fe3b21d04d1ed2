"""Conditions and monitors: what deciding and reading cost, against the same steer without.

- A conditioned steer (``when=``, decided at prefill) against the unconditioned steer, on the
  compiled step at batch 8: the decision is a mask in the table, so a step costs the same.
- Monitors against no monitors, eager (their hooks read one projection per forward); the
  compiled step refuses monitors and says so (``lm.explain``).
- ``find_condition`` over 4 sites x 50 thresholds on 64 prompts: its forward passes counted.

Ratios are ours over the baseline's time, each the median of ``bench_engine.REPEATS`` runs
interleaved with its baseline (1.00 costs the same).
"""

from __future__ import annotations

import time

import torch
from bench_engine import _gpt2_small, _median_pair
from sections import table

import steerlab as sl

SECTION = "## Conditions and monitors"
SITE, READ_SITE = "blocks.6.hook_resid_pre", "blocks.3.hook_resid_post"
NEW = 16


def _row(rows: list[dict], name: str, ours: float, base: float, target: str) -> None:
    ratio = ours / base
    rows.append(dict(comparison=name, ours_s=ours, baseline_s=base, ratio=ratio, target=target))
    print(f"{name:<66} ours {ours:7.3f}s  baseline {base:7.3f}s  ratio {ratio:5.2f}  ({target})")


def run(quick: bool = False) -> tuple[list[dict], list[str]]:
    torch.manual_seed(0)
    model, tokenizer = _gpt2_small()
    lm = sl.wrap(model, tokenizer)
    prompts = [
        f"Prompt number {i} is a little longer than the others" * (1 + i % 2) for i in range(8)
    ]
    vector, reading = torch.randn(768), torch.randn(768)
    plain = sl.Steer(SITE, vector, 4.0, positions="generated")
    cond = sl.Condition(READ_SITE, reading, threshold=0.0, score="projection")
    gated = sl.Steer(SITE, vector, 4.0, positions="generated", when=cond)
    new = 16 if quick else NEW
    rows: list[dict] = []
    notes: list[str] = []

    def gen(model: sl.SteerableModel, steer: sl.Steer, **kw: object) -> object:
        return model.generate(prompts, steer=steer, max_new_tokens=new, stop_at_eos=False, **kw)

    monitor = {"m": (READ_SITE, reading)}
    ours, base = _median_pair(lambda: gen(lm, plain, monitor=monitor), lambda: gen(lm, plain))
    _row(rows, f"GPT-2-small b8, {new} new, eager: with a monitor vs without", ours, base, "<=1.05")
    if not quick:
        fast = sl.wrap(*_gpt2_small()).compile()
        start = time.perf_counter()
        gen(fast, gated)
        notes.append(f"Compile (first call, batch bucket 8): {time.perf_counter() - start:.1f} s.")
        assert fast.explain(prompts, gated).startswith("compiled"), fast.explain(prompts, gated)
        ours, base = _median_pair(lambda: gen(fast, gated), lambda: gen(fast, plain))
        _row(rows, f"GPT-2-small b8, {new} new, compiled: conditioned vs unconditioned", ours,
             base, "<=1.05")  # fmt: skip
        assert fast.explain(prompts, plain, monitor=monitor).startswith("compiled")
        ours, base = _median_pair(lambda: gen(fast, plain, monitor=monitor),
                                  lambda: gen(fast, plain))  # fmt: skip
        _row(rows, f"GPT-2-small b8, {new} new, compiled: with a monitor vs without", ours, base,
             "<=1.05")  # fmt: skip
        notes.append(f"Compiled with a monitor: `{fast.explain(prompts, plain, monitor=monitor)}`.")
    forwards = []
    handle = model.transformer.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        texts = [f"Story {i}: " + ("the sea and the boats" if i % 2 else "the forest and owls")
                 for i in range(64)]  # fmt: skip
        start = time.perf_counter()
        found = sl.find_condition(
            lm,
            texts[1::2],
            texts[::2],
            [f"blocks.{i}.hook_resid_post" for i in range(4)],  # fmt: skip
            thresholds=50,
            batch_size=64,
            progress=False,
        )
        seconds = time.perf_counter() - start
    finally:
        handle.remove()
    notes.append(f"`find_condition`, 4 sites x 2 comparators x up to 50 thresholds on 64 prompts: "
                 f"{len(forwards)} forward pass(es) of 64 prompts, {len(found.table)} grid cells, "
                 f"{seconds:.2f} s.")  # fmt: skip
    return rows, notes


def main(quick: bool = False) -> list[str]:
    rows, notes = run(quick)
    return [
        SECTION,
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        f"`benchmarks/bench_reads.py` ({torch.get_num_threads()} CPU threads, torch "
        f"{torch.__version__}). GPT-2-small-shaped random model, 8 prompts; the steer at "
        f"`{SITE}`, the condition and the monitor read `{READ_SITE}`. `ratio` is ours over the "
        "baseline's time (1.00 costs the same).",
        "",
        *table(rows, digits=3),
        "",
        *(f"- {n}" for n in notes),
    ]


if __name__ == "__main__":
    import sys

    from sections import replace_section

    replace_section(main(quick="--quick" in sys.argv))
