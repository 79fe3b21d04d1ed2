"""A benchmark run as a pipeline: the judge rates one cell while the model generates the
next, so a run takes about as long as the slower of the two, not their sum.

20 concepts x 3 methods (mean difference, the random control, a written prompt) on the toy,
kept in a run folder, rated by a stub judge that answers each rating after 50 ms with 8
workers. Both arms come from the same run: generation alone is the model's time (making,
generating, detecting), judging alone the time any rating was running; the target is a wall
time of at most 1.15x the larger.

    .venv/bin/python benchmarks/bench_research_run.py     # rewrites its section of RESULTS.md
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from sections import table  # noqa: E402

import steerlab as sl  # noqa: E402
import steerlab.toy as toy  # noqa: E402
from steerlab.evals.methods import BUILT_IN  # noqa: E402

SECTION = "## Evaluation: a research run (judge and generation overlap)"
SITE = "blocks.2.hook_resid_pre"
CONCEPTS, NEW, DELAY = 20, 8, 0.05
FACTORS = [0.5, 1.0, 2.0, 4.0]


class SlowJudge:
    """Answers every rating after ``DELAY`` seconds, as a remote judge would."""

    max_workers = 8
    model = "stub-50ms"

    def rate(self, concept: str, instruction: str, text: str) -> tuple[float, float, float]:
        time.sleep(DELAY)
        return float(len(text) % 3), 2.0, 1.0 + len(text) % 2


def run() -> tuple[list[dict[str, object]], list[str]]:
    lm = sl.load("steerlab-tiny", backend="hf")
    base = [toy.concept_data("sentiment", lm=lm, n=8), toy.concept_data("setting", lm=lm, n=8)]
    data = [sl.evals.ConceptData(f"{base[k % 2].name} #{k}", positives=base[k % 2].positives,
                                 negatives=base[k % 2].negatives,
                                 instructions=base[k % 2].instructions[:6])
            for k in range(CONCEPTS)]  # fmt: skip
    # each concept's steers made once up front: the run's model time is its generations
    made = {(name, k): BUILT_IN[name].make(lm, base[k], SITE)
            for name in ("mean_diff", "random") for k in (0, 1)}  # fmt: skip

    def method(name: str) -> sl.evals.Method:
        return sl.evals.Method(name, make=lambda lm, d, site: made[(name, int(d.name[-1]) % 2)],
                               factors=FACTORS)  # fmt: skip

    methods = [method("mean_diff"), method("random")]
    methods.append(sl.evals.Prompting("Always write about the concept."))  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        res = sl.evals.benchmark(lm, data, methods, site=SITE, judge=SlowJudge(),
                                 max_new_tokens=NEW, seed=0, n_boot=100, progress=False,
                                 run=Path(folder) / "run")  # fmt: skip
        wall = time.perf_counter() - start
    model = res.seconds["make"] + res.seconds["generate"] + res.seconds["detect"]
    judging = res.seconds["judge"]
    rows: list[dict[str, object]] = [dict(
        comparison=f"a run of {CONCEPTS} concepts x 3 methods ({len(res.samples)} samples, "
                   f"{NEW} new tokens; judge 50 ms a rating, 8 workers) vs the slower of its "
                   f"generation alone ({model:.1f} s) and its judging alone ({judging:.1f} s)",
        ours_s=wall, baseline_s=max(model, judging), ratio=wall / max(model, judging),
        target="<= 1.15")]  # fmt: skip
    notes = [f"Generation and judging run one after the other would take {model + judging:.1f} "
             f"s; the pipeline took {wall:.1f} s."]  # fmt: skip
    print(rows[0], notes[0], sep="\n")
    return rows, notes


def main() -> list[str]:
    rows, notes = run()
    return [
        SECTION,
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        f"`benchmarks/bench_research_run.py` ({torch.get_num_threads()} CPU threads, torch "
        f"{torch.__version__}), steerlab-tiny on the hf backend, kept in a run folder. `ratio` "
        "is the wall time over the larger of the two phases' own times in the same run.",
        "",
        *table(rows),
        "",
        *notes,
    ]


if __name__ == "__main__":
    from sections import replace_section

    replace_section(main())
