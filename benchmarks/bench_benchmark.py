"""``sl.evals.benchmark``: its generation phase against one plain ``lm.generate`` of the same
rows, and a whole run on the toy against the issue's 60-second target.

Each method and concept is one engine call: every instruction x factor a row, per-row
alphas. The first comparison times that call inside ``benchmark`` (its ``seconds
["generate"]``) against ``lm.generate`` of the same inputs and steers, medians of
interleaved runs. The second times a whole benchmark (3 methods x 2 concepts x 14 factors x
10 instructions, ``ToyJudge`` rating every sample) end to end.

    .venv/bin/python benchmarks/bench_benchmark.py     # rewrites its section of RESULTS.md
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from sections import table  # noqa: E402

import steerlab as sl  # noqa: E402
import steerlab.toy as toy  # noqa: E402
from steerlab.core.rows import as_steers  # noqa: E402
from steerlab.core.steer import at_alphas  # noqa: E402
from steerlab.evals.methods import BUILT_IN  # noqa: E402

SECTION = "## Evaluation: the benchmark protocol"
SITE = "blocks.2.hook_resid_pre"
NEW = 64  # the toy's window is 128 tokens: a chat-templated ask and 64 new tokens fit
REPEATS = 3


def run() -> tuple[list[dict[str, object]], list[str]]:
    lm = sl.load("steerlab-tiny", backend="hf")
    data = [toy.concept_data("sentiment", lm=lm), toy.concept_data("setting", lm=lm)]
    judge = toy.ToyJudge(lm)
    steer = BUILT_IN["mean_diff"].make(lm, data[0], SITE)
    factors = list(BUILT_IN["mean_diff"].factors)
    fixed = sl.evals.Method("fixed", make=lambda lm, d, site: steer, factors=factors)
    rows_in = list(data[0].instructions)

    def phase() -> float:
        res = sl.evals.benchmark(lm, data[0], [fixed], site=SITE, judge=judge,
                                 max_new_tokens=NEW, seed=0, progress=False)  # fmt: skip
        return res.seconds["generate"]

    def plain() -> float:
        start = time.perf_counter()
        lm.generate(rows_in, at_alphas(as_steers(steer), factors), max_new_tokens=NEW,
                    temperature=1.0, seed=0, chat=True)  # fmt: skip
        return time.perf_counter() - start

    phase(), plain()
    ours, base = [], []
    for _ in range(REPEATS):
        ours.append(phase())
        base.append(plain())
    t_ours, t_base = statistics.median(ours), statistics.median(base)
    rows: list[dict[str, object]] = [dict(
        comparison=f"generation phase of one method x concept ({len(rows_in)} instructions x "
                   f"{len(factors)} factors, {NEW} new tokens) vs one lm.generate of the rows",
        ours_s=t_ours, baseline_s=t_base, ratio=t_base / t_ours, target=">= 0.8 (<= 1.25x)")]  # fmt: skip
    start = time.perf_counter()
    res = sl.evals.benchmark(lm, data, ["mean_diff", "pca", "random"], site=SITE, judge=judge,
                             max_new_tokens=NEW, seed=0, progress=False)  # fmt: skip
    whole = time.perf_counter() - start
    notes = [f"A whole run, 3 methods x 2 concepts x 14 factors x 10 instructions "
             f"({len(res.samples)} samples, {NEW} new tokens, ToyJudge): **{whole:.1f} s** "
             "(target < 60 s); by phase: "
             + ", ".join(f"{k} {v:.1f} s" for k, v in res.seconds.items()) + "."]  # fmt: skip
    print(rows[0], notes[0], sep="\n")
    return rows, notes


def main() -> list[str]:
    rows, notes = run()
    return [
        SECTION,
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        f"`benchmarks/bench_benchmark.py` ({torch.get_num_threads()} CPU threads, torch "
        f"{torch.__version__}), steerlab-tiny on the hf backend, sampled at temperature 1 with "
        f"one seed. `ratio` is lm.generate's time over the benchmark's generation phase, "
        f"medians of {REPEATS} interleaved runs.",
        "",
        *table(rows),
        "",
        *notes,
    ]


if __name__ == "__main__":
    from sections import replace_section

    replace_section(main())
