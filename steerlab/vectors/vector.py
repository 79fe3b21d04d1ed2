"""``SteeringVector``: an immutable value, one direction per site, with arithmetic.

A vector is ``scale * directions``. Scalar arithmetic (``v * 4``, ``-v``, ``v / 2``)
only changes ``scale``, and ``scale`` is folded into the steer's alpha, never into the
direction. That is why ``(2 * v)`` at alpha 1 and ``v`` at alpha 2 steer with the very
same tensor and strength, bit for bit.

A vector is a value: ``==`` compares contents (the sites, every direction element for
element and in the same dtype, on any device, the scale, the provenance). It is deliberately
unhashable, as a dict of tensors is: use it as a value, not as a dict key. It multiplies by one number only: ``vec * [0, 4]`` is refused with the fix,
``vec.steers(alpha=[0, 4])``, because a list of alphas is a batch of rows, which belongs
to a steer, not to the vector.
"""

from __future__ import annotations

import hashlib
import html
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch

from steerlab.core import Operation, Positions, Steer, SteerError
from steerlab.core.sites import Site
from steerlab.core.steer import steers_at

if TYPE_CHECKING:
    from steerlab.model import SteerableModel


@dataclass(frozen=True)
class Provenance:
    """Where a vector came from: what the file format stores next to the tensors.

    ``residual_norms`` is the mean L2 norm of the residual at each site over the
    contrastive tokens, measured during extraction; ``relative()`` scales by it.
    ``model_config_sha256`` fingerprints the model's config (``core.identity``), so a
    model of the same name with another config is told apart; "" where unknown.
    """

    model: str = ""
    model_config_sha256: str = ""
    revision: str = ""
    backend: str = ""
    method: str = ""
    data_sha256: str = ""
    token: str = ""
    chat: bool = False
    n_positive: int = 0
    n_negative: int = 0
    residual_norms: Mapping[str, float] = field(default_factory=dict)
    steerlab_version: str = ""
    training: str = ""  # a trained vector's settings and last loss, as JSON (``sl.train``)


@dataclass(frozen=True, eq=False)
class SteeringVector:
    """A steering direction per site, a scale, and where it came from.

    Build one with ``steerlab.extract`` or ``SteeringVector.load``; combine with
    ``+``, ``-``, ``*``, ``/`` (by one number). Pass it (times an alpha) straight to
    ``lm.generate``, or to ``Steer(site, vec)`` for its direction at one site.
    Directions may be given as torch tensors or numpy arrays.

    >>> v = SteeringVector({"blocks.1.hook_resid_pre": torch.ones(4)})
    >>> (2 * v).steers()[0].alpha
    (2.0,)
    """

    directions: Mapping[str, torch.Tensor]  # site -> [d_model], float
    scale: float = 1.0
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        if not self.directions:
            raise ValueError("A SteeringVector needs at least one site.")
        clean: dict[str, torch.Tensor] = {}
        sizes = set()
        for name, tensor in self.directions.items():
            Site.parse(name)  # canonical names only
            tensor = _as_tensor(tensor)  # numpy arrays welcome
            if not isinstance(tensor, torch.Tensor) or tensor.ndim != 1:
                raise ValueError(f"The direction at {name} must be a 1-D tensor [d_model].")
            if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
                raise ValueError(f"The direction at {name} must be finite floats.")
            sizes.add(tensor.shape[0])
            clean[name] = tensor.detach().clone()
        if len(sizes) > 1:
            raise ValueError(f"Directions have different sizes {sorted(sizes)}.")
        if not math.isfinite(self.scale):
            raise ValueError(f"scale must be finite; got {self.scale!r}.")
        ordered = dict(sorted(clean.items(), key=lambda kv: Site.parse(kv[0])))
        object.__setattr__(self, "directions", MappingProxyType(ordered))
        object.__setattr__(self, "scale", float(self.scale))

    __hash__ = None  # type: ignore[assignment]  # equal by contents; no key or set member
    __array_ufunc__ = None  # numpy defers to the methods below instead of broadcasting over us

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SteeringVector):
            return NotImplemented
        return (
            self.sites == other.sites
            and all(_same(self.directions[s], other.directions[s]) for s in self.sites)
            and self.scale == other.scale
            and self.provenance == other.provenance
        )

    def __reduce__(self):  # a mappingproxy cannot be copied or pickled; rebuild from a dict
        return (type(self), (dict(self.directions), self.scale, self.provenance))

    # --- reading ------------------------------------------------------------------------

    @property
    def sites(self) -> list[str]:
        """Site names in forward order."""
        return list(self.directions)

    @property
    def layers(self) -> list[int | None]:
        return [Site.parse(s).layer for s in self.directions]

    @property
    def d_model(self) -> int:
        return next(iter(self.directions.values())).shape[0]

    @property
    def sha256(self) -> str:
        """The content fingerprint: sha256 of the scale, then each site's name, dtype, shape
        and bytes, in site order. Provenance does not enter it: two vectors that steer alike
        have the same fingerprint, wherever they came from.

        >>> SteeringVector({"blocks.0.hook_resid_pre": torch.ones(2)}).sha256[:12]
        '7a9e4ec93ba5'
        """
        digest = hashlib.sha256(f"scale:{self.scale!r}".encode())
        for site, direction in self.directions.items():
            data = direction.detach().to("cpu").contiguous()
            digest.update(f"|{site}:{data.dtype}:{tuple(data.shape)}:".encode())
            digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    def __getitem__(self, site: str) -> torch.Tensor:
        """The effective vector at ``site``: ``scale * direction``."""
        if site not in self.directions:
            raise KeyError(f"No direction at {site!r}; this vector has {self.sites}.")
        return self.scale * self.directions[site]

    def norms(self) -> dict[str, float]:
        """L2 norm of the effective vector at each site."""
        return {s: abs(self.scale) * float(d.norm()) for s, d in self.directions.items()}

    def direction_at(self, site: str) -> torch.Tensor:
        """The unscaled direction at ``site``, for ``Steer(site, vec)`` (scale goes to alpha).

        Raises:
            SteerError: the vector has no direction at ``site``.
        """
        if site not in self.directions:
            raise SteerError(
                f"This SteeringVector has no direction at {site!r}; it has {self.sites}. "
                "Steer at one of those, or extract at that site first."
            )
        return self.directions[site]

    def at(self, site: str) -> SteeringVector:
        """The same vector restricted to one site."""
        self[site]  # a clear KeyError for a missing site
        return replace(self, directions={site: self.directions[site]})

    # --- arithmetic ---------------------------------------------------------------------

    def __mul__(self, k: float) -> SteeringVector:
        if isinstance(k, SteeringVector):
            return NotImplemented
        return replace(self, scale=self.scale * _scalar(k, "*"))

    __rmul__ = __mul__

    def __truediv__(self, k: float) -> SteeringVector:
        if isinstance(k, SteeringVector):
            return NotImplemented
        return replace(self, scale=self.scale / _scalar(k, "/"))

    def __neg__(self) -> SteeringVector:
        return replace(self, scale=-self.scale)

    def __pos__(self) -> SteeringVector:
        return self

    def __add__(self, other: SteeringVector) -> SteeringVector:
        if not isinstance(other, SteeringVector):
            return NotImplemented
        if other.d_model != self.d_model:
            raise ValueError(f"Cannot add vectors of size {self.d_model} and {other.d_model}.")
        summed = {s: self[s] for s in self.sites}
        for s in other.sites:
            summed[s] = summed[s] + other[s] if s in summed else other[s]
        norms = {**other.provenance.residual_norms, **self.provenance.residual_norms}
        method = f"({self.provenance.method or '?'} + {other.provenance.method or '?'})"
        # A sum no longer stands for one data set: its hash and counts are cleared.
        provenance = replace(
            self.provenance, method=method, residual_norms=norms, data_sha256="",
            n_positive=0, n_negative=0,
        )  # fmt: skip
        return SteeringVector(summed, 1.0, provenance)

    def __sub__(self, other: SteeringVector) -> SteeringVector:
        if not isinstance(other, SteeringVector):
            return NotImplemented
        return self + (-other)

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None):
        """A copy with every direction on ``device`` and/or in ``dtype``."""
        moved = {s: d.to(device=device, dtype=dtype) for s, d in self.directions.items()}
        return replace(self, directions=moved)

    def normalized(self) -> SteeringVector:
        """Unit-norm direction at every site, scale 1."""
        unit = {s: d / d.norm() for s, d in self.directions.items() if float(d.norm()) > 0}
        return replace(self, directions=unit, scale=1.0)

    def relative(self) -> SteeringVector:
        """Alpha 1 adds the typical residual norm at each site, along the unit direction.

        Uses the residual norms measured during extraction. ``scale`` is kept, so
        ``(k * v).relative() == k * v.relative()``.

        >>> vec = sl.extract(lm, ["The day was happy"], ["The day was sad"], ["blocks.2.hook_resid_pre"])
        >>> lm.generate("Once upon a time", steer=vec.relative(), max_new_tokens=8).text
        [', there was a happy bear named Anna']
        """
        norms = self.provenance.residual_norms
        missing = [s for s in self.sites if s not in norms]
        if missing:
            raise ValueError(f"No residual norm recorded for {missing}: extract the vector.")
        unit = self.normalized()
        scaled = {s: d * norms[s] for s, d in unit.directions.items()}
        return replace(self, directions=scaled)

    def cosine(self, other: SteeringVector) -> dict[str, float]:
        """Cosine similarity with ``other`` at each site both vectors have."""
        shared = [s for s in self.sites if s in other.directions]
        return {
            s: float(torch.nn.functional.cosine_similarity(self[s].float(), other[s].float(), 0))
            for s in shared
        }

    def cosine_matrix(self) -> torch.Tensor:
        """``[n_sites, n_sites]`` cosine similarity between this vector's sites (``.sites`` order)."""
        stacked = torch.stack([d.float() for d in self.directions.values()])  # [n_sites, d]
        unit = stacked / stacked.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return unit @ unit.T

    # --- steering -----------------------------------------------------------------------

    def steers(
        self,
        alpha: float | Sequence[float] | None = None,
        *,
        positions: Positions = "all",
        op: Operation | None = None,
    ) -> list[Steer]:
        """One ``Steer`` per site, strength ``scale * alpha`` (``alpha`` 1 when None).

        A list of alphas gives one row per alpha when generating.

        >>> vec = sl.extract(lm, ["The day was happy"], ["The day was sad"], ["blocks.2.hook_resid_pre"])
        >>> lm.generate("Once upon a time", steer=vec.steers(alpha=[0, 4]), max_new_tokens=8).text
        [', there was a little cat called Finn', ', there was a happy joy. The']
        """
        return steers_at(self, None, 1.0 if alpha is None else alpha, positions, op)

    def steer(
        self,
        alpha: float | Sequence[float] | None = None,
        *,
        positions: Positions = "all",
        op: Operation | None = None,
    ) -> Steer:
        """The single ``Steer`` of a one-site vector (use ``.at(site)`` to pick one)."""
        if len(self.directions) != 1:
            raise ValueError(
                f"This vector has {len(self.directions)} sites; use .steers() or .at(site)."
            )
        return self.steers(alpha, positions=positions, op=op)[0]

    # --- files --------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write a safetensors file (one tensor per site, provenance in the header), or, for
        a ``.gguf`` path, llama.cpp's control vector (``steerlab/vectors/gguf.py``: which
        layer each site becomes, and what cannot travel)."""
        if str(path).endswith(".gguf"):
            from steerlab.vectors import gguf

            return gguf.save(self, path)
        from steerlab.vectors.io import save

        return save(self, path)

    @classmethod
    def load(cls, path: str | Path, model: SteerableModel | None = None) -> SteeringVector:
        """Read a file written by ``save`` (or a llama.cpp control vector, ``.gguf``: each
        ``direction.L`` at ``blocks.L.hook_resid_post``), checked against ``model`` when
        given."""
        if str(path).endswith(".gguf"):
            from steerlab.vectors import gguf

            return gguf.load(path, model=model)
        from steerlab.vectors.io import load

        return load(path, model=model)

    # --- display ------------------------------------------------------------------------

    def _rows(self) -> list[tuple[str, float, float | None]]:
        residual = self.provenance.residual_norms
        return [(s, n, residual.get(s)) for s, n in self.norms().items()]

    def __repr__(self) -> str:
        method = self.provenance.method or "unknown method"
        lines = [f"SteeringVector({method}, d_model={self.d_model}, scale={self.scale:g})"]
        for site, norm, resid in self._rows():
            extra = f"  (residual ~{resid:.3g})" if resid else ""
            lines.append(f"  {site}: |v|={norm:.4g}{extra}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td><code>{html.escape(s)}</code></td><td>{n:.4g}</td>"
            f"<td>{'' if r is None else f'{r:.4g}'}</td></tr>"
            for s, n, r in self._rows()
        )
        method = html.escape(self.provenance.method or "unknown method")
        return (
            f"<b>SteeringVector</b> &middot; {method} &middot; d_model {self.d_model} "
            f"&middot; scale {self.scale:g}<table><thead><tr><th>site</th><th>|v|</th>"
            f"<th>residual norm</th></tr></thead><tbody>{rows}</tbody></table>"
        )


def _as_tensor(value: Any) -> Any:
    """A numpy array (anything with ``__array__``) as a tensor; the caller checks the rest."""
    if isinstance(value, torch.Tensor) or not hasattr(value, "__array__"):
        return value
    return torch.as_tensor(value.__array__())


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical values of the same dtype; the device does not matter."""
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a.cpu(), b.cpu()))


def _scalar(k: object, op: str) -> float:
    """``k`` as a float, or a TypeError that says how to write what was meant.

    Plain numbers, numpy scalars and 0-d arrays or tensors are one number. A list or an
    array of alphas is refused: one vector has one scale, and one row per alpha is a steer.
    """
    if isinstance(k, numbers.Real) and not isinstance(k, bool):
        return float(k)
    if hasattr(k, "__array__") and getattr(k, "shape", None) == ():  # a 0-d array or tensor
        return float(k)  # type: ignore[arg-type]
    if isinstance(k, (list, tuple)) or hasattr(k, "__array__"):
        raise TypeError(
            f"SteeringVector {op} takes one number, not {type(k).__name__} {k!r}. For one row "
            "per alpha, write vec.steers(alpha=[...]) (or sl.Steer(site, vec, alpha=[...]))."
        )
    raise TypeError(f"SteeringVector {op} takes one number, not {type(k).__name__}.")
