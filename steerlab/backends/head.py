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

from steerlab.backends.families import has_plain_head

# A vocabulary this wide makes the head the largest matrix product of a forward.
WIDE_VOCAB = 8192
WIDE_ROWS = 64  # the most rows multiplied with the weight on the left


_LINEAR_FORWARD = nn.Linear.forward  # as torch defines it, before anyone patches the class
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks",
                 "_global_backward_hooks", "_global_backward_pre_hooks")  # fmt: skip


def untouched(module: nn.Module) -> bool:
    """Whether nothing can be attached to ``module``'s call, so its weights may be used
    without calling it: no ``forward`` set on the instance but its class's own (a wrapper,
    or the one accelerate's ``add_hook_to_module`` puts there), no accelerate ``_hf_hook``,
    no forward, pre-forward or backward hooks of its own, and none registered globally.

    >>> head = nn.Linear(4, 3)
    >>> before = untouched(head)
    >>> _ = head.register_forward_hook(lambda module, args, out: out)
    >>> before, untouched(head)
    (True, False)
    """
    glob = nn.modules.module
    if any(getattr(glob, name, None) for name in _GLOBAL_HOOKS):
        return False
    forward = vars(module).get("forward")
    own = (
        getattr(forward, "__func__", None) is type(module).forward
        and getattr(forward, "__self__", None) is module
    )  # as accelerate leaves it
    if (forward is not None and not own) or hasattr(module, "_hf_hook"):
        return False
    return not any(getattr(module, name, None) for name in _HOOKS)


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
    """Whether ``unembed`` puts the weight on the left: a plain ``nn.Linear`` head that
    nothing is attached to (``untouched``), float32 on a CPU, a vocabulary of at least
    ``WIDE_VOCAB``, and 2 to ``WIDE_ROWS`` rows. Otherwise the module itself is called."""
    w = head.weight
    return (1 < rows <= WIDE_ROWS and w.device.type == "cpu" and w.dtype == torch.float32
            and w.shape[0] >= WIDE_VOCAB and type(head) is nn.Linear
            and nn.Linear.forward is _LINEAR_FORWARD and untouched(head))  # fmt: skip


def plain_head(model: Any) -> nn.Linear | None:
    """``model``'s LM head when the model's logits are the head applied to its base model's
    last hidden state and nothing would see the head or the model's own forward skipped: a
    plain-head family, an ``nn.Linear`` head, and nothing attached to either by any
    mechanism (``untouched``: hooks, a wrapped forward, accelerate's; steerlab's never sit
    there). None otherwise: call the model itself."""
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    # The family's logits are exactly ``lm_head(base_model(...).last_hidden_state)``, cut to
    # the positions kept: no logit scaling or soft-capping (its record's ``plain_head``).
    if not has_plain_head(getattr(config, "model_type", None)) or type(head) is not nn.Linear:
        return None
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    if nn.Linear.forward is not _LINEAR_FORWARD or not (untouched(model) and untouched(head)):
        return None
    return head
