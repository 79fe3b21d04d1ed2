"""Shared test constants and a cache of tiny models (imported by name, unlike conftest)."""

from __future__ import annotations

import steerlab as sl
from steerlab.backends import tl

# HookedTransformer is TransformerLens 3.9's; on 4.x (make test-tl4) its runs are not made.
BACKENDS = ("hf", "hooked", "bridge") if tl.hooked_refusal() is None else ("hf", "bridge")
PROMPTS = ["Hi", "The quick brown fox", "A much longer prompt, with commas"]

_loaded: dict[tuple[str, str], sl.SteerableModel] = {}


def load_tiny(tiny_dirs: dict[str, str], family: str, backend: str) -> sl.SteerableModel:
    """One model per (family, backend) for the whole session: loading is the slow part."""
    key = (family, backend)
    if key not in _loaded:
        _loaded[key] = sl.load(tiny_dirs[family], backend=backend)
    return _loaded[key]


class NoGeneration:
    """Patches the model so any forward pass or generation fails the test."""

    @staticmethod
    def install(monkeypatch, lm) -> None:
        def never(*args, **kwargs):
            raise AssertionError("computed before refusing")

        monkeypatch.setattr(type(lm), "generate", never)
        monkeypatch.setattr(type(lm.model), "forward", never)
