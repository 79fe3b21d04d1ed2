"""AxBench's scoring rules over a benchmark's samples: each sample rated by the judge and
scored by the harmonic mean of its three ratings (0 if any is 0, an unreadable rating 0 and
counted); per method and concept, the factor with the highest selection-split mean, reported
by its test-split mean; the leaderboard, the mean over concepts."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from steerlab.core.errors import SteerError
from steerlab.core.scalars import as_int, as_real
from steerlab.core.table import Table
from steerlab.evals.intervals import mean_of_means_interval
from steerlab.evals.judge import harmonic_mean

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


def raw_ratings(values: Any) -> tuple[float | None, float | None, float | None]:
    """A judge's answer as three numbers as given, None where it gave no number (or nan);
    refused unless it is three values."""
    out = [as_real(value) for value in _three(values)]  # numpy's, a 0-d tensor, a fraction
    return out[0], out[1], out[2]


def score_sample(sample: dict[str, Any], raw: tuple[float | None, ...]) -> int:
    """Write AxBench's reading of three raw ratings into ``sample``: each missing or outside
    [0, 2] counts 0 and marks a parse failure; the score is their harmonic mean. Returns how
    many of the three were unreadable."""
    ok = [r is not None and math.isfinite(r) and 0 <= r <= 2 for r in raw]
    kept = [float(r) if good and r is not None else 0.0 for r, good in zip(raw, ok)]
    sample.update(zip(RATINGS, kept))
    sample["score"] = harmonic_mean(kept)
    sample["parse_failed"] = not all(ok)
    return ok.count(False)


def _three(values: Any) -> tuple[Any, Any, Any]:
    try:
        concept, instruction, fluency = values
    except (TypeError, ValueError):
        raise SteerError(f"judge.rate must return (concept, instruction, fluency); it returned "
                         f"{values!r:.80}.") from None  # fmt: skip
    return concept, instruction, fluency


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def factor_table(samples: list[dict[str, Any]], concepts: list[str],
                 methods: list[str]) -> Table:  # fmt: skip
    """Per method and concept (by name): the factor with the highest selection-split mean,
    its test-split mean and the three ratings' means there; a cell without samples (a run
    not finished) has no row."""
    records = []
    for method in methods:
        for concept in concepts:
            mine = [s for s in samples if s["method"] == method and s["concept"] == concept]
            if not mine:
                continue
            factors = list(dict.fromkeys(s["factor"] for s in mine))
            chosen_by = {f: _mean([s["score"] for s in mine
                                   if s["factor"] == f and s["split"] == "selection"])
                         for f in factors}  # fmt: skip
            best = max(factors, key=lambda f: chosen_by[f])  # ties: the first in the grid
            test = [s for s in mine if s["factor"] == best and s["split"] == "test"]
            record = {"method": method, "concept": concept, "factor": best,
                      "selection": chosen_by[best], "score": _mean([s["score"] for s in test])}  # fmt: skip
            record.update({c: _mean([s[c] for s in test]) for c in RATINGS})
            record["n"] = len(test)
            record["empty"] = sum(not s["text"].strip() for s in mine)
            record["degenerate"] = degenerate([s["text"] for s in mine if s["factor"] == best])
            records.append(record)
    columns = ["method", "concept", "factor", "selection", "score", *RATINGS, "n", "empty",
               "degenerate"]  # fmt: skip
    return Table("benchmark: factor chosen on the selection split, scored on the test split "
                 "(harmonic mean of three 0-2 ratings)", columns, records, _FORMATS)  # fmt: skip


def degenerate(texts: list[str]) -> bool:
    """Whether more than half of ``texts`` are one and the same text (empty or blank texts
    all count as one): a score over them says little about steering.

    >>> degenerate(["", " ", "a", "b"]), degenerate(["", " ", "", "b"]), degenerate(["a", "b"])
    (False, True, False)
    """
    counts = Counter(t.strip() for t in texts)
    return bool(texts) and max(counts.values()) > len(texts) / 2


def leaderboard_table(samples: list[dict[str, Any]], table: Table, methods: list[str],
                      level: float, n_boot: int, seed: int) -> Table:  # fmt: skip
    """Per method: the mean over concepts of the test score at each concept's chosen
    factor, with a bootstrap interval (samples resampled within each concept), best first."""
    records: list[dict[str, Any]] = []
    for method in methods:
        groups = []
        for row in (r for r in table if r["method"] == method):
            groups.append([s["score"] for s in samples
                           if s["method"] == method and s["concept"] == row["concept"]
                           and s["factor"] == row["factor"] and s["split"] == "test"])  # fmt: skip
        if not groups:
            continue
        estimate = mean_of_means_interval(groups, level=level, n_boot=n_boot, seed=seed)
        flagged = sum(bool(r["degenerate"]) for r in table if r["method"] == method)
        records.append({"method": method, "score": estimate.value, "low": estimate.low,
                        "high": estimate.high, "concepts": len(groups),
                        "degenerate": flagged})  # fmt: skip
    records.sort(key=lambda r: -float(r["score"]) if not math.isnan(r["score"]) else math.inf)
    return Table(f"leaderboard: mean test score over concepts, {level:.0%} bootstrap interval",
                 ["method", "score", "low", "high", "concepts", "degenerate"], records,
                 _FORMATS)  # fmt: skip
