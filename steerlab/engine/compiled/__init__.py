"""The compiled fast path: a static KV cache, one compiled decode step, steering as data.

``lm.compile()`` (or ``sl.load(..., compile=True)``) gives the local engine a
``CompiledStep``; ``lm.explain(...)`` says which path a call takes.
"""

from steerlab.engine.compiled.strategy import CompiledStep

__all__ = ["CompiledStep"]
