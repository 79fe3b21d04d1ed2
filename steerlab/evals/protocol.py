"""AxBench's scoring rules over a benchmark's samples: each sample rated by the judge and
scored by the harmonic mean of its three ratings (0 if any is 0, an unreadable rating 0 and
counted); per method and concept, the factor with the highest selection-split mean, reported
by its test-split mean; the leaderboard, the mean over concepts."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from steerlab.core.concepts import ConceptData
from steerlab.core.errors import SteerError
from steerlab.core.scalars import as_int, as_real
from steerlab.core.table import Table
from steerlab.evals.intervals import mean_of_means_interval
from steerlab.evals.judge import harmonic_mean
from steerlab.evals.methods import Method, Prompting

RATINGS = ("concept_rating", "instruction_rating", "fluency_rating")
_FORMATS = {"factor": "g", "selection": ".3f", "score": ".3f", "concept_rating": ".3f",
            "instruction_rating": ".3f", "fluency_rating": ".3f", "low": ".3f", "high": ".3f",
            "auroc": ".3f"}  # fmt: skip


def judge_workers(judge: Any) -> int:
    """How many ratings a judge takes at once: its ``max_workers``, 8 when it has none; an
    int >= 1, refused by name otherwise."""
    workers = getattr(judge, "max_workers", 8)
    count = as_int(workers)
    if count is None or count < 1:
        raise SteerError(f"The judge's max_workers must be an int >= 1; got {workers!r:.40}.",
                         "max_workers")  # fmt: skip
    return count


def rate_samples(judge: Any, samples: list[dict[str, Any]], done: Any) -> int:
    """Every sample's ratings, requests concurrently; returns the unreadable ones' count.
    A rating is any real number in [0, 2] (numpy's, a 0-d tensor, a fraction ...);
    anything else is unreadable."""
    pool = ThreadPoolExecutor(judge_workers(judge))
    try:
        jobs = [pool.submit(judge.rate, s["concept"], s["instruction"], s["text"])
                for s in samples]  # fmt: skip
        ratings = []
        for job in jobs:
            ratings.append(job.result())
            done()
    finally:  # a judge that fails stops the run: the ratings not yet asked are not asked
        pool.shutdown(cancel_futures=True)
    failures = 0
    for sample, values in zip(samples, ratings):
        kept, failed = [], False
        for value in _three(values):
            number = as_real(value)
            if number is None or not 0 <= number <= 2:  # unreadable: scored 0 and counted
                number, failed, failures = 0.0, True, failures + 1
            kept.append(number)
        sample.update(zip(RATINGS, kept))
        sample["score"] = harmonic_mean(kept)
        sample["parse_failed"] = failed
    return failures


def _three(values: Any) -> tuple[Any, Any, Any]:
    try:
        concept, instruction, fluency = values
    except (TypeError, ValueError):
        raise SteerError(f"judge.rate must return (concept, instruction, fluency); it returned "
                         f"{values!r:.80}.") from None  # fmt: skip
    return concept, instruction, fluency


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def factor_table(samples: list[dict[str, Any]], concepts: list[ConceptData],
           methods: list[Method | Prompting]) -> Table:  # fmt: skip
    """Per method and concept: the factor with the highest selection-split mean, its
    test-split mean and the three ratings' means there."""
    records = []
    for method in methods:
        for data in concepts:
            mine = [s for s in samples if s["method"] == method.name and s["concept"] == data.name]
            factors = list(dict.fromkeys(s["factor"] for s in mine))
            chosen_by = {f: _mean([s["score"] for s in mine
                                   if s["factor"] == f and s["split"] == "selection"])
                         for f in factors}  # fmt: skip
            best = max(factors, key=lambda f: chosen_by[f])  # ties: the first in the grid
            test = [s for s in mine if s["factor"] == best and s["split"] == "test"]
            record = {"method": method.name, "concept": data.name, "factor": best,
                      "selection": chosen_by[best], "score": _mean([s["score"] for s in test])}  # fmt: skip
            record.update({c: _mean([s[c] for s in test]) for c in RATINGS})
            record["n"] = len(test)
            records.append(record)
    columns = ["method", "concept", "factor", "selection", "score", *RATINGS, "n"]
    return Table("benchmark: factor chosen on the selection split, scored on the test split "
                 "(harmonic mean of three 0-2 ratings)", columns, records, _FORMATS)  # fmt: skip


def leaderboard_table(samples: list[dict[str, Any]], table: Table,
                 methods: list[Method | Prompting], level: float, n_boot: int,
                 seed: int) -> Table:  # fmt: skip
    """Per method: the mean over concepts of the test score at each concept's chosen
    factor, with a bootstrap interval (samples resampled within each concept), best first."""
    records: list[dict[str, Any]] = []
    for method in methods:
        groups = []
        for row in (r for r in table if r["method"] == method.name):
            groups.append([s["score"] for s in samples
                           if s["method"] == method.name and s["concept"] == row["concept"]
                           and s["factor"] == row["factor"] and s["split"] == "test"])  # fmt: skip
        estimate = mean_of_means_interval(groups, level=level, n_boot=n_boot, seed=seed)
        records.append({"method": method.name, "score": estimate.value, "low": estimate.low,
                        "high": estimate.high, "concepts": len(groups)})  # fmt: skip
    records.sort(key=lambda r: -float(r["score"]) if not math.isnan(r["score"]) else math.inf)
    return Table(f"leaderboard: mean test score over concepts, {level:.0%} bootstrap interval",
                 ["method", "score", "low", "high", "concepts"], records, _FORMATS)  # fmt: skip
