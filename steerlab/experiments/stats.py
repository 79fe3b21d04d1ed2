"""Rates with confidence intervals for counted outcomes (k of n completions show a behaviour)."""

from __future__ import annotations

import math

Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson(k: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval for a binomial rate ``k / n`` (95% by default).

    Unlike the normal approximation it stays inside [0, 1] and is not empty at 0 or n:
    0 of 32 gives (0, 0.107), so "never seen" still says how rare it could be.

    Args:
        k: successes, ``0 <= k <= n``.
        n: trials, at least 1.
        z: the normal quantile for the confidence level.

    Returns:
        ``(low, high)``.

    >>> [round(x, 4) for x in wilson(16, 32)]
    [0.3363, 0.6637]
    """
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"wilson needs 0 <= k <= n and n >= 1; got k={k}, n={n}.")
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)
