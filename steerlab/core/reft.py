"""``LoReFT``: a low-rank representation intervention (Wu et al. 2024, ``pyreft``), as an op.

At a steered token, ``Φ(h) = h + α·Rᵀ(W h + b − R h)``: inside the ``rank``-dimensional
subspace R's orthonormal rows span, the activation's coordinates ``R h`` move to the learned
``W h + b``; everything outside it is untouched. Alpha 1 is the intervention as trained,
alpha 0 leaves the activation bit-identical.

A ``LoReFT`` is an operation of the op base (tensors R, W, b; equality by content; a data
form for the server and vLLM) that also carries where it acts (its site and positions) and a
scale, so it is a steer on its own: ``lm.generate(p, steer=reft)``, ``reft * 0.5``. Files are
safetensors with a JSON header, never pickle; ``from_pyreft`` reads pyreft's pickled
checkpoints only when asked to, and only with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import torch

from steerlab.core.identity import ModelId
from steerlab.core.ops import Op, SteerError, _number, own_copy
from steerlab.core.positions import Positions, _as_positions
from steerlab.core.steer import Steer

ORTHONORMAL_TOLERANCE = 1e-3  # |R Rᵀ − I| beyond this is not orthonormal rows
_FORMAT = "steerlab.loreft"


def low_rank_edit(act: torch.Tensor, R: torch.Tensor, W: torch.Tensor, b: torch.Tensor,
                  keep: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """THE LoReFT edit ``Rᵀ(W h + b − R h)`` of each row of ``act [n, d]`` (``R``, ``W``
    ``[rank, d]``, ``b [rank]``): ``[n, d]``. ``keep [n, rank]`` bool, where given, keeps
    each row's own columns of ``R``, ``W`` and ``b`` (vLLM's compiled graph stacks the
    LoReFTs of a forward in one set and gives each token its own; the others add exact
    zeros).

    >>> low_rank_edit(torch.zeros(1, 2), torch.eye(2), torch.zeros(2, 2), torch.ones(2))
    tensor([[1., 1.]])
    """
    inner = act @ W.T + b - act @ R.T  # [n, rank]
    if keep is not None:
        inner = torch.where(keep, inner, torch.zeros_like(inner))
    return inner @ R


@dataclass(frozen=True, eq=False)
class LoReFT(Op):
    """``h + α·Rᵀ(W h + b − R h)`` at ``site``, on the tokens ``positions`` names.

    Args:
        site: the site it was trained at; a steer elsewhere is refused.
        R: ``[rank, d_model]``, orthonormal rows (to 1e-3).
        W: ``[rank, d_model]``.
        b: ``[rank]``.
        positions: the position rule (``"first:3+last:3"``, pyreft's ``"f3+l3"``: see
            ``from_pyreft`` for short prompts; ``"all"``...).
        scale: the steer's alpha; ``reft * 0.5`` halves it.
        provenance: JSON text of how it was made (``sl.train.reft`` writes it).

    >>> R = torch.eye(2, 4); W = torch.zeros(2, 4); b = torch.ones(2)
    >>> reft = LoReFT("blocks.0.hook_resid_post", R, W, b, positions="last:1")
    >>> reft(torch.zeros(1, 4), R[0], torch.ones(1, 1))
    tensor([[1., 1., 0., 0.]])
    """

    name: ClassVar[str] = "loreft"
    site: str
    R: torch.Tensor
    W: torch.Tensor
    b: torch.Tensor
    positions: Positions = "all"
    scale: float = 1.0
    provenance: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.site, str) or not self.site:
            raise SteerError(f"LoReFT site must be a site name; got {self.site!r:.60}.")
        if not isinstance(self.provenance, str):
            raise SteerError("LoReFT provenance must be JSON text.")
        super().__post_init__()
        object.__setattr__(self, "positions", _as_positions(self.positions))
        object.__setattr__(self, "scale", _number(self.scale, "LoReFT scale"))
        self._check_shapes()

    def _check_shapes(self) -> None:
        R, W, b = self.R, self.W, self.b
        if R.ndim != 2 or R.shape[0] < 1:
            raise SteerError(f"LoReFT R must be [rank, d_model] with rank >= 1; got "
                             f"{tuple(R.shape)}.")  # fmt: skip
        rank, width = R.shape
        if rank > width:
            raise SteerError(f"LoReFT rank {rank} is above d_model {width}: R cannot have "
                             f"{rank} orthonormal rows.")  # fmt: skip
        if tuple(W.shape) != (rank, width) or tuple(b.shape) != (rank,):
            raise SteerError(f"LoReFT W must be [{rank}, {width}] and b [{rank}], as R is "
                             f"[{rank}, {width}]; got {tuple(W.shape)} and {tuple(b.shape)}.")  # fmt: skip
        off = orthonormal_error(R)
        if off > ORTHONORMAL_TOLERANCE:
            raise SteerError(f"LoReFT R's rows must be orthonormal: R Rᵀ is off the identity "
                             f"by {off:.3g} (> {ORTHONORMAL_TOLERANCE}).")  # fmt: skip

    @property
    def rank(self) -> int:
        return int(self.R.shape[0])

    @property
    def d_model(self) -> int:
        return int(self.R.shape[1])

    @property
    def sha256(self) -> str:
        """The content fingerprint: sha256 of site, positions and scale, then R, W and b
        (dtype, shape, bytes). Provenance does not enter it, as for a ``SteeringVector``."""
        digest = hashlib.sha256(f"{self.site}|{self.positions!r}|{self.scale!r}".encode())
        for name, tensor in self.tensors().items():
            data = tensor.detach().to("cpu").contiguous()
            digest.update(f"|{name}:{data.dtype}:{tuple(data.shape)}:".encode())
            digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    @property
    def made_for(self) -> ModelId:
        """The model it was trained on, from its provenance (empty when unknown): a steer
        of it on another model warns (``ModelMismatchWarning``), as a vector's does."""
        try:
            record = json.loads(self.provenance) if self.provenance else {}
        except (ValueError, RecursionError):  # free text: the model is unknown
            return ModelId()
        if not isinstance(record, dict):
            return ModelId()
        name, sha = record.get("model", ""), record.get("model_config_sha256", "")
        return ModelId(name if isinstance(name, str) else "", sha if isinstance(sha, str) else "")

    def form(self) -> None:
        return None  # a rank-r map: no table term (at prompt-only positions it still compiles)

    def check(self, site: str, vector: torch.Tensor) -> None:
        if site != self.site:
            raise SteerError(f"This LoReFT was trained at {self.site}; it cannot steer at "
                             f"{site}.")  # fmt: skip
        if vector.shape[0] != self.d_model:
            raise SteerError(f"LoReFT is {self.d_model} wide; the steer's vector has "
                             f"{vector.shape[0]}.")  # fmt: skip

    def __call__(self, act: torch.Tensor, direction: torch.Tensor,
                 alpha: torch.Tensor) -> torch.Tensor:  # fmt: skip
        t = self.on(act.device)
        R, W, b = (t[n].to(act.dtype) for n in ("R", "W", "b"))
        return act + alpha * low_rank_edit(act, R, W, b)

    # -- a steer of its own ------------------------------------------------------------

    def steers(self) -> list[Steer]:
        """One ``Steer``: this op at its site and positions, alpha its scale. The steer's
        vector is R's first row (the subspace's first direction; the op reads R itself)."""
        return [Steer(self.site, self.R[0], self.scale, self.positions, self)]

    def __mul__(self, factor: float) -> LoReFT:
        return replace(self, scale=self.scale * _number(factor, "A LoReFT's factor"))

    __rmul__ = __mul__

    def __neg__(self) -> LoReFT:
        return self * -1.0

    def at_positions(self, positions: Positions) -> LoReFT:
        """The same intervention on other positions (``SteeringVector.at`` picks a site:
        a LoReFT's site is the one it was trained at).

        >>> reft = LoReFT("blocks.1.hook_resid_post", torch.eye(4)[:2], torch.zeros(2, 4),
        ...               torch.zeros(2), positions="last:1")
        >>> reft.at_positions("first:3+last:3").positions
        'first:3+last:3'
        """
        return replace(self, positions=positions)

    def __repr__(self) -> str:
        scale = f", scale={self.scale:g}" if self.scale != 1.0 else ""
        return (f"LoReFT({self.site!r}, rank {self.rank}, d_model {self.d_model}, "
                f"positions={self.positions!r}{scale})")  # fmt: skip

    # -- files ---------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write ``path`` (``.reft.safetensors`` by convention): the tensors, and site,
        positions, scale and provenance as JSON in the header. Never pickle."""
        from safetensors.torch import save_file

        path = Path(path)
        tensors = {n: own_copy(t) for n, t in self.tensors().items()}
        meta = {"format": _FORMAT, "site": self.site, "positions": json.dumps(self.positions),
                "scale": repr(self.scale), "provenance": self.provenance}  # fmt: skip
        save_file(tensors, str(path), metadata=meta)
        return path

    @classmethod
    def load(cls, path: str | Path, *, model: Any = None) -> LoReFT:
        """Read a file ``save`` wrote; with ``model``, refuse one of another width or a
        site the model lacks before anything runs."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise SteerError(f"No LoReFT file at {path}.")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118
        except Exception as error:  # safetensors raises its own types for a bad file
            raise SteerError(f"{path} is not a safetensors file: {error}") from None
        if meta.get("format") != _FORMAT or set(tensors) != {"R", "W", "b"}:
            raise SteerError(f"{path} is not a LoReFT file (no {_FORMAT!r} header with R, W, b).")
        site, positions, scale = _header(meta, path)
        reft = cls(site, tensors["R"], tensors["W"], tensors["b"], positions=positions,
                   scale=scale, provenance=meta.get("provenance", ""))  # fmt: skip
        if model is not None:
            reft.check_model(model)
        return reft

    @staticmethod
    def is_file(path: str | Path) -> bool:
        """Whether ``path`` is a safetensors file whose header says it holds a LoReFT (read
        without loading any tensor; anything unreadable is False)."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                return (f.metadata() or {}).get("format") == _FORMAT
        except Exception:  # not a safetensors file: not a LoReFT file either
            return False

    def check_model(self, model: Any) -> None:
        """Refuse a model of another width, or one without this site; warn when it was
        trained on another model (``ModelMismatchWarning``)."""
        from steerlab.core.steer import check_steer, warn_made_elsewhere

        check_steer(self.site, self.R[0], model.sites(), model.d_model)
        warn_made_elsewhere(self.made_for, model, "This LoReFT", verb="trained")

    @classmethod
    def from_pyreft(cls, folder: str | Path, *, trust_pickle: bool = False,
                    positions: Positions | None = None, site: str | None = None,
                    model: Any = None) -> LoReFT:  # fmt: skip
        """Import a folder pyreft saved holding one LoReFT intervention.

        pyreft saves each intervention as a pickle (``intkey_*.bin``); reading one needs
        ``trust_pickle=True``, and even then only ``torch.load(weights_only=True)`` runs,
        which rebuilds tensors and refuses arbitrary objects. pyreft keeps R as
        ``rotate_layer`` ``[d_model, rank]`` (orthonormal columns) and W, b as its
        ``learned_source`` Linear (``weight``, ``bias``). ``site`` defaults to the one
        ``config.json`` names: pyvene's ``block_output`` of layer L is
        ``blocks.L.hook_resid_post`` (``steerlab.core.pyreft`` says what is read).

        ``positions`` is required: pyreft does not record them. Give the ones it trained on,
        in pyreft's notation (``"f3+l3"``) or steerlab's (``"first:3+last:3"``). On a prompt
        of n >= 2k tokens both edit the same tokens. On a shorter one they differ: pyreft's
        ``get_intervention_locations`` takes min(k, n // 2) tokens from each end, so for an
        odd n it leaves the middle token alone, where steerlab's ``first:k+last:k`` edits
        every token of a prompt of n <= 2k. (Some pyreft data modules also leave a prompt's
        last token out; steerlab counts every prompt token.)

        >>> sl.LoReFT.from_pyreft("my_reft", trust_pickle=True)  # positions="f3+l3" reads it
        Traceback (most recent call last):
        steerlab.core.errors.SteerError: from_pyreft needs positions=: pyreft does not record...
        """
        from steerlab.core import pyreft

        if not trust_pickle:
            raise SteerError("pyreft checkpoints are pickles: pass trust_pickle=True to read "
                             "one (only torch.load(weights_only=True) runs), or save it with "
                             "LoReFT.save as safetensors.")  # fmt: skip
        positions = _as_positions(pyreft.positions_of(positions))
        folder = Path(folder)
        files = sorted(folder.glob("intkey_*.bin"))
        if len(files) != 1:
            raise SteerError(f"{folder} has {len(files)} pyreft intervention files "
                             "(intkey_*.bin); from_pyreft reads exactly one.")  # fmt: skip
        config, where = pyreft.read_config(folder), str(folder / "config.json")
        rep = pyreft.one_representation(config, where) if config is not None else None
        if site is None:
            if rep is None:
                raise SteerError(f"{folder} has no config.json to tell the site: give site=, "
                                 "such as 'blocks.2.hook_resid_post'.")  # fmt: skip
            site = pyreft.site_of(rep, where)
        try:
            state = torch.load(files[0], map_location="cpu", weights_only=True)
        except Exception as error:  # weights_only refuses anything but tensors and containers
            raise SteerError(f"{files[0].name} is not a plain tensor checkpoint: {error}") from None
        rotate, W, b = pyreft.state_tensors(state, files[0].name)
        rank = rep["low_rank_dimension"] if rep is not None else None
        if rank is not None and rank != rotate.shape[1]:
            raise SteerError(f"{where} says low_rank_dimension {rank!r:.20}; {files[0].name}'s "
                             f"rotate_layer is {tuple(rotate.shape)}.")  # fmt: skip
        reft = cls(site, rotate.T.contiguous(), W, b, positions=positions,
                   provenance=json.dumps({"method": "pyreft", "file": files[0].name}))  # fmt: skip
        if model is not None:
            reft.check_model(model)
        return reft


def _header(meta: dict[str, str], path: Path) -> tuple[str, Positions, float]:
    """Site, positions and scale from a LoReFT file's header, each refused by name when
    missing or unreadable (the header is text anyone can edit)."""
    missing = [k for k in ("site", "positions", "scale") if k not in meta]
    if missing:
        raise SteerError(f"{path}'s header lacks {', '.join(missing)}.")
    try:
        positions = json.loads(meta["positions"])
    except (ValueError, RecursionError):
        raise SteerError(f"{path}'s header positions {meta['positions']!r:.60} is not "
                         "JSON.") from None  # fmt: skip
    try:
        scale = float(meta["scale"])
    except ValueError:
        raise SteerError(f"{path}'s header scale {meta['scale']!r:.60} is not a number.") from None
    return meta["site"], positions, scale


def orthonormal_error(R: torch.Tensor) -> float:
    """``max |R Rᵀ − I|``, computed in float64."""
    wide = R.detach().to(torch.float64)
    gram = wide @ wide.T
    off = (gram - torch.eye(R.shape[0], dtype=torch.float64, device=R.device)).abs().amax()
    return float(off) if math.isfinite(float(off)) else math.inf
