"""The in-process engine: the decode loop plus hooks on one backend (internal)."""

from steerlab.engine.local.engine import LocalEngine, Progress

__all__ = ["LocalEngine", "Progress"]
