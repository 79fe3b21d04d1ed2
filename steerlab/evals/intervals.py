"""Bootstrap confidence intervals for per-completion measurements.

Each statistic is computed on the completions themselves and on ``n_boot`` resamples of
them (drawn with replacement, seeded), and the interval is the resamples' percentiles
(the percentile bootstrap; Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993).
With one completion, or none that counts, the interval is ``(nan, nan)``: one value says
nothing about its spread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from steerlab.core.scalars import as_int, list_of


@dataclass(frozen=True)
class Estimate:
    """A statistic with its bootstrap interval at ``level``."""

    value: float
    low: float
    high: float

    def __format__(self, spec: str) -> str:
        spec = spec or ".3g"
        if math.isnan(self.low):
            return format(self.value, spec)
        return f"{self.value:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


def _draws(n: int, n_boot: int, seed: int) -> np.ndarray:  # [n_boot, n] row indices
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def _percentiles(stats: np.ndarray, level: float) -> tuple[float, float]:
    kept = stats[~np.isnan(stats)]
    if kept.size == 0:
        return math.nan, math.nan
    tail = 50 * (1 - level)
    low, high = np.percentile(kept, [tail, 100 - tail])
    return float(low), float(high)


def check_bootstrap(level: float, n_boot: int) -> None:
    """Refuse a confidence level outside (0, 1) or a resample count below 1."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1); got {level!r}.")
    if as_int(n_boot) is None or n_boot < 1:
        raise ValueError(f"n_boot must be an int >= 1; got {n_boot!r}.")


def mean_interval(
    values: Sequence[float], *, level: float = 0.95, n_boot: int = 1000, seed: int = 0
) -> Estimate:
    """The mean of ``values`` (``nan`` entries skipped, as "no evidence"), with its interval.

    >>> e = mean_interval([1.0, 2.0, 3.0, float("nan")], n_boot=200)
    >>> e.value, e.low <= e.value <= e.high
    (2.0, True)
    """
    check_bootstrap(level, n_boot)
    x = np.asarray(list_of(values, "values"), dtype=float)
    x = x[~np.isnan(x)]
    if x.size == 0:
        return Estimate(math.nan, math.nan, math.nan)
    if x.size == 1:
        return Estimate(float(x[0]), math.nan, math.nan)
    stats = x[_draws(x.size, n_boot, seed)].mean(axis=1)
    return Estimate(float(x.mean()), *_percentiles(stats, level))


def perplexity_interval(
    nlls: Sequence[tuple[float, int]], *, level: float = 0.95, n_boot: int = 1000, seed: int = 0
) -> Estimate:
    """Pooled perplexity ``exp(sum nll / sum tokens)`` over completions, with its interval.

    Completions, not tokens, are resampled: tokens of one completion are not independent.

    >>> perplexity_interval([(0.0, 3), (0.0, 2)], n_boot=10).value
    1.0
    """
    check_bootstrap(level, n_boot)
    nlls = list_of(nlls, "nlls")
    nll = np.asarray([x for x, _ in nlls], dtype=float)
    count = np.asarray([n for _, n in nlls], dtype=float)
    if count.sum() == 0:
        return Estimate(math.nan, math.nan, math.nan)
    value = math.exp(nll.sum() / count.sum())
    if len(nlls) == 1:
        return Estimate(value, math.nan, math.nan)
    idx = _draws(len(nlls), n_boot, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        stats = np.exp(nll[idx].sum(axis=1) / count[idx].sum(axis=1))
    return Estimate(value, *_percentiles(stats, level))


def mean_of_means_interval(groups: Sequence[Sequence[float]], *, level: float = 0.95,
                           n_boot: int = 1000, seed: int = 0) -> Estimate:  # fmt: skip
    """The mean over groups of each group's mean, with an interval from resampling within
    every group (a leaderboard's mean over concepts of each concept's test samples).

    >>> e = mean_of_means_interval([[1.0, 1.0], [0.0, 2.0]], n_boot=200)
    >>> e.value, e.low <= e.value <= e.high
    (1.0, True)
    """
    check_bootstrap(level, n_boot)
    groups = list_of(groups, "groups")
    arrays = [np.asarray(g, dtype=float) for g in groups]
    if not arrays or any(a.size == 0 for a in arrays):
        return Estimate(math.nan, math.nan, math.nan)
    value = float(np.mean([a.mean() for a in arrays]))
    if all(a.size == 1 for a in arrays):
        return Estimate(value, math.nan, math.nan)
    stats = np.mean([a[_draws(a.size, n_boot, seed + i)].mean(axis=1)
                     for i, a in enumerate(arrays)], axis=0)  # fmt: skip
    return Estimate(value, *_percentiles(stats, level))
