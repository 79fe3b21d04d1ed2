"""Turning caches, token lists and masks into the plain arrays a figure draws.

Internal to ``steerlab.plots``: every figure accepts any ``Mapping[str, Tensor]`` as a cache and
reads ``str_tokens`` / ``attention_mask`` off it only when the caller passes none explicitly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

# "blocks.{L}.hook_{kind}" and "blocks.{L}.{sub}.hook_{kind}", TransformerLens names.
_SITE_RE = re.compile(r"^blocks\.(\d+)\.(?:(\w+)\.)?hook_(\w+)$")


@dataclass(frozen=True)
class Site:
    """A parsed hook-site name: ``blocks.2.hook_resid_pre`` -> layer 2, kind ``resid_pre``."""

    name: str
    layer: int
    kind: str


def parse_site(name: str) -> Site | None:
    """Parse a TransformerLens site name; ``None`` for names outside ``blocks.{L}``."""
    match = _SITE_RE.match(name)
    if match is None:
        return None
    layer, sub, kind = match.groups()
    return Site(name, int(layer), f"{sub}.{kind}" if sub else kind)


def sites_of_kind(cache: Mapping[str, torch.Tensor], kind: str) -> list[Site]:
    """Sites of one kind in the cache, sorted by layer."""
    sites = [s for name in cache if (s := parse_site(name)) is not None and s.kind == kind]
    return sorted(sites, key=lambda s: s.layer)


def resid_kinds(cache: Mapping[str, torch.Tensor]) -> list[str]:
    """Residual-stream kinds present (``resid_pre``, ``resid_mid``, ``resid_post``), in model order."""
    order = {"resid_pre": 0, "resid_mid": 1, "resid_post": 2}
    kinds = {s.kind for name in cache if (s := parse_site(name)) and s.kind.startswith("resid")}
    return sorted(kinds, key=lambda k: (order.get(k, len(order)), k))


def cache_mask(
    cache: Mapping[str, torch.Tensor], mask: torch.Tensor | None, batch: int, pos: int
) -> torch.Tensor:
    """The ``[batch, pos]`` boolean mask of real tokens: explicit, else the cache's, else all."""
    if mask is None:
        mask = getattr(cache, "attention_mask", None)
    if mask is None:
        return torch.ones(batch, pos, dtype=torch.bool)
    mask = torch.as_tensor(mask).to("cpu").bool()
    if mask.shape != (batch, pos):
        raise ValueError(f"mask has shape {tuple(mask.shape)}, activations need ({batch}, {pos})")
    return mask


def cache_tokens(
    cache: Mapping[str, torch.Tensor], tokens: Sequence[Sequence[str]] | None
) -> Sequence[Sequence[str]] | None:
    """Token strings per row: explicit, else the cache's ``str_tokens``, else ``None``."""
    return tokens if tokens is not None else getattr(cache, "str_tokens", None)


def row_labels(tokens: Sequence[Sequence[str]] | None, row: int, positions: list[int]) -> list[str]:
    """Readable x-axis labels for the kept positions of one row (position numbers if no tokens)."""
    if tokens is None:
        return [str(p) for p in positions]
    return [display_token(tokens[row][p]) for p in positions]


def display_token(token: str) -> str:
    """A token as a figure should show it: whitespace made visible, HTML escaped.

    Plotly renders tick and cell text as HTML, so ``"<s>"`` would vanish as a tag.

    >>> display_token(" <s>")
    '␣&lt;s&gt;'
    """
    visible = token.replace("\n", "↵").replace("\t", "⇥").replace(" ", "␣") or "∅"
    return visible.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def real_positions(mask: torch.Tensor, row: int) -> list[int]:
    """Positions of real (unpadded) tokens in one row."""
    return torch.nonzero(mask[row], as_tuple=False).flatten().tolist()


def activation(cache: Mapping[str, torch.Tensor], site: str) -> torch.Tensor:
    """One site's activations as a float32 CPU tensor ``[batch, pos, d_model]``."""
    if site not in cache:
        raise KeyError(f"site {site!r} not in cache; cached sites: {sorted(cache)}")
    acts = cache[site].detach().to("cpu", torch.float32)
    if acts.ndim != 3:
        raise ValueError(f"{site}: expected [batch, pos, d_model], got shape {tuple(acts.shape)}")
    return acts


def token_ticks(
    labels: Sequence[str], max_ticks: int = 24, max_chars: int = 8
) -> dict[str, object]:
    """Axis settings that keep token labels readable: at most ``max_ticks``, each short.

    Every k-th position is labelled (the first always), long tokens are cut with "…", and the
    labels are turned 45° once there are more than a few. Hover still shows every token.

    Args:
        labels: One display label per position (``display_token`` output).
        max_ticks: Most labels to show.
        max_chars: Longest label, in characters, before it is cut.

    Returns:
        Keyword arguments for ``fig.update_xaxes`` / ``update_yaxes``.

    >>> token_ticks(["a", "b", "c"], max_ticks=2)["ticktext"]
    ['a', 'c']
    """
    step = max(1, -(-len(labels) // max_ticks))  # ceil
    kept = list(range(0, len(labels), step))
    text = [shorten(labels[i], max_chars) for i in kept]
    return {
        "tickmode": "array",
        "tickvals": kept,
        "ticktext": text,
        "tickangle": -45 if len(kept) > 8 else 0,
    }


def shorten(label: str, max_chars: int) -> str:
    """Cut a display label to ``max_chars`` visible characters, ending in "…" when cut.

    Cuts the visible text, never inside an HTML entity such as ``&lt;``.

    >>> shorten("&lt;|endoftext|&gt;", 5)
    '&lt;|en…'
    """
    plain = label.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    if len(plain) > max_chars:
        plain = plain[: max_chars - 1] + "…"
    return plain.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
