"""A trained steer (an ``sl.LoReFT``) as a panel entry: it acts at its own site and
positions, alpha scales it, and it has no direction to read as a condition or monitor."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from steerlab.core import Steer, SteerError
from steerlab.core.reft import LoReFT


def trained_entry(vectors: Mapping[str, Any], name: str) -> LoReFT | None:
    """The LoReFT offered under ``name``, or ``None`` for anything else."""
    vector = vectors.get(name)
    return vector if isinstance(vector, LoReFT) else None


def readable(vectors: Mapping[str, Any]) -> list[str]:
    """The entries with a direction to read (a condition, a monitor): not a LoReFT."""
    return [n for n, v in vectors.items() if not isinstance(v, LoReFT)]


def trained_steer(name: str, vector: LoReFT, site: str, positions: Any,
                  alphas: Sequence[float]) -> Steer:  # fmt: skip
    """The LoReFT's own steer, one row per alpha (times its scale); refused at another site
    or other positions than it was trained at, before any compute."""
    if site != vector.site:
        raise SteerError(f"{name!r} is a trained LoReFT: it steers at {vector.site} only, "
                         f"not {site}.")  # fmt: skip
    if positions != vector.positions:
        raise SteerError(f"{name!r} is a trained LoReFT: it acts on the positions it was "
                         f"trained on, {vector.positions!r}, not {positions!r}.")  # fmt: skip
    (trained,) = vector.steers()
    return replace(trained, alpha=tuple(a * vector.scale for a in alphas))
