"""Compact statistics of weights and activations, small enough for a report or an agent.

``weights(lm, names)`` and ``activations(acts)`` return ``Stats``: a mapping from a name to
``TensorStats`` whose text repr is one aligned line per tensor. ``compact=True`` keeps the
essentials (shape, mean, std, min, max, L2 norm); the full form adds percentiles and a
histogram.

>>> sl.stats.activations(lm.run_with_cache("Hi", sites=["blocks.0.hook_resid_post"]), compact=True)
activations (real tokens)
name                      shape                 mean       std       min       max      norm
blocks.0.hook_resid_post  [1, 3, 128] ...
"""

from __future__ import annotations

import difflib
import html
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from steerlab.core.scalars import flag
from steerlab.core.sites import Site

if TYPE_CHECKING:
    from steerlab.model import SteerableModel

PERCENTILES = (1, 5, 25, 50, 75, 95, 99)
BINS = 16
_BARS = " ▁▂▃▄▅▆▇█"
_EXACT_LIMIT = 1 << 24  # quantiles of larger tensors come from an even subsample


@dataclass(frozen=True)
class TensorStats:
    """Summary of one tensor. ``percentiles`` and ``histogram`` are None when compact.

    Attributes:
        shape: the tensor's shape.
        mean, std, min, max: over every element counted (real tokens for activations).
        norm: L2 norm of those elements.
        percentiles: percentile -> value.
        histogram: ``BINS`` counts over equal bins from min to max.
    """

    shape: tuple[int, ...]
    mean: float
    std: float
    min: float
    max: float
    norm: float
    percentiles: dict[int, float] | None = None
    histogram: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def sparkline(self) -> str:
        """The histogram as one line of bar characters."""
        if not self.histogram:
            return ""
        top = max(self.histogram) or 1
        return "".join(_BARS[round(c / top * (len(_BARS) - 1))] for c in self.histogram)


def describe(tensor: torch.Tensor, *, compact: bool = False,
             shape: tuple[int, ...] | None = None) -> TensorStats:  # fmt: skip
    """Statistics of ``tensor`` (every element); ``shape`` to report another shape.

    >>> describe(torch.arange(4.0), compact=True).mean
    1.5
    """
    x = tensor.detach().flatten().to("cpu", torch.float64)
    if x.numel() == 0:
        raise ValueError("Cannot describe an empty tensor.")
    base = dict(shape=tuple(shape if shape is not None else tensor.shape), mean=float(x.mean()),
                std=float(x.std()) if x.numel() > 1 else 0.0, min=float(x.min()),
                max=float(x.max()), norm=float(x.norm()))  # fmt: skip
    if flag(compact, "compact"):
        return TensorStats(**base)  # type: ignore[arg-type]
    sample = x[:: -(-x.numel() // _EXACT_LIMIT)]
    q = torch.quantile(sample, torch.tensor([p / 100 for p in PERCENTILES], dtype=torch.float64))
    hist = torch.histc(x, bins=BINS, min=base["min"], max=base["max"])  # type: ignore[arg-type]
    return TensorStats(**base, percentiles=dict(zip(PERCENTILES, q.tolist())),  # type: ignore[arg-type]
                       histogram=[int(c) for c in hist.tolist()])  # fmt: skip


class Stats(Mapping[str, TensorStats]):
    """Name -> ``TensorStats``, in order, with a compact text table for a repr."""

    def __init__(self, entries: dict[str, TensorStats], title: str = "") -> None:
        self._entries, self.title = dict(entries), title

    def __getitem__(self, name: str) -> TensorStats:
        if name not in self._entries:
            raise KeyError(f"{name!r} is not here; names: {list(self._entries)[:8]}...")
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain data (JSON-ready): name -> that tensor's numbers."""
        return {name: s.to_dict() for name, s in self._entries.items()}

    def __repr__(self) -> str:
        width = max([len(n) for n in self._entries] + [4])
        head = f"{'name':<{width}}  {'shape':<16} {'mean':>9} {'std':>9} {'min':>9} {'max':>9} {'norm':>9}"
        lines = [self.title] if self.title else []
        lines.append(head)
        for name, s in self._entries.items():
            numbers = " ".join(f"{v:>9.4g}" for v in (s.mean, s.std, s.min, s.max, s.norm))
            lines.append(f"{name:<{width}}  {str(list(s.shape)):<16} {numbers}")
            if s.percentiles is not None:
                cuts = " ".join(f"p{p} {v:.3g}" for p, v in s.percentiles.items())
                lines.append(f"{'':<{width}}  {cuts}  |{s.sparkline()}|")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        cols = ["shape", "mean", "std", "min", "max", "norm"]
        full = any(s.percentiles is not None for s in self._entries.values())
        head = "".join(f"<th>{c}</th>" for c in ["name", *cols, *(["histogram"] if full else [])])
        body = "".join(
            f"<tr><td><code>{html.escape(name)}</code></td><td>{list(s.shape)}</td>"
            + "".join(f"<td>{getattr(s, c):.4g}</td>" for c in cols[1:])
            + (f"<td><code>{s.sparkline()}</code></td>" if full else "")
            + "</tr>"
            for name, s in self._entries.items()
        )
        caption = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def weights(lm: SteerableModel, names: str | Sequence[str], *, compact: bool = False) -> Stats:
    """Statistics of every parameter under each named module.

    Args:
        lm: the model.
        names: canonical sites (``"blocks.2.hook_mlp_out"`` means block 2's MLP, a
            ``hook_resid_*`` site the whole block, ``"hook_embed"`` the embedding) or the
            model's own module or parameter names (``"transformer.h.2.attn"``). A
            TransformerBridge's ``._original_component`` segments are left out of the names.
        compact: shape, mean, std, min, max and L2 norm only.

    >>> sl.stats.weights(lm, ["blocks.1.hook_attn_out"], compact=True)
    weights of steerlab-tiny
    name                      shape                 mean       std       min       max      norm
    blocks.1.attn.q.weight    [128, 128] ...
    blocks.1.attn.o.bias      [128] ...
    """
    model = lm.model
    entries: dict[str, TensorStats] = {}
    for name in [names] if isinstance(names, str) else list(names):
        for full, param in _parameters(model, module_name(lm, name)):
            entries[full] = describe(param, compact=compact)
    return Stats(entries, f"weights of {lm.name or type(model).__name__}")


def activations(acts: Mapping[str, torch.Tensor] | torch.Tensor, *,
                compact: bool = False) -> Stats:  # fmt: skip
    """Statistics of captured activations, over real tokens only (pads left out).

    Args:
        acts: what ``lm.run_with_cache`` returns, a chat turn's or a generation's
            ``activations`` (site -> tensor), or one tensor.
        compact: shape, mean, std, min, max and L2 norm only.
    """
    if isinstance(acts, torch.Tensor):
        return Stats({"tensor": describe(acts, compact=compact)}, "activations")
    mask = getattr(acts, "attention_mask", None)
    entries = {}
    for site, tensor in acts.items():
        real = tensor[mask.bool()] if mask is not None and tensor.ndim == 3 else tensor
        entries[site] = describe(real, compact=compact, shape=tuple(tensor.shape))
    return Stats(entries, "activations (real tokens)" if mask is not None else "activations")


def module_name(lm: SteerableModel, name: str) -> str:
    """The module (or parameter) a name means: a canonical site, or the model's own name."""
    model = lm.model
    if name in lm.sites():  # before module names: a hook point module holds no weights
        return _site_module(lm, Site.parse(name))
    known = dict(model.named_modules()) | dict(model.named_parameters())
    if name in known:
        return name
    close = difflib.get_close_matches(name, [*lm.sites(), *known], n=3)
    raise KeyError(
        f"{name!r} is neither a site of this model nor one of its modules or parameters."
        + (f" Did you mean {', '.join(map(repr, close))}?" if close else "")
    )


def _site_module(lm: SteerableModel, site: Site) -> str:
    backend = getattr(lm.backend, "after", lm.backend)  # an amplified pair: the steered model
    layout = getattr(backend, "layout", None)
    blocks, attn, mlp = (
        (layout.blocks, layout.attn, layout.mlp)
        if layout is not None
        else ("blocks", "attn", "mlp")
    )
    if site.layer is None:
        return _embedding_name(lm.model) if layout is not None else "embed"
    block = f"{blocks}.{site.layer}"
    part = {"hook_attn_out": attn, "hook_mlp_out": mlp}.get(site.kind)
    return f"{block}.{part}" if part else block


def _embedding_name(model: torch.nn.Module) -> str:
    """Where a HuggingFace model keeps its token embedding (the hf table no longer names it)."""
    embedding = model.get_input_embeddings()  # type: ignore[operator]
    return next(name for name, module in model.named_modules() if module is embedding)


def _parameters(model: torch.nn.Module, name: str) -> list[tuple[str, torch.Tensor]]:
    params = dict(model.named_parameters())
    if name in params:
        return [(name, params[name])]
    module = model.get_submodule(name)
    return [(_plain(f"{name}.{p}" if name else p), t) for p, t in module.named_parameters()]


def _plain(name: str) -> str:
    """A TransformerBridge's parameter path without its wrapper segments (readable names)."""
    return name.replace("._original_component", "")
