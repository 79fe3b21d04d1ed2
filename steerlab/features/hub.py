"""SAEs from SAELens's pretrained registry: ``load_sae(release, sae_id)``.

Needs the ``sae`` extra. Importing sae-lens takes seconds, so the two ways this fails
without a network are decided before it is imported: the release's hub repository is looked
up in SAELens's registry file (read as text), and when the hub is switched off
(``HF_HUB_OFFLINE``) or unreachable and that repository is not in the HuggingFace cache,
the call fails at once with one short message.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
from pathlib import Path
from typing import Any

import torch

from steerlab.features.errors import SAEError, SAEUnavailableError
from steerlab.features.format import parse_config
from steerlab.features.sae import SAE

HUB_HOST = ("huggingface.co", 443)
PROBE_SECONDS = 1.0


def load_pretrained(release: str, sae_id: str, *, device: str | torch.device = "cpu") -> SAE:
    """One SAE of a SAELens release, through ``sae_lens.SAE.from_pretrained``.

    Raises:
        SAEUnavailableError: sae-lens is not installed, or the hub is off or unreachable and
            the SAE is not cached.
        SAEError: the SAE is of a kind steerlab does not read.

    >>> load_pretrained("gpt2-small-res-jb", "blocks.8.hook_resid_pre")  # needs the HF hub (network)  # doctest: +SKIP
    """
    spec = importlib.util.find_spec("sae_lens")
    if spec is None or not spec.submodule_search_locations:
        raise SAEUnavailableError(
            f"load_sae({release!r}, {sae_id!r}) reads SAELens's registry, which needs sae-lens: "
            "pip install 'steerlab[sae]'."
        )
    repo_id = _repo_id(Path(spec.submodule_search_locations[0]) / "pretrained_saes.yaml", release)
    if not _hub_reachable() and not _cached(repo_id):
        raise SAEUnavailableError(
            f"Cannot load SAE {release!r}/{sae_id!r}: the hub is "
            f"{'switched off (HF_HUB_OFFLINE)' if _offline_set() else 'unreachable'} and "
            f"{repo_id!r} is not in the HuggingFace cache."
        )
    from sae_lens import SAE as LensSAE

    try:
        lens = LensSAE.from_pretrained(release, sae_id, device=str(device))
    except (OSError, ConnectionError) as error:  # huggingface_hub's errors are OSErrors
        raise SAEUnavailableError(f"Cannot load SAE {release!r}/{sae_id!r}: {error}") from error
    return from_saelens(lens, source=f"{release}/{sae_id}")


def from_saelens(lens: Any, source: str = "") -> SAE:
    """A steerlab ``SAE`` with the weights and config of a SAELens ``SAE`` object.

    >>> import sae_lens
    >>> path = sl.load_sae("steerlab-tiny-sae").save("my-sae")
    >>> from_saelens(sae_lens.SAE.load_from_disk(path)).d_sae
    512
    """
    config = parse_config(lens.cfg.to_dict(), f"the SAELens config of {source or 'an SAE'}")
    state = {name: t.detach() for name, t in lens.state_dict().items()}
    missing = set(config.shapes()) - set(state)
    if missing or set(state) - set(config.shapes()):
        raise SAEError(
            f"SAELens SAE {source!r} holds {sorted(state)}; steerlab reads {sorted(config.shapes())}."
        )
    return config.sae(state, source)


def _repo_id(registry: Path, release: str) -> str:
    """The hub repository of ``release``: its ``repo_id`` line, or the release itself (an id)."""
    header = f"{release}:"
    lines = registry.read_text().splitlines() if registry.is_file() else []
    for n, line in enumerate(lines):
        if line.rstrip() == header:
            for inner in lines[n + 1 :]:
                if inner and not inner.startswith(" "):
                    break
                if inner.strip().startswith("repo_id:"):
                    return inner.split(":", 1)[1].strip().strip("'\"")
    if "/" in release:
        return release  # SAELens takes a hub repository id as a release too
    raise SAEError(
        f"{release!r} is not a release in SAELens's registry (sae_lens/pretrained_saes.yaml) "
        "nor a hub repository id."
    )


def _offline_set() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _hub_reachable() -> bool:
    """Whether the hub answers a TCP connect within ``PROBE_SECONDS`` (name lookup included)."""
    if _offline_set():
        return False
    reachable: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection(HUB_HOST, timeout=PROBE_SECONDS).close()
            reachable.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)  # a stuck name lookup cannot block us
    thread.start()
    thread.join(PROBE_SECONDS)
    return bool(reachable)


def _cached(repo_id: str) -> bool:
    from huggingface_hub import constants

    folder = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
    return folder.is_dir()
