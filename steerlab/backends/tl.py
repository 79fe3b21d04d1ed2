"""TransformerLens, 3.9 or 4.x: which is installed, and what each one offers.

steerlab serves both. TransformerLens 4 removed ``HookedTransformer`` (and made even
``hasattr(transformer_lens, "HookedTransformer")`` raise an ``ImportError``), so the code
path is chosen here, once, from the installed version (``importlib.metadata``), never by
touching the removed names. SAELens 6 pins TransformerLens below 4, so an environment with
sae-lens has 3.9; one without it may have 4.x.

Every other module asks this one: ``loading`` for its classes and the refusal of
``backend="hooked"``, ``backends`` to recognise a model, the command line for its
``--backend`` flag.
"""

from __future__ import annotations

import argparse
import functools
import warnings
from importlib import metadata
from typing import Any

DIST = "transformer-lens"


class BackendUnavailableError(ImportError, ValueError):
    """A backend whose library is not installed here: a missing import and a bad argument."""


class CoordinatesWarning(UserWarning):
    """A TransformerBridge whose weights were folded and centered (its compatibility mode):
    its activations, and a vector made from them, are in other coordinates than HF's."""


@functools.cache
def major() -> int | None:
    """TransformerLens's installed major version (3 or 4), or None without it.

    >>> major() in (3, 4)
    True
    """
    try:
        version = metadata.version(DIST)
    except metadata.PackageNotFoundError:
        return None
    return int(version.split(".", 1)[0])


def hooked_refusal() -> str | None:
    """Why ``backend="hooked"`` cannot run here, or None where it can (TransformerLens 3)."""
    found = major()
    if found is not None and found < 4:
        return None
    have = f"TransformerLens {metadata.version(DIST)}" if found else "no TransformerLens"
    return (
        f'backend="hooked" needs TransformerLens 3.9 (HookedTransformer), and this environment '
        f'has {have}. Use backend="bridge" (TransformerBridge, whose numerics match '
        'HuggingFace\'s) or backend="hf"; or install "transformer-lens>=3.9,<4" (sae-lens pins '
        "it). Vectors saved with backend='hooked' load on either."
    )


def check_backend(name: str) -> None:
    """Refuse a backend this environment's TransformerLens cannot build, before any load.

    >>> check_backend("hf")
    """
    if name == "hooked" and (why := hooked_refusal()):
        raise BackendUnavailableError(why)


def backend_arg(name: str) -> str:
    """``--backend``'s argparse type: the name, or argparse's one-line error (exit 2)
    before any model is loaded, as ``check_backend`` refuses it."""
    try:
        check_backend(name)
    except BackendUnavailableError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return name


def bridge_class() -> Any:
    """``TransformerBridge`` (the same import path on 3.9 and 4.x)."""
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge


def hooked_class() -> Any:
    """``HookedTransformer``; a ``BackendUnavailableError`` on TransformerLens 4."""
    check_backend("hooked")
    from transformer_lens import HookedTransformer

    return HookedTransformer


def kind_of(model: Any) -> str | None:
    """``"bridge"`` or ``"hooked"`` for a TransformerLens model, None for anything else
    (and without TransformerLens installed). Never touches a name 4.x removed."""
    if major() is None:
        return None
    if isinstance(model, bridge_class()):
        return "bridge"
    if hooked_refusal() is None and isinstance(model, hooked_class()):
        return "hooked"
    return None


def warn_if_processed(bridge: Any) -> None:
    """Say so when a bridge runs in compatibility mode with folded, centered weights:
    steerlab's own bridges stay in raw mode, where activations are HF's."""
    processed = bool(getattr(bridge, "_weights_processed", False))
    if not (processed or getattr(bridge, "compatibility_mode", False)):
        return
    what = "folded and centered weights" if processed else "legacy hook names"
    warnings.warn(
        f"This TransformerBridge is in compatibility mode ({what}). "
        + ("Its residual stream is in other coordinates than HuggingFace's: a vector "
           "extracted here does not transfer to the raw model (backend='bridge' or 'hf'), "
           "nor the other way round. Boot it without enable_compatibility_mode() for HF's "
           "coordinates." if processed else "Its weights are HF's, so vectors transfer."),
        CoordinatesWarning,
        stacklevel=3,
    )  # fmt: skip
