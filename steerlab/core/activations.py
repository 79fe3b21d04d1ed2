"""Activations captured at canonical sites, with the tokens they belong to."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Activations(Mapping[str, torch.Tensor]):
    """A mapping site -> ``[batch, pos, d_model]``, rows left-padded.

    ``attention_mask`` marks real tokens (1) and pads (0); ``str_tokens`` gives
    each row's token strings, with ``""`` on pads.
    """

    tensors: dict[str, torch.Tensor]
    tokens: torch.Tensor  # [batch, pos]
    attention_mask: torch.Tensor  # [batch, pos]
    str_tokens: list[list[str]]

    def __getitem__(self, site: str) -> torch.Tensor:
        if site not in self.tensors:
            raise KeyError(f"{site!r} was not captured; captured: {sorted(self.tensors)}.")
        return self.tensors[site]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def real(self, site: str, row: int) -> torch.Tensor:
        """One row's activations without its pads: [real_pos, d_model]."""
        return self[site][row][self.attention_mask[row].bool()]

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in self.tensors.items())
        return f"Activations({len(self)} sites; {shapes})"

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td><code>{k}</code></td><td>{tuple(v.shape)}</td>"
            f"<td>{v.float().norm(dim=-1).mean():.3g}</td></tr>"
            for k, v in self.tensors.items()
        )
        return (
            "<table><thead><tr><th>site</th><th>shape</th><th>mean norm</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
        )
