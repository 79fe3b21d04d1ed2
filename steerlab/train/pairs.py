"""Preference pairs as training rows: each pair's chosen and rejected reply after its prompt,
checked against the context window, and scored under the model as it is (BiPO, RePS and
RePS-LoReFT all compare the steered model's log-probabilities with these)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from steerlab.core.concepts import Preference
from steerlab.train.data import check_rows_fit, rows_of
from steerlab.train.loop import continuation_logprobs


class PairRows:
    """The chosen and rejected rows of ``pairs``, in order, and (after ``reference``) their
    summed continuation log-probabilities ``ref_c`` and ``ref_r`` ``[n]`` under the
    unsteered model."""

    def __init__(self, tokenizer: Any, pairs: Sequence[Preference]) -> None:
        self.chosen = [rows_of(tokenizer, p.prompt, p.chosen) for p in pairs]
        self.rejected = [rows_of(tokenizer, p.prompt, p.rejected) for p in pairs]

    def check_fit(self, n_ctx: int | None, whose: str = "pairs'") -> None:
        check_rows_fit(n_ctx, self.chosen, f"{whose} chosen")
        check_rows_fit(n_ctx, self.rejected, f"{whose} rejected")

    def logprobs(self, engine: Any, call: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(chosen, rejected)`` ``[n]``: each reply's summed log-probability, no gradient,
        under whatever edit is active now."""
        with torch.no_grad():
            chosen = continuation_logprobs(engine, call, self.chosen, grad=False)[0]
            rejected = continuation_logprobs(engine, call, self.rejected, grad=False)[0]
        return chosen, rejected

    def reference(self, engine: Any, call: Any) -> None:
        """log p₀ of every reply under the unsteered model (no edit may be active)."""
        self.ref_c, self.ref_r = self.logprobs(engine, call)
