"""The errors of ``steerlab.features``: a bad SAE folder, config, input or index."""

from __future__ import annotations


class SAEError(ValueError):
    """An SAE steerlab cannot read or use: a missing file, an unsupported config, a bad index.

    Raised before any compute, with the file, key or value that is wrong in the message.
    """


class SAEUnavailableError(ImportError, SAEError):
    """An SAE that needs something this environment lacks: sae-lens, or a reachable hub."""
