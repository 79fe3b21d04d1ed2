"""Attach steers and recorders to a backend for the length of one call.

The decode loop updates a ``TokenLayout`` before each forward pass; the hooks read
it to know which row and position every activation belongs to. That is what keeps
positions right under the KV cache (a cached step sees only ``[batch, 1, d]``) and
under left padding (pads are never steered).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from steerlab.backends.base import Backend
from steerlab.hooks import HookSet
from steerlab.interventions import Steer, SteerError, position_mask
from steerlab.sites import Site, resolve


class TokenLayout:
    """Row and position bookkeeping for the activations of the current forward pass."""

    def __init__(self, prompt_lengths: torch.Tensor) -> None:
        self.prompt_lengths = prompt_lengths  # [batch]
        self.pos = torch.empty(0, dtype=torch.long)  # [batch, new_pos], -1 on pads
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, pos: torch.Tensor) -> None:
        self.pos = pos
        self._on = {}

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pos, prompt_lengths)`` on ``device``, moved once per forward pass."""
        if device not in self._on:
            self._on[device] = (self.pos.to(device), self.prompt_lengths.to(device))
        return self._on[device]


def expand_rows(
    n_prompts: int, steers: Sequence[Steer]
) -> tuple[list[int], list[tuple[float, ...]]]:
    """Rows for prompts x alphas, prompt-major: ``(prompt index, alpha per steer)`` per row.

    Every steer's alpha list must have the same length k, or length 1.
    """
    lengths = {len(s.alpha) for s in steers} - {1}
    if len(lengths) > 1:
        raise SteerError(f"Steers have alpha lists of different lengths: {sorted(lengths)}.")
    k = lengths.pop() if lengths else 1
    prompt_index, alphas = [], []
    for p in range(n_prompts):
        for j in range(k):
            prompt_index.append(p)
            alphas.append(tuple(s.alpha[j if len(s.alpha) > 1 else 0] for s in steers))
    return prompt_index, alphas


def check_steers(backend: Backend, steers: Sequence[Steer]) -> list[Site]:
    """Validate every steer against the model, before anything runs."""
    valid = backend.sites()
    sites = []
    for steer in steers:
        if not isinstance(steer, Steer):
            raise SteerError(f"Expected a Steer, got {type(steer).__name__}.")
        sites.append(resolve(steer.site, valid))
        if steer.vector.shape[0] != backend.d_model:
            raise SteerError(
                f"Vector for {steer.site} has size {steer.vector.shape[0]}, "
                f"but this model has d_model={backend.d_model}."
            )
    return sites


def attach_steer(
    backend: Backend,
    site: Site,
    steer: Steer,
    row_alphas: torch.Tensor,  # [batch]
    layout: TokenLayout,
    hooks: HookSet,
) -> None:
    """Hook ``steer`` in; a steer whose alphas are all 0 is not attached at all."""
    if not bool(row_alphas.any()):
        return
    moved: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def apply(act: torch.Tensor) -> torch.Tensor:
        key = (act.device, act.dtype)
        if key not in moved:  # move the vector to wherever this layer lives, once
            moved[key] = (steer.vector.to(*key), row_alphas.to(*key))
        vector, alphas = moved[key]
        pos, prompt_lengths = layout.on(act.device)
        batch, seq, d = act.shape
        touched = position_mask(steer.positions, pos, prompt_lengths) & (alphas != 0)[:, None]
        alpha = alphas[:, None].expand(batch, seq).reshape(-1, 1)
        new = steer.op(act.reshape(-1, d), vector, alpha).reshape(batch, seq, d)
        return torch.where(touched[..., None], new, act)

    hooks.add(backend.attach(site, apply))


class Recorder:
    """Activations seen at some sites, one chunk per forward pass."""

    def __init__(self, sites: Sequence[Site]) -> None:
        self.chunks: dict[str, list[torch.Tensor]] = {s.name: [] for s in sites}

    def attach(self, backend: Backend, hooks: HookSet) -> None:
        for name, chunks in self.chunks.items():

            def keep(act: torch.Tensor, chunks: list[torch.Tensor] = chunks) -> None:
                chunks.append(act.detach())

            hooks.add(backend.attach(Site.parse(name), keep))

    def stacked(self) -> dict[str, torch.Tensor]:
        """Site -> [batch, pos, d_model], chunks joined along positions (on the CPU)."""
        return {
            name: torch.cat([c.cpu() for c in chunks], dim=1)
            for name, chunks in self.chunks.items()
        }
