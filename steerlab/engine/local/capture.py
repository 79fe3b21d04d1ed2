"""Capturing activations at canonical sites during one call's forwards."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from steerlab.backends.base import Backend
from steerlab.core.sites import Site
from steerlab.engine.guard import Call


class Recorder:
    """Activations seen at some sites, one chunk per forward pass of the call."""

    def __init__(self, sites: Sequence[Site]) -> None:
        self.chunks: dict[str, list[torch.Tensor]] = {s.name: [] for s in sites}

    def attach(self, backend: Backend, call: Call) -> None:
        for name, chunks in self.chunks.items():

            def keep(act: torch.Tensor, *_: object, chunks: list[torch.Tensor] = chunks) -> None:
                chunks.append(act.detach())

            backend.attach(Site.parse(name), call.hook(keep))

    def stacked(self) -> dict[str, torch.Tensor]:
        """Site -> [batch, pos, d_model], chunks joined along positions (on the CPU)."""
        return {
            name: torch.cat([c.cpu() for c in chunks], dim=1)
            for name, chunks in self.chunks.items()
        }
