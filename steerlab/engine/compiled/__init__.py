"""The compiled fast path: a static KV cache, one compiled decode step, steering as data.

``lm.compile()`` (or ``sl.load(..., compile=True)``) puts a ``CompiledEngine`` in front of
the eager one; ``lm.explain(...)`` says which path a call takes.
"""

from steerlab.engine.compiled.engine import CompiledEngine

__all__ = ["CompiledEngine"]
