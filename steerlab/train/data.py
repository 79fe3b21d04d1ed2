"""Training data: preference pairs (BiPO) and supervised examples (LoReFT), as token rows.

A row is the prompt's ids (with the BOS the model expects) followed by a continuation's
ids (no special tokens); the loss reads the continuation only.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from steerlab.core.concepts import Example, Preference
from steerlab.core.errors import SteerError
from steerlab.core.prompts import encode
from steerlab.core.scalars import real_list
from steerlab.core.window import check_window


@dataclass(frozen=True)
class Row:
    """One training row: prompt ids, then continuation ids."""

    prompt: tuple[int, ...]
    continuation: tuple[int, ...]

    @property
    def ids(self) -> tuple[int, ...]:
        return self.prompt + self.continuation


def rows_of(tokenizer: Any, prompt: str, continuation: str) -> Row:
    """The prompt encoded as generation encodes it; the continuation without specials."""
    ids = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    if not ids:
        raise SteerError(f"The continuation {continuation!r:.40} has no tokens.")
    return Row(tuple(encode(tokenizer, prompt, chat=False)), tuple(ids))


def data_sha256(items: Sequence[Preference] | Sequence[Example]) -> str:
    """A content hash of the training data, for provenance."""
    payload = json.dumps([list(vars(item).values()) for item in items])
    return hashlib.sha256(payload.encode()).hexdigest()


def check_items(items: Any, kind: type, what: str) -> list[Any]:
    """A non-empty list of ``kind``; refused by name otherwise."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise SteerError(
            f"{what} must be a list of sl.{kind.__name__}; got {type(items).__name__}."
        )
    if not items:
        raise SteerError(f"No {what}: give at least one sl.{kind.__name__}.")
    bad = next((i for i, item in enumerate(items) if not isinstance(item, kind)), None)
    if bad is not None:
        raise SteerError(f"{what}[{bad}] is {type(items[bad]).__name__}, not sl.{kind.__name__}.")
    return list(items)


def check_settings(*, epochs: Any, lr: Any, batch_size: Any, seed: Any = 0,
                   **finite: Any) -> None:  # fmt: skip
    """Epochs and batch size are ints >= 1; the seed an int torch can take; lr and the rest
    finite numbers (lr > 0), an int too large for a float refused too."""
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SteerError(f"{name} must be an int >= 1; got {value!r}.")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise SteerError(f"seed must be an int in [0, 2**63); got {seed!r:.40}.")
    for name, value in {"lr": lr, **finite}.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SteerError(f"{name} must be a finite number; got {value!r:.40}.")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise SteerError(f"{name} must be a finite number; got {value!r:.40}.")
    if lr <= 0:
        raise SteerError(f"lr must be above 0; got {lr!r}.")
    if lr * ADAMW_FIRST_STEP > torch.finfo(torch.float32).max:
        raise SteerError(f"lr={lr!r:.40} is too large to train: AdamW's first step is "
                         f"lr / (1 - beta1) = {ADAMW_FIRST_STEP:g} x lr, past float32, the "
                         "steer's parameters' type.")  # fmt: skip


ADAMW_FIRST_STEP = 1 / (1 - 0.9)  # torch AdamW's first step size per unit lr (beta1 0.9)


def check_rows_fit(n_ctx: int | None, rows: Sequence[Row], what: str) -> None:
    """Every training row within the model's window, refused before any compute (as
    ``lm.generate`` refuses a prompt that would not fit)."""
    for i, row in enumerate(rows):
        check_window(n_ctx, len(row.prompt), len(row.continuation), what=f"{what}[{i}]'s tokens",
                     hint="; shorten it, or leave it out")  # fmt: skip


def check_factors(factors: Any, what: str = "factors") -> list[float]:
    """A non-empty list of finite real numbers (``core.scalars.real_list``), each within
    float32's range, the type the steer trains in (``1e308`` would be inf)."""
    values = real_list(factors, what)
    for value in values:
        if abs(value) > FLOAT32_MAX:
            raise SteerError(f"{what} holds {value!r:.40}, past float32's range (±{FLOAT32_MAX:.3g}), "
                             "the type the steer trains in: it would be inf.")  # fmt: skip
    return [float(v) for v in values]


FLOAT32_MAX = torch.finfo(torch.float32).max


def check_factor_scale(
    factors: Sequence[float], start: torch.Tensor, what: str = "factors"
) -> None:
    """Refuse factors that scale the starting vector ``start`` past what a forward can hold:
    the model's normalisations square the steered activation, so ``max|factor| x |start|``
    must stay below the square root of float32's largest value (about 1.8e19); past it the
    first loss is not finite before any update, whatever the lr."""
    largest = max(abs(f) for f in factors)
    size = largest * float(start.float().norm())
    if not size < math.sqrt(FLOAT32_MAX):
        raise SteerError(f"{what} up to {largest:g} scale the starting vector (norm "
                         f"{float(start.float().norm()):.3g}) to a steer of norm {size:.3g}, whose "
                         f"square (the model's normalisations compute it) is past float32 "
                         f"(max {FLOAT32_MAX:.3g}): give smaller factors.")  # fmt: skip
