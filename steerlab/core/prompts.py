"""From prompts to a left-padded batch of token ids, chat templates included."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from steerlab.core.errors import PromptError

Message = dict[str, str]
Prompt = str | list[Message]


def normalise(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """One prompt or a list of them, as a non-empty list."""
    single = isinstance(prompts, str) or (
        isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], dict)
    )
    listed: list[Prompt] = [prompts] if single else list(prompts)  # type: ignore[list-item, arg-type]
    if not listed:
        raise PromptError("The prompt list is empty: give at least one prompt.")
    for p in listed:
        if not isinstance(p, (str, list)):
            raise PromptError(f"A prompt must be a string or a list of messages, not {type(p)}.")
    return listed


def encode(tokenizer: Any, prompt: Prompt, *, chat: bool) -> list[int]:
    """Token ids for one prompt, with exactly the BOS the model expects (never two)."""
    if chat:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            # The rendered template carries its own special tokens.
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            return _single_bos(tokenizer, ids)
        warnings.warn(
            "This tokenizer has no chat template; using the raw message text.", stacklevel=3
        )
        prompt = "\n".join(m["content"] for m in messages)
    elif not isinstance(prompt, str):
        raise PromptError("A list of messages needs chat=True.")
    return _single_bos(tokenizer, tokenizer(prompt)["input_ids"])


def _single_bos(tokenizer: Any, ids: list[int]) -> list[int]:
    bos = tokenizer.bos_token_id
    while bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]
    return ids


@dataclass(frozen=True)
class Batch:
    """Left-padded prompts: pads first, so every row's last token is aligned."""

    input_ids: torch.Tensor  # [batch, pos]
    attention_mask: torch.Tensor  # [batch, pos], 1 on real tokens
    prompt_lengths: torch.Tensor  # [batch]

    @classmethod
    def left_pad(cls, rows: list[list[int]], pad_id: int) -> Batch:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            if row:
                ids[i, width - len(row) :] = torch.tensor(row)
                mask[i, width - len(row) :] = 1
        return cls(ids, mask, torch.tensor([len(r) for r in rows]))


def token_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of each token from its row's first real token; -1 on pads. [batch, pos]"""
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, -1)
