"""``FeatureActivations``: what an SAE reads in a batch of prompts, kept small by default.

Real SAEs have 16k-131k features, so a dense ``[batch, pos, d_sae]`` float32 tensor costs
``batch * pos * d_sae * 4`` bytes (8 prompts x 512 tokens x 131,072 features = 2 GiB).
By default only each token's top-k features are kept (values and indices), plus the
residual the SAE read (``batch * pos * d_in * 4`` bytes), from which any one feature's exact
activation is recomputed on demand, a bounded chunk of tokens at a time.
"""

from __future__ import annotations

import html
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from steerlab.core.scalars import as_int, list_of
from steerlab.features.errors import SAEError, int_in
from steerlab.features.sae import SAE

CHUNK_BYTES = 1 << 28  # the most one encoded chunk of tokens may take: 256 MiB


class TopFeatures(NamedTuple):
    """Per token, the strongest features, largest first; pads hold value 0 and index -1."""

    values: torch.Tensor  # [batch, pos, k]
    indices: torch.Tensor  # [batch, pos, k], long


@dataclass(frozen=True, eq=False)
class FeatureActivations:
    """An SAE's feature activations over left-padded prompts.

    Build with ``features(lm, prompts, sae)``. ``top(k)`` gives each token's strongest
    features; ``feature(i)`` gives one feature at every token, exactly; ``values`` is the
    dense ``[batch, pos, d_sae]`` tensor, kept only when asked for with ``dense=True``.

    Memory: ``batch * pos * (d_in + 2 * k) * 4`` bytes by default (a little more for the
    int64 indices), plus ``batch * pos * d_sae * 4`` with ``dense=True``.

    >>> acts = lm.features(["Once upon a time"], sl.load_sae("steerlab-tiny-sae"))
    >>> acts.top(5).indices[0, -1]
    tensor([476, 106,  95, 346, 339])
    """

    sae: SAE
    residual: torch.Tensor  # [batch, pos, d_in], what the SAE read at sae.site
    top_values: torch.Tensor  # [batch, pos, k_kept], descending; pads 0
    top_indices: torch.Tensor  # [batch, pos, k_kept]; pads -1
    attention_mask: torch.Tensor  # [batch, pos], 1 on real tokens
    tokens: torch.Tensor  # [batch, pos]
    str_tokens: list[list[str]]
    dense: torch.Tensor | None = None  # [batch, pos, d_sae] when asked for; pads 0
    bos_token_id: int | None = None  # the model's BOS, so that views can leave it out

    @classmethod
    def from_residual(
        cls,
        sae: SAE,
        residual: torch.Tensor,
        attention_mask: torch.Tensor,
        tokens: torch.Tensor,
        str_tokens: list[list[str]],
        *,
        k: int = 16,
        dense: bool = False,
        bos_token_id: int | None = None,
    ) -> FeatureActivations:
        """Encode ``residual [batch, pos, d_in]`` chunk by chunk, keeping the top ``k`` per token.

        >>> sae = sl.load_sae("steerlab-tiny-sae")
        >>> x = lm.run_with_cache(["Once"], sites=[sae.site])[sae.site]  # [1, pos, d_in]
        >>> mask = torch.ones(x.shape[:2], dtype=torch.long)
        >>> ids = torch.zeros(x.shape[:2], dtype=torch.long)
        >>> acts = FeatureActivations.from_residual(sae, x, mask, ids, [["?"] * x.shape[1]], k=8)
        >>> acts.top(8).values.shape
        torch.Size([1, 2, 8])
        """
        k = check_k(k, sae)
        batch, pos, _ = residual.shape
        real = attention_mask.to(residual.device).bool().reshape(-1)  # [batch * pos]
        values = torch.zeros(batch * pos, k, dtype=sae.dtype, device=sae.device)
        indices = torch.full((batch * pos, k), -1, dtype=torch.long, device=sae.device)
        full = (
            torch.zeros(batch * pos, sae.d_sae, dtype=sae.dtype, device=sae.device)
            if dense
            else None
        )
        for rows, f in _encode_chunks(sae, residual.reshape(-1, residual.shape[-1])):
            top = torch.topk(f, k, dim=-1)  # sorted, largest first
            keep = real[rows].to(sae.device)
            values[rows] = torch.where(keep[:, None], top.values, 0.0)
            indices[rows] = torch.where(keep[:, None], top.indices, -1)
            if full is not None:
                full[rows] = f * keep[:, None]
        return cls(
            sae, residual, values.reshape(batch, pos, k), indices.reshape(batch, pos, k),
            attention_mask, tokens, str_tokens,
            None if full is None else full.reshape(batch, pos, sae.d_sae), bos_token_id,
        )  # fmt: skip

    # --- reading ------------------------------------------------------------------------

    @property
    def k(self) -> int:
        """How many features per token are kept."""
        return self.top_values.shape[-1]

    @property
    def values(self) -> torch.Tensor:
        """The dense ``[batch, pos, d_sae]`` activations (pads 0), if kept.

        Raises:
            SAEError: they were not kept; the message says how, and what it costs.
        """
        if self.dense is None:
            batch, pos = self.attention_mask.shape
            size = batch * pos * self.sae.d_sae * self.top_values.element_size()
            raise SAEError(
                f"Dense values were not kept ({batch} x {pos} x {self.sae.d_sae} would take "
                f"{size / 2**20:.1f} MiB): pass dense=True to features(), or use "
                "acts.top(k) and acts.feature(i)."
            )
        return self.dense

    def top(self, k: int = 10) -> TopFeatures:
        """Each token's ``k`` strongest features, largest first: ``[batch, pos, k]`` each.

        Raises:
            SAEError: ``k`` exceeds the number kept (pass a larger ``k`` to ``features``).

        >>> acts = lm.features(["Once upon a time"], sl.load_sae("steerlab-tiny-sae"))
        >>> acts.top(3).values.shape
        torch.Size([1, 5, 3])
        """
        k = int_in(k, "top(k)", 1, self.k, " (the number kept: pass a larger k to features() "
                   "to keep more)")  # fmt: skip
        return TopFeatures(self.top_values[..., :k], self.top_indices[..., :k])

    def feature(self, i: int) -> torch.Tensor:
        """Feature ``i``'s exact activation at every token: ``[batch, pos]``, pads 0.

        >>> acts = lm.features(["Once upon a time"], sl.load_sae("steerlab-tiny-sae"))
        >>> acts.feature(13)[0]
        tensor([17.7910,  0.0000,  0.0000,  0.0000,  0.0000])
        """
        return self.columns([i])[..., 0]

    def columns(self, features: Sequence[int]) -> torch.Tensor:
        """Several features' exact activations: ``[batch, pos, len(features)]``, pads 0.

        Recomputed from the residual (the full encoding, as ``topk`` SAEs need).

        >>> acts = lm.features(["Once upon a time"], sl.load_sae("steerlab-tiny-sae"))
        >>> acts.columns([3, 7]).shape
        torch.Size([1, 5, 2])
        """
        index = torch.tensor(
            [self.sae._index(i) for i in list_of(features, "features")], dtype=torch.long
        )
        batch, pos = self.attention_mask.shape
        if self.dense is not None:
            return self.dense[..., index.to(self.dense.device)]
        out = torch.zeros(batch * pos, len(index), dtype=self.sae.dtype, device=self.sae.device)
        real = self.attention_mask.bool().reshape(-1).to(self.sae.device)
        for rows, f in _encode_chunks(self.sae, self.residual.reshape(batch * pos, -1)):
            out[rows] = f[:, index.to(f.device)] * real[rows, None]
        return out.reshape(batch, pos, len(index))

    def prompt_top(self, row: int = 0, n: int = 10, *, skip: int = 0) -> list[int]:
        """The ``n`` features with the largest activation anywhere in prompt ``row``, largest first.

        Exact for ``n <= k``: a feature's peak token has it among its top k, or k others beat it.
        ``skip`` leaves out the first real tokens (1: a BOS token, whose features say little
        about the prompt).

        >>> acts = lm.features(["Once upon a time"], sl.load_sae("steerlab-tiny-sae"))
        >>> acts.prompt_top(0, n=5)
        [13, 86, 152, 113, 171]
        """
        n = int_in(n, "prompt_top(n)", 1, self.k, " (the number kept)")
        row = self._row(row, "prompt_top(row)")
        positions = self.real_positions(row)
        skip = int_in(skip, "prompt_top(skip)", 0, len(positions), " (the row's real tokens)")
        real = self.attention_mask[row].bool().to(self.top_values.device)
        real[positions[:skip]] = False
        values = self.top_values[row][real].reshape(-1)
        indices = self.top_indices[row][real].reshape(-1)
        best: dict[int, float] = {}
        for index, value in zip(indices.tolist(), values.tolist()):
            if value > best.get(index, 0.0):
                best[index] = value
        return sorted(best, key=lambda i: -best[i])[:n]

    def real_positions(self, row: int) -> list[int]:
        """Positions of prompt ``row``'s real (unpadded) tokens."""
        row = self._row(row, "real_positions(row)")
        return torch.nonzero(self.attention_mask[row], as_tuple=False).flatten().tolist()

    def _row(self, row: object, what: str) -> int:
        return int_in(row, what, 0, self.attention_mask.shape[0] - 1, " (one per prompt)")

    def leading_bos(self, row: int) -> int:
        """1 when prompt ``row`` begins with the model's BOS and has other tokens, else 0:
        the ``skip`` of ``prompt_top`` that leaves a BOS token out (its features are the
        strongest of most prompts and say little about any).

        >>> acts = lm.features("Once upon a time", sl.load_sae("steerlab-tiny-sae"))
        >>> acts.leading_bos(0), acts.str_tokens[0][0]
        (1, '<|bos|>')
        """
        real = self.real_positions(row)
        first = int(self.tokens[row, real[0]]) if real else None
        return int(self.bos_token_id is not None and first == self.bos_token_id and len(real) > 1)

    # --- display ------------------------------------------------------------------------

    def _summary(self) -> str:
        batch, pos = self.attention_mask.shape
        kept = "dense" if self.dense is not None else f"top {self.k} per token"
        return f"{batch} prompts x {pos} positions, {kept}, {self.sae.d_sae} features at {self.sae.site}"

    def __repr__(self) -> str:
        return f"FeatureActivations({self._summary()})"

    def _repr_html_(self) -> str:
        positions = self.real_positions(0)[-12:]
        top = self.top(min(3, self.k))
        rows = "".join(
            f"<tr><td><code>{html.escape(self.str_tokens[0][p])}</code></td><td>"
            + ", ".join(
                f"{i} ({v:.2f})"
                for i, v in zip(top.indices[0, p].tolist(), top.values[0, p].tolist())
                if v > 0
            )
            + "</td></tr>"
            for p in positions
        )
        return (
            f"<b>FeatureActivations</b> &middot; {html.escape(self._summary())}<table><thead>"
            f"<tr><th>token (prompt 0)</th><th>top features (value)</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
        )


def check_k(k: object, sae: SAE) -> int:
    """A number of features per token as an int in ``[1, d_sae]``; anything else refused."""
    number = as_int(k)
    if number is None or not 1 <= number <= sae.d_sae:
        raise SAEError(f"k must be an int in [1, d_sae={sae.d_sae}]; got {k!r}.")
    return number


def _encode_chunks(sae: SAE, x: torch.Tensor) -> Iterator[tuple[slice, torch.Tensor]]:
    """``sae.encode`` over ``x [n, d_in]``, at most ``CHUNK_BYTES`` of features at a time."""
    step = max(1, CHUNK_BYTES // (sae.d_sae * 4))
    with torch.no_grad():
        for start in range(0, x.shape[0], step):
            rows = slice(start, min(start + step, x.shape[0]))
            yield rows, sae.encode(x[rows])
