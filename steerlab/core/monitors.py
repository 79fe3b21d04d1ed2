"""Monitors: a read recorded at every token, the readout a call reports beside its text.

A ``Monitor`` is a name, a site and a direction; every engine records ``h·v/|v|`` at its
site after the steers there (``core.reads`` holds the reads and the conditions built on
them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from steerlab.core.directions import check_read_direction, direction_of, read_wire_form
from steerlab.core.errors import SteerError
from steerlab.core.ops import (
    TensorKey,
    TensorValue,
    is_zero,
    wide_dtype,
)


@dataclass(frozen=True, eq=False)
class Monitor(TensorValue):
    """Read ``h·v/|v|`` at ``site`` at every token of a generation, steered or not.

    The activation read is the one the next layer sees, after any steer at ``site``.
    """

    name: str
    site: str
    direction: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SteerError(f"A monitor needs a non-empty name; got {self.name!r:.40}.",
                             "monitor")  # fmt: skip
        if not isinstance(self.site, str):
            raise SteerError(f"Monitor {self.name!r} site must be a site name.", "monitor")
        super().__post_init__()
        d = self.direction
        if d.ndim != 1 or is_zero(d):
            raise SteerError(f"Monitor {self.name!r} needs a non-zero 1-D direction.", "monitor")

    def _label(self) -> str:
        return f"Monitor {self.name!r}"

    def values(self, h: torch.Tensor) -> torch.Tensor:
        """THE reading: ``h·v/|v|`` of each row of ``h [..., d]``, in float32 (at least).

        >>> Monitor("m", "blocks.0.hook_resid_post", torch.tensor([3.0, 4.0])).values(torch.ones(2))
        tensor(1.4000)
        """
        wide = wide_dtype(h.dtype)
        return h.to(wide) @ self.unit_on("direction", h.device, wide)

    def check(self, sites: Sequence[str], d_model: int) -> None:
        check_read_direction(self.site, self.direction, sites, d_model,
                             f"Monitor {self.name!r}", "monitor")  # fmt: skip

    def to_data(self, tensor_key: TensorKey | None = None) -> dict[str, Any]:
        return read_wire_form(self.fields_data(tensor_key))

    def __repr__(self) -> str:
        return f"Monitor({self.name!r} at {self.site})"


def as_monitors(monitor: object) -> tuple[Monitor, ...]:
    """``monitor=`` as monitors: a dict name -> a one-site steering vector (``v.at(site)``)
    or ``(site, vector)``, or a list of ``Monitor``. Duplicate names are refused.

    >>> as_monitors({"up": ("blocks.0.hook_resid_post", torch.ones(4))})
    (Monitor('up' at blocks.0.hook_resid_post),)
    """
    if monitor is None:
        return ()
    if isinstance(monitor, Monitor):
        return (monitor,)
    if isinstance(monitor, Mapping):
        return tuple(_monitor(name, value) for name, value in monitor.items())
    if isinstance(monitor, (list, tuple)) and all(isinstance(m, Monitor) for m in monitor):
        names = [m.name for m in monitor]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate is not None:
            raise SteerError(f"Two monitors are named {duplicate!r}: names must differ.",
                             "monitor")  # fmt: skip
        return tuple(monitor)
    raise SteerError("monitor must be a dict of name -> vector.at(site) or (site, vector), or a "
                     f"list of sl.Monitor; got {type(monitor).__name__}.", "monitor")  # fmt: skip


def _monitor(name: object, value: object) -> Monitor:
    if not isinstance(name, str):
        raise SteerError(f"monitor names must be strings; got {name!r:.40}.", "monitor")
    if isinstance(value, tuple) and len(value) == 2:
        site, vector = value
        if not isinstance(vector, torch.Tensor):
            vector, _ = direction_of(vector, site)
        return Monitor(name, site, vector)
    sites = getattr(value, "sites", None)
    if sites is None or len(sites) != 1:
        raise SteerError(f"monitor {name!r}: give (site, vector) or a one-site steering vector "
                         "(vector.at(site)).", "monitor")  # fmt: skip
    direction, _ = direction_of(value, sites[0])  # type: ignore[arg-type]
    return Monitor(name, sites[0], direction)


def monitor_from_data(data: Mapping[str, Any], tensors: Mapping[str, torch.Tensor]) -> Monitor:
    """A monitor from ``Monitor.to_data(tensor_key)``'s form, its direction looked up by key
    in ``tensors`` (where tensors travel once, as to vLLM's workers)."""
    key = data.get("vector")
    if not isinstance(key, str) or key not in tensors:
        raise SteerError(f"monitor {data.get('name')!r:.40}: its vector {key!r:.40} is not a "
                         "known key.", "monitor")  # fmt: skip
    return Monitor(data["name"], data["site"], tensors[key])


def nan_padded(rows: Sequence[Sequence[float]], width: int | None = None,
               left: bool = False) -> torch.Tensor:  # fmt: skip
    """Ragged rows as ``[rows, width]`` float32, NaN where a row has no value (on the left
    with ``left``, as left-padded prompts)."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = torch.full((len(rows), width), math.nan)
    for i, r in enumerate(rows):
        values = torch.tensor(list(r)[:width], dtype=torch.float32)
        if len(values):
            if left:
                out[i, width - len(values) :] = values
            else:
                out[i, : len(values)] = values
    return out
