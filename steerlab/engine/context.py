"""The per-forward context: rows and token positions, computed once per forward pass.

The decode loop builds one ``ForwardContext`` before each forward and hands it to the
backend (for position ids) and, through the call, to every hook (which rows and tokens an
activation belongs to). That is what keeps steering right under the KV cache, left
padding, a cache continued across calls, and rows dropped from the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ForwardContext:
    """Who is in this forward pass, and where.

    Attributes:
        rows: [batch] which of the call's rows each batch row is.
        pos: [batch, new] index of each new token from its row's first real token; -1 on pads.
        generated: [batch, new] True where the token was produced by the model.
        prefill: this forward feeds the call's prompt (it comes before the call's first new
            token); a condition reads the prompt from such forwards only.
        prompt_len: [batch] each row's prompt length: its real tokens before this call
            generates (what a span of the prompt, ``"first:k+last:k"``, counts from);
            None where no rule needs it.
    """

    rows: torch.Tensor
    pos: torch.Tensor
    generated: torch.Tensor
    prompt_len: torch.Tensor | None = None
    prefill: bool = False
    _moved: dict[torch.device, tuple[torch.Tensor, ...]] = field(default_factory=dict, repr=False)
    _spans: dict[tuple[str, torch.device], torch.Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def for_mask(
        cls, rows: torch.Tensor, mask: torch.Tensor, generated: torch.Tensor,
        prompt_len: torch.Tensor | None = None, *, prefill: bool = False,
    ) -> ForwardContext:  # fmt: skip
        """The context for the last ``generated.shape[1]`` columns of a full attention mask."""
        pos = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, -1)
        return cls(rows, pos[:, -generated.shape[1] :], generated, prompt_len, prefill)

    @property
    def position_ids(self) -> torch.Tensor:
        """Position ids for the model: pads get 1, as HuggingFace ``generate`` gives them."""
        return self.pos.masked_fill(self.pos < 0, 1)

    def on(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """``(rows, pos, generated)`` on ``device``, moved once per forward pass."""
        if device not in self._moved:
            self._moved[device] = (self.rows.to(device), self.pos.to(device),
                                   self.generated.to(device))  # fmt: skip
        return self._moved[device]

    def prompt_lengths(self, device: torch.device) -> torch.Tensor:
        """``prompt_len`` as ``[batch, 1]`` on ``device``, to broadcast over positions."""
        if self.prompt_len is None:
            raise ValueError("This forward has no prompt lengths (a span rule needs them).")
        key = ("prompt_len", device)
        if key not in self._spans:
            self._spans[key] = self.prompt_len.to(device)[:, None]
        return self._spans[key]
