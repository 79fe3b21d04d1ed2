"""The LM head as a CPU multiplies it fastest: ``unembed``, and when a model's head may be.

On a CPU, MKL multiplies a few rows by a wide vocabulary's head ``W`` [vocab, d] about twice
as fast with the weight on the left (``W @ x^T``) as ``F.linear`` does (``x @ W^T``):
GPT-2's 50257 x 768 head, 2 threads, 4 rows: 10 ms against 30; 8 rows: 17 against 30; 64
rows: 42 against 67; one row: the same. The logits are the same products added in another
order (differences ~1e-6 in float32). The product comes out as ``[vocab, rows]`` and is
copied to ``[rows, vocab]``, as every caller expects (a max with indices over a
transposed view took 166 ms against 26 for 1008 rows); past ``WIDE_ROWS`` rows the copy
and the product together cost what ``F.linear`` does, so only 2 to ``WIDE_ROWS`` rows take
this path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# A vocabulary this wide makes the head the largest matrix product of a forward.
WIDE_VOCAB = 8192
WIDE_ROWS = 64  # the most rows multiplied with the weight on the left
# Causal LMs whose logits are exactly ``lm_head(base_model(...).last_hidden_state)``, cut to
# the positions kept: no logit scaling or soft-capping.
PLAIN_HEAD = ("gpt2", "llama", "mistral", "qwen2")


def unembed(head: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``head(x)``: [..., d] -> [..., vocab]; weight on the left when ``wide(head, rows)``.

    >>> head = nn.Linear(8, 9000, bias=False)
    >>> x = torch.randn(3, 2, 8)
    >>> torch.allclose(unembed(head, x), head(x), atol=1e-6)
    True
    """
    rows = x.numel() // x.shape[-1]
    if not wide(head, rows):
        return head(x)
    w = head.weight
    out = (w @ x.reshape(rows, x.shape[-1]).T).T.contiguous()  # [vocab, rows] copied across
    if head.bias is not None:
        out = out + head.bias
    return out.reshape(*x.shape[:-1], w.shape[0])


def wide(head: nn.Linear, rows: int) -> bool:
    """Whether ``unembed`` puts the weight on the left: a float32 head on a CPU, a
    vocabulary of at least ``WIDE_VOCAB``, and 2 to ``WIDE_ROWS`` rows."""
    w = head.weight
    return (1 < rows <= WIDE_ROWS and w.device.type == "cpu" and w.dtype == torch.float32
            and w.shape[0] >= WIDE_VOCAB)  # fmt: skip


def plain_head(model: Any) -> nn.Linear | None:
    """``model``'s LM head when the model's logits are the head applied to its base model's
    last hidden state and nothing would see the head skipped: a plain-head family, an
    ``nn.Linear`` head, no hooks on the model or the head (steerlab's never sit there), and
    no global module hooks. None otherwise: call the model itself."""
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD or type(head) is not nn.Linear:
        return None
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    hooked = [m for m in (model, head) if m._forward_hooks or m._forward_pre_hooks]
    glob = nn.modules.module
    if hooked or glob._global_forward_hooks or glob._global_forward_pre_hooks:
        return None
    return head
