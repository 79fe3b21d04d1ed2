"""``load_sae``: one entry point for an SAE folder, the shipped toy SAE, or a SAELens release."""

from __future__ import annotations

from pathlib import Path

import torch

from steerlab.features.format import read_folder
from steerlab.features.sae import SAE

_TOY_ASSETS = Path(__file__).resolve().parents[1] / "toy" / "assets"
# SAEs shipped as package data, by name.
TOY_SAES: dict[str, Path] = {"steerlab-tiny-sae": _TOY_ASSETS / "steerlab-tiny-sae"}


def load_sae(
    path_or_name: str | Path, sae_id: str | None = None, *, device: str | torch.device = "cpu"
) -> SAE:
    """Load an SAE in SAELens's format.

    Args:
        path_or_name: a SAELens folder (``cfg.json`` + ``sae_weights.safetensors``),
            ``"steerlab-tiny-sae"`` (shipped, offline), or a SAELens release with ``sae_id``.
        sae_id: the SAE within a release; it needs sae-lens (``pip install 'steerlab[sae]'``)
            and a reachable hub or a cached copy.
        device: where the weights go.

    Raises:
        SAEError: naming the file, key or value steerlab cannot read.
        SAEUnavailableError: a release without sae-lens, or offline and not cached.

    >>> sae = load_sae("steerlab-tiny-sae")
    >>> sae.site
    'blocks.2.hook_resid_pre'
    """
    if sae_id is not None:
        from steerlab.features.hub import load_pretrained

        return load_pretrained(str(path_or_name), sae_id, device=device)
    name = str(path_or_name)
    if name in TOY_SAES:
        return read_folder(TOY_SAES[name], device=device, source=name)
    return read_folder(path_or_name, device=device)
