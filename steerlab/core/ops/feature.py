"""``FeatureClamp``: an SAE feature's activation set to a value, the rest of the SAE's
reconstruction kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from steerlab.core.errors import SteerError
from steerlab.core.ops.base import Form, Op, _number, wide_dtype
from steerlab.core.sae import ARCHITECTURE_NAMES, encode


@dataclass(frozen=True, eq=False)
class FeatureClamp(Op):
    """Set SAE feature ``index`` to ``value`` and keep the SAE's reconstruction error.

    At each steered token ``x <- x + alpha * (value - f(x)) * v``, with ``v`` the steer's
    vector (the feature's decoder row ``W_dec[index]``) and ``f(x)`` the feature's
    activation as the SAE itself encodes ``x`` (``core.sae.encode``). Alpha 1 moves the
    decoder's output exactly as setting the feature to ``value`` would; alpha 0 leaves ``x``
    untouched. A topk SAE that rescales by the decoder norms (``decoder_norms``) divides the
    shift by ``|W_dec[index]|``, as its decode divides the activations.

    A ``standard`` or ``jumprelu`` feature needs only its encoder column, bias and threshold:
    ``encoder`` is ``W_enc[:, index]`` ``[d_in]`` and ``bias`` ``b_enc[index]``. A ``topk``
    feature depends on every feature, so ``encoder`` is the whole ``W_enc [d_in, d_sae]``
    and ``bias`` the whole ``b_enc``. ``b_dec_in`` is what the SAE subtracts from its input
    (``b_dec``, or zeros). ``site`` is the SAE's site, when known: the feature means
    nothing elsewhere, so a steer at another site is refused. Build one with
    ``sae.clamp(i, value)``; ``sae`` is the SAE's content hash, for provenance. Its table
    form reads the feature, so the compiled step holds standard and jumprelu clamps; a
    topk clamp has none and runs eagerly.
    """

    name: ClassVar[str] = "feature_clamp"
    value: float
    index: int
    encoder: torch.Tensor
    bias: torch.Tensor
    b_dec_in: torch.Tensor
    architecture: str = "standard"
    threshold: float = 0.0
    k: int | None = None
    decoder_norms: torch.Tensor | None = None
    sae: str = ""
    site: str = ""

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURE_NAMES:
            raise SteerError(
                f"feature_clamp architecture must be one of {list(ARCHITECTURE_NAMES)}; "
                f"got {self.architecture!r}."
            )
        index = self.index
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise SteerError(f"feature_clamp index must be an int >= 0; got {index!r}.")
        super().__post_init__()
        for name in ("sae", "site"):
            if not isinstance(getattr(self, name), str):
                raise SteerError(f"feature_clamp {name} must be a string.")
        object.__setattr__(self, "value", _number(self.value, "feature_clamp value"))
        object.__setattr__(self, "threshold", _number(self.threshold, "feature_clamp threshold"))
        self._check_shapes()

    def _check_shapes(self) -> None:
        encoder, bias, b_dec_in = self.encoder, self.bias, self.b_dec_in
        whole = self.architecture == "topk"
        want = {"encoder": 2 if whole else 1, "bias": 1 if whole else 0, "b_dec_in": 1}
        for label, t in (("encoder", encoder), ("bias", bias), ("b_dec_in", b_dec_in)):
            if t.ndim != want[label]:
                raise SteerError(
                    f"feature_clamp {label} must be {want[label]}-D for a {self.architecture} "
                    f"SAE; got shape {tuple(t.shape)}."
                )
        if b_dec_in.shape[0] != encoder.shape[0]:
            raise SteerError(
                f"feature_clamp b_dec_in has {b_dec_in.shape[0]} entries; the encoder reads "
                f"{encoder.shape[0]}."
            )
        if not whole:
            if self.k is not None or self.decoder_norms is not None:
                raise SteerError(f"k and decoder_norms are topk settings, not {self.architecture}.")
            return
        d_sae, k, norms = encoder.shape[1], self.k, self.decoder_norms
        if bias.shape[0] != d_sae or not 0 <= self.index < d_sae:
            raise SteerError(
                f"feature_clamp: encoder has {d_sae} features, bias {bias.shape[0]}, "
                f"index {self.index}."
            )
        if type(k) is not int or not 1 <= k <= d_sae:
            raise SteerError(f"feature_clamp of a topk SAE needs k in [1, {d_sae}]; got {k!r}.")
        if norms is not None and (tuple(norms.shape) != (d_sae,) or not (norms > 0).all()):
            raise SteerError(f"feature_clamp decoder_norms must be [{d_sae}], positive.")

    def form(self) -> Form | None:
        """A standard or jumprelu feature as table data (``b_dec`` folded into the bias);
        None for topk, whose feature depends on every other (it runs eagerly)."""
        if self.architecture == "topk":
            return None
        wide = wide_dtype(self.encoder.dtype)
        bias = self.bias.to(wide) - self.b_dec_in.to(wide) @ self.encoder.to(wide)
        threshold = self.threshold if self.architecture == "jumprelu" else 0.0
        return Form(feat=1.0, low=-math.inf, high=math.inf, encoder=self.encoder,
                    bias=float(bias), threshold=threshold, value=self.value)  # fmt: skip

    def check(self, site: str, vector: torch.Tensor) -> None:
        d_model = vector.shape[0]
        if self.site and site != self.site:
            raise SteerError(
                f"This feature clamp reads a feature of an SAE trained at {self.site}; it cannot "
                f"steer at {site}. Use the SAE's site, or add its decoder row with sl.Add()."
            )
        if self.encoder.shape[0] != d_model:
            raise SteerError(
                f"feature_clamp's encoder reads {self.encoder.shape[0]} dimensions, but the "
                f"steer's vector has {d_model}: the SAE and the vector do not match."
            )

    def feature(self, act: torch.Tensor) -> torch.Tensor:
        """The feature's activation at each row of ``act [n, d_in]``: ``[n]``."""
        t = self.on(act.device)
        encoder, bias, b_dec_in = t["encoder"], t["bias"], t["b_dec_in"]
        if self.architecture == "topk":
            f = encode(act, encoder, bias, b_dec_in, "topk", k=self.k,
                       decoder_norms=t.get("decoder_norms"))  # fmt: skip
            return f[:, self.index]
        threshold = torch.tensor(self.threshold, dtype=encoder.dtype, device=act.device)
        return encode(act, encoder[:, None], bias[None], b_dec_in, self.architecture,
                      threshold=threshold)[:, 0]  # fmt: skip

    def __call__(self, act: torch.Tensor, direction: torch.Tensor,
                 alpha: torch.Tensor) -> torch.Tensor:  # fmt: skip
        shift = self.value - self.feature(act)  # [n], in the SAE's dtype
        norms = self.on(act.device).get("decoder_norms")
        if norms is not None:  # a rescaling topk SAE decodes f / |W_dec[i]|
            shift = shift / norms[self.index]
        shift = shift.to(act.dtype)
        return act + alpha * shift[:, None] * direction

    def __repr__(self) -> str:
        sae = f", sae={self.sae[:12]}" if self.sae else ""
        return f"FeatureClamp({self.architecture} feature {self.index} -> {self.value:g}{sae})"
