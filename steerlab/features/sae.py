"""``SAE``: a sparse autoencoder over one site's activations, as an immutable value.

Encoding and decoding follow SAELens 6.x (``sae_lens/saes/*_sae.py``), so ``sae.encode(x)``
gives the values SAELens's ``SAE.encode`` gives. The encoding is ``core.sae.encode`` (the
one a ``FeatureClamp`` reads too); ``decode(f) = f @ W_dec + b_dec``, and ``topk`` with
rescaling divides ``f`` by the decoder row norms first.
"""

from __future__ import annotations

import hashlib
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from steerlab.core.identity import is_config_sha256
from steerlab.core.ops import FeatureClamp
from steerlab.core.positions import Positions
from steerlab.core.sae import ARCHITECTURE_NAMES, encode
from steerlab.core.sites import Site, SiteError
from steerlab.core.steer import Steer
from steerlab.features.errors import SAEError, int_in
from steerlab.vectors.io import plain_text
from steerlab.vectors.vector import Provenance, SteeringVector

# The architectures steerlab reads; the encoding itself is ``core.sae.encode``.
ARCHITECTURES = ARCHITECTURE_NAMES
# The dtypes an SAE computes and saves in (SAELens's DTYPE_MAP): no 1-byte floats.
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


@dataclass(frozen=True, eq=False)
class SAE:
    """A SAELens-format sparse autoencoder at one canonical site.

    Read one with ``load_sae``; ``save`` writes the same folder format back. Tensors are
    SAELens's: ``W_enc [d_in, d_sae]``, ``W_dec [d_sae, d_in]``, ``b_enc [d_sae]``,
    ``b_dec [d_in]``, and ``threshold [d_sae]`` for ``jumprelu``.

    Attributes:
        site: the steerlab site it reads (SAELens's ``metadata.hook_name``).
        architecture: ``"standard"``, ``"jumprelu"`` or ``"topk"``.
        k: the number of active features of a ``topk`` SAE.
        model_name: SAELens's ``metadata.model_name``, kept for provenance.
        model_config_sha256: the fingerprint of that model's config (``core.identity``),
            ``metadata.model_config_sha256`` in ``cfg.json``; "" when unknown (SAELens's
            own SAEs).
        source: the folder or name it was loaded from.
        metadata: the rest of SAELens's ``metadata``, written back by ``save``.

    >>> sae = SAE(torch.eye(4), torch.eye(4), torch.zeros(4), torch.zeros(4), "blocks.0.hook_resid_pre")
    >>> sae.encode(torch.tensor([1.0, -2.0, 0.0, 3.0])).tolist()
    [1.0, 0.0, 0.0, 3.0]
    """

    W_enc: torch.Tensor  # [d_in, d_sae]
    W_dec: torch.Tensor  # [d_sae, d_in]
    b_enc: torch.Tensor  # [d_sae]
    b_dec: torch.Tensor  # [d_in]
    site: str
    architecture: str = "standard"
    threshold: torch.Tensor | None = None  # [d_sae], jumprelu only
    k: int | None = None  # topk only
    rescale_acts_by_decoder_norm: bool = False  # topk only
    apply_b_dec_to_input: bool = True
    model_name: str = ""
    source: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    model_config_sha256: str = ""

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise SAEError(
                f"SAE architecture {self.architecture!r} is not supported; steerlab reads "
                f"{', '.join(repr(a) for a in ARCHITECTURES)}."
            )
        try:
            Site.parse(self.site)
        except SiteError:
            raise SAEError(
                f"SAE site {self.site!r} is not a steerlab site (TransformerLens names such as "
                "'blocks.2.hook_resid_pre')."
            ) from None
        d_in, d_sae = _shape(self.W_enc, "W_enc", 2)
        _check_dtype(self.W_enc.dtype, "W_enc is")
        shapes = {"W_dec": (d_sae, d_in), "b_enc": (d_sae,), "b_dec": (d_in,)}
        if self.architecture == "jumprelu":
            if self.threshold is None:
                raise SAEError("A jumprelu SAE needs a threshold tensor [d_sae].")
            shapes["threshold"] = (d_sae,)
        elif self.threshold is not None:
            raise SAEError(f"A {self.architecture} SAE has no threshold; only jumprelu does.")
        for name, shape in shapes.items():
            tensor = getattr(self, name)
            if tuple(tensor.shape) != shape:
                raise SAEError(f"SAE {name} has shape {tuple(tensor.shape)}; expected {shape}.")
            if tensor.dtype != self.W_enc.dtype or tensor.device != self.W_enc.device:
                raise SAEError(
                    f"SAE {name} is {tensor.dtype} on {tensor.device}; W_enc is "
                    f"{self.W_enc.dtype} on {self.W_enc.device}: one dtype and device for all."
                )
        if self.architecture == "topk":
            if type(self.k) is not int or not 1 <= self.k <= d_sae:
                raise SAEError(f"A topk SAE needs an int k in [1, {d_sae}]; got {self.k!r}.")
        elif self.k is not None or self.rescale_acts_by_decoder_norm:
            raise SAEError(
                f"k and rescale_acts_by_decoder_norm are topk settings, not {self.architecture}."
            )
        if not is_config_sha256(self.model_config_sha256):
            raise SAEError(
                "model_config_sha256 must be 16 hex digits (core.identity.config_sha256) or "
                f"''; got {self.model_config_sha256!r:.60}."
            )
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))

    __hash__ = None  # type: ignore[assignment]  # a value holding tensors, as SteeringVector

    # --- reading ------------------------------------------------------------------------

    @property
    def d_in(self) -> int:
        return self.W_enc.shape[0]

    @property
    def d_sae(self) -> int:
        return self.W_enc.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.W_enc.dtype

    @property
    def device(self) -> torch.device:
        return self.W_enc.device

    def tensors(self) -> dict[str, torch.Tensor]:
        """The weights by SAELens's names, as ``sae_weights.safetensors`` holds them."""
        out = {"W_enc": self.W_enc, "W_dec": self.W_dec, "b_enc": self.b_enc, "b_dec": self.b_dec}
        if self.threshold is not None:
            out["threshold"] = self.threshold
        return out

    @cached_property
    def content_hash(self) -> str:
        """sha256 of what decides the SAE's outputs: its settings and every weight's bytes.

        The same after ``save`` and ``load_sae``; file paths and metadata do not enter it.
        """
        digest = hashlib.sha256()
        settings = {
            "architecture": self.architecture, "site": self.site, "k": self.k,
            "rescale_acts_by_decoder_norm": self.rescale_acts_by_decoder_norm,
            "apply_b_dec_to_input": self.apply_b_dec_to_input,
        }  # fmt: skip
        digest.update(json.dumps(settings, sort_keys=True).encode())
        for name, tensor in sorted(self.tensors().items()):
            flat = tensor.detach().to("cpu").contiguous().reshape(-1)
            digest.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)}".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    # --- computing ----------------------------------------------------------------------

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations ``[..., d_in] -> [..., d_sae]``, as SAELens's ``SAE.encode``.

        The input is cast to the SAE's dtype and device; the output is in the SAE's dtype.

        Raises:
            SAEError: ``x``'s last dimension is not ``d_in``.

        >>> sae = sl.load_sae("steerlab-tiny-sae")
        >>> sae.encode(lm.run_with_cache("Hi", sites=[sae.site])[sae.site]).shape
        torch.Size([1, 3, 512])
        """
        x = self._input(x, self.d_in, "encode")
        return encode(x, self.W_enc, self.b_enc, self._b_dec_in, self.architecture,
                      threshold=self.threshold, k=self.k, decoder_norms=self._decoder_norms)  # fmt: skip

    def decode(self, feature_acts: torch.Tensor) -> torch.Tensor:
        """Reconstruction ``[..., d_sae] -> [..., d_in]``, as SAELens's ``SAE.decode``.

        >>> sae = sl.load_sae("steerlab-tiny-sae")
        >>> x = lm.run_with_cache("Once upon a time", sites=[sae.site])[sae.site]
        >>> x_hat = sae.decode(sae.encode(x))
        >>> round(float((x_hat - x).norm() / x.norm()), 2)
        0.03
        """
        f = self._input(feature_acts, self.d_sae, "decode").to(device=self.device, dtype=self.dtype)
        if self.rescale_acts_by_decoder_norm:
            f = f * (1 / self.W_dec.norm(dim=-1))  # SAELens divides by the row norms
        return f @ self.W_dec + self.b_dec

    def _input(self, x: torch.Tensor, width: int, verb: str) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.ndim == 0 or x.shape[-1] != width:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise SAEError(f"SAE.{verb} takes a tensor [..., {width}]; got {shape}.")
        return x

    # --- steering -----------------------------------------------------------------------

    def feature(self, i: int) -> SteeringVector:
        """Feature ``i``'s decoder row ``W_dec[i]`` as a ``SteeringVector`` at ``self.site``.

        The direction is ``W_dec[i]`` exactly (not renormalised), so alpha is in units of the
        feature's own activation. The provenance names the SAE (source, content hash) and ``i``.

        Raises:
            SAEError: ``i`` is not an int in ``[0, d_sae)``.

        >>> sae = sl.load_sae("steerlab-tiny-sae")
        >>> steer = sl.Steer(sae.site, sae.feature(112), alpha=8.0)
        >>> lm.generate("The day was", steer=steer, max_new_tokens=8).text
        [' the cat went for a walk. The']
        """
        index = self._index(i)
        provenance = Provenance(
            model=plain_text(self.model_name),
            model_config_sha256=self.model_config_sha256,
            method=plain_text(f"sae feature {index} of {self.source or 'an SAE'}"),
            data_sha256=self.content_hash,
        )
        return SteeringVector({self.site: self.W_dec[index]}, 1.0, provenance)

    def clamp(self, i: int, value: float, *, alpha: float | Sequence[float] = 1.0,
              positions: Positions = "all") -> Steer:  # fmt: skip
        """A ``Steer`` that sets feature ``i`` to ``value`` and keeps the reconstruction error.

        At each steered token ``x <- x + alpha * (value - f_i(x)) * W_dec[i]``, with
        ``f_i(x)`` this SAE's own encoding of ``x`` (the whole encoding for ``topk``). Alpha
        1 sets the feature, alpha 0 is bit-identical to no steer, and a list of alphas runs
        one row each. It is a ``FeatureClamp`` operation: the encoder column, bias and
        threshold it needs (the whole encoder for ``topk``) travel with it, so it runs on
        every engine, a server's included.

        Raises:
            SAEError: ``i`` is not an int in ``[0, d_sae)``.
            SteerError: ``value``, ``alpha`` or ``positions`` is not valid.

        >>> sae = sl.load_sae("steerlab-tiny-sae")
        >>> lm.generate("The day was", steer=sae.clamp(112, value=10.0), max_new_tokens=8).text
        [' the cat went for a walk. The']
        """
        index = self._index(i)
        topk = self.architecture == "topk"
        threshold = 0.0 if self.threshold is None else float(self.threshold[index])
        op = FeatureClamp(
            value, index,
            encoder=self.W_enc if topk else self.W_enc[:, index],
            bias=self.b_enc if topk else self.b_enc[index],
            b_dec_in=self._b_dec_in, architecture=self.architecture, threshold=threshold,
            k=self.k, decoder_norms=self._decoder_norms, sae=self.content_hash, site=self.site,
        )  # fmt: skip
        return Steer(self.site, self.feature(index), alpha=alpha, positions=positions, op=op)

    @cached_property
    def _b_dec_in(self) -> torch.Tensor:
        """What the encoder subtracts from its input: ``b_dec``, or zeros."""
        return self.b_dec if self.apply_b_dec_to_input else torch.zeros_like(self.b_dec)

    @cached_property
    def _decoder_norms(self) -> torch.Tensor | None:
        """``|W_dec[i]|`` per feature, for a topk SAE that rescales by them."""
        return self.W_dec.norm(dim=-1) if self.rescale_acts_by_decoder_norm else None

    def _index(self, i: object) -> int:
        return int_in(i, "feature index", 0, self.d_sae - 1, f" (this SAE's {self.d_sae} features)")

    # --- files and devices --------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write ``cfg.json`` and ``sae_weights.safetensors`` to the folder ``path``.

        SAELens's ``SAE.load_from_disk(path)`` reads it back.

        >>> sl.load_sae("steerlab-tiny-sae").save("my-sae").name
        'my-sae'
        """
        from steerlab.features.format import write_folder

        return write_folder(self, path)

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> SAE:
        """A copy with every weight on ``device`` and/or in ``dtype``.

        Raises:
            SAEError: ``dtype`` is not float32, float64, float16 or bfloat16.

        >>> sl.load_sae("steerlab-tiny-sae").to(dtype=torch.float16).dtype
        torch.float16
        >>> sl.load_sae("steerlab-tiny-sae").to("cuda")  # needs a CUDA device  # doctest: +SKIP
        """
        if dtype is not None:
            _check_dtype(dtype, "SAE.to: dtype")
        moved: dict[str, Any] = {
            n: t.to(device=device, dtype=dtype) for n, t in self.tensors().items()
        }
        return replace(self, **moved)

    # --- display ------------------------------------------------------------------------

    def _facts(self) -> list[tuple[str, str]]:
        facts = [("site", self.site), ("architecture", self.architecture)]
        if self.k is not None:
            facts.append(("k", str(self.k)))
        facts += [
            ("d_in x d_sae", f"{self.d_in} x {self.d_sae}"),
            ("dtype", str(self.dtype).removeprefix("torch.")),
            ("model", self.model_name or "?"),
            ("source", self.source or "?"),
        ]
        return facts

    def __repr__(self) -> str:
        k = f", k={self.k}" if self.k is not None else ""
        return (
            f"SAE({self.architecture}{k}, site={self.site!r}, d_in={self.d_in}, "
            f"d_sae={self.d_sae}, model={self.model_name or '?'!r}, source={self.source or '?'!r})"
        )

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(name)}</td><td><code>{html.escape(value)}</code></td></tr>"
            for name, value in self._facts()
        )
        return f"<b>SAE</b><table><tbody>{rows}</tbody></table>"


def _shape(tensor: object, name: str, ndim: int) -> tuple[int, ...]:
    if not isinstance(tensor, torch.Tensor) or tensor.ndim != ndim:
        raise SAEError(f"SAE {name} must be a {ndim}-D tensor.")
    if not tensor.is_floating_point():
        raise SAEError(f"SAE {name} must be floating point; got {tensor.dtype}.")
    return tuple(tensor.shape)


def _check_dtype(dtype: object, what: str) -> None:
    if dtype not in FLOAT_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in FLOAT_DTYPES)
        raise SAEError(f"{what} {dtype}; an SAE computes and saves in {names}.")
