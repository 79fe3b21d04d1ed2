"""Decoding on vLLM, steered inside its workers (``sl.load(..., backend="vllm")``).

Needs ``vllm`` (``pip install steerlab[vllm]``, in an environment of its own). Importing
this package does not import vLLM; starting an engine does.
"""

from steerlab.engine.vllm.engine import SteerHookError, VLLMEngine
from steerlab.engine.vllm.load import load_vllm

__all__ = ["SteerHookError", "VLLMEngine", "load_vllm"]
