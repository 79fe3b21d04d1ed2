"""Where steerlab's canonical sites live in vLLM's own model classes.

Each family's ``VLLMLayout`` is the ``vllm`` field of its record in ``backends/families.py``.

vLLM reimplements each architecture, so its modules are not HuggingFace's. Two forms cover
the GPT-2 and Llama families (Qwen2/3 and Mistral share Llama's):

- ``full``: a block takes and returns the whole residual stream (GPT-2). ``resid_mid`` is
  never a module's input or output there, so it is steered by rewriting the attention
  output against the remembered block input.
- ``pair``: a block takes and returns ``(delta, residual)`` whose sum is the residual stream
  (vLLM fuses the residual add into the next norm). A steer acts on the sum and writes the
  difference back into ``delta``; the post-attention norm's input pair is ``resid_mid``.
"""

from __future__ import annotations

from steerlab.backends.families import VLLM, lookup
from steerlab.backends.families import VLLMLayout as VLLMLayout
from steerlab.core.sites import BLOCK_KINDS, EMBED


def layout_for(model_type: str) -> VLLMLayout:
    """The family's ``vllm`` field, or a ``FamilyError`` naming the families vLLM has.

    >>> layout_for("gpt2").form
    'full'
    """
    return lookup(model_type, VLLM)


def vllm_sites(n_layers: int) -> list[str]:
    """Every site the vLLM engine steers, in forward order (all five per block, and the embed)."""
    names = [EMBED]
    for layer in range(n_layers):
        names += [f"blocks.{layer}.{kind}" for kind in BLOCK_KINDS]
    return names
