"""What one panel run computes, as plain functions of a ``PanelRequest`` (no widgets here)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from steerlab.core import Positions, Steer, SteerError
from steerlab.core.reads import COMPARES, Condition
from steerlab.core.reft import LoReFT
from steerlab.core.results import Generation
from steerlab.core.sites import Site
from steerlab.core.steer import steers_at
from steerlab.features import SAE
from steerlab.model import SteerableModel
from steerlab.vectors import SteeringVector
from steerlab.widgets.trained import trained_steer

VectorLike = SteeringVector | torch.Tensor | LoReFT  # a LoReFT: a trained steer
FEATURE = "SAE feature"  # the vector dropdown's entry for the SAE's chosen feature
FEATURE_OPS = ("add", "clamp")
CONDITION_KIND = "hook_resid_post"  # the "steer only when" row reads this site kind
Readouts = dict[tuple[str, str], list[float]]  # (vector, site) -> one value per new token


@dataclass(frozen=True)
class PanelRequest:
    """Every input of one run, read off the controls when it was asked for."""

    request_id: int
    prompt: str
    vector: str
    layer: int
    hook: str  # a site kind, e.g. "hook_resid_pre"
    alpha: float
    positions: Positions
    temperature: float
    top_k: int  # 0 means no top-k cut
    top_p: float
    seed: int
    max_new_tokens: int
    feature: int = 0  # with vector FEATURE: the SAE feature that steers
    feature_op: str = "add"  # "add" its decoder row, or "clamp" it to alpha
    condition: str = ""  # a vector name: steer only when the prompt reads as it ("": always)
    condition_layer: int = 0  # the condition reads blocks.{condition_layer}.hook_resid_post
    threshold: float = 0.0
    compare: str = "above"
    monitor: str = ""  # a vector name whose projection the strip shows ("": none)

    @property
    def site(self) -> str:
        return f"blocks.{self.layer}.{self.hook}"

    @property
    def condition_site(self) -> str:
        return f"blocks.{self.condition_layer}.{CONDITION_KIND}"

    def as_dict(self) -> dict[str, object]:
        """The inputs and the site; the feature, condition and monitor fields only when used."""
        data = {**asdict(self), "site": self.site}
        if self.vector != FEATURE:
            del data["feature"], data["feature_op"]
        if not self.condition:
            for name in ("condition", "condition_layer", "threshold", "compare"):
                del data[name]
        else:
            data["condition_site"] = self.condition_site
        if not self.monitor:
            del data["monitor"]
        return data


def check_vector(name: str, vector: object) -> None:
    """Raise ``SteerError`` unless ``vector`` can be offered in a panel under ``name``.

    Its size is checked when it is used, so that a wrong one shows inside the panel.

    >>> check_vector("v", [1.0, 2.0])  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    steerlab.core.errors.SteerError: Vector 'v' must be a SteeringVector, a 1-D torch.Tensor or an sl.LoReFT, not list.
    """
    if not isinstance(name, str) or not name:
        raise SteerError(f"A vector's name must be a non-empty string; got {name!r}.")
    if isinstance(vector, (SteeringVector, LoReFT)):
        return
    if not isinstance(vector, torch.Tensor) or vector.ndim != 1:
        shape = f" of shape {tuple(vector.shape)}" if isinstance(vector, torch.Tensor) else ""
        raise SteerError(
            f"Vector {name!r} must be a SteeringVector, a 1-D torch.Tensor or an sl.LoReFT, "
            f"not {type(vector).__name__}{shape}."
        )


def baseline_key(request: PanelRequest) -> tuple[object, ...]:
    """Everything the unsteered row depends on: equal keys give the same baseline text.

    Not the condition (it gates only steered rows; the baseline's alpha 0 changes nothing
    whether it fires or not) nor the monitor (a read, which never changes a token).

    >>> r = PanelRequest(1, "Hi", "v", 1, "hook_resid_pre", 4.0, "all", 0.0, 0, 1.0, 0, 8)
    >>> from dataclasses import replace
    >>> baseline_key(r) == baseline_key(replace(r, request_id=2, alpha=-3.0, layer=0))
    True
    """
    return (
        request.prompt,
        request.temperature,
        request.top_k,
        request.top_p,
        request.seed,
        request.max_new_tokens,
    )


@dataclass(frozen=True)
class PanelSteer:
    """The steer one run applies, and where its direction came from.

    ``lent_from`` is the site a single-site ``SteeringVector`` was extracted at, when the
    panel applies it at another site (``None`` otherwise). ``label`` names what steers: the
    vector, or the SAE feature.
    """

    steer: Steer
    lent_from: str | None = None
    label: str = ""


def panel_steer(
    request: PanelRequest,
    vectors: Mapping[str, VectorLike],
    alphas: Sequence[float],
    sae: SAE | None = None,
) -> PanelSteer:
    """The steer for ``request`` with one row per alpha (``[0, alpha]``: baseline and steered).

    A ``SteeringVector`` goes to ``Steer`` itself, so its scale joins alpha and its direction
    stays unscaled. One with a single site lends that direction to any other site, as a
    one-site vector with the same scale. A tensor is used as it is, at any site.

    With ``request.vector == FEATURE`` the SAE's feature ``request.feature`` steers: ``add``
    adds alpha times its decoder row (``sae.feature(i)``, lent to other sites like any
    one-site vector); ``clamp`` sets the feature to alpha (``sae.clamp``) at the SAE's own
    site only, the last row fully and any earlier (baseline) row not at all.

    >>> v = SteeringVector({"blocks.0.hook_resid_pre": torch.ones(3)}, scale=2.0)
    >>> r = PanelRequest(1, "Hi", "v", 1, "hook_resid_pre", 4.0, "all", 0.0, 0, 1.0, 0, 8)
    >>> ps = panel_steer(r, {"v": v}, [4.0]); ps.steer.alpha, ps.lent_from
    ((8.0,), 'blocks.0.hook_resid_pre')

    With ``request.condition`` naming a vector, the steer is gated by ``panel_condition``.
    """
    plan = _plan(request, vectors, alphas, sae)
    gate = panel_condition(request, vectors)
    if gate is None:
        return plan
    return replace(plan, steer=replace(plan.steer, when=gate))


def lent_direction(vector: VectorLike, site: str) -> torch.Tensor:
    """The direction ``vector`` steers with at ``site``, by the steering rule (``steers_at``):
    a one-site ``SteeringVector`` lends its direction to any other site.

    >>> v = SteeringVector({"blocks.0.hook_resid_pre": torch.ones(3)}, scale=2.0)
    >>> lent_direction(v, "blocks.2.hook_resid_post")
    tensor([1., 1., 1.])
    """
    if isinstance(vector, LoReFT):  # the panel never offers one to read (``_directions``)
        raise SteerError("A trained LoReFT has no direction to read: pick a vector.")
    (steer,) = steers_at(vector, site, 1.0)
    return steer.vector


def panel_condition(request: PanelRequest, vectors: Mapping[str, VectorLike]) -> Condition | None:
    """The "steer only when" gate: the named vector's direction read as CAST does (the
    prompt's mean, cosine score) at ``blocks.{condition_layer}.hook_resid_post``; ``None``
    when the request has no condition.

    >>> r = PanelRequest(1, "Hi", "v", 1, "hook_resid_pre", 4.0, "all", 0.0, 0, 1.0, 0, 8,
    ...                  condition="v", condition_layer=0, threshold=0.1)
    >>> panel_condition(r, {"v": torch.ones(3)})
    Condition(blocks.0.hook_resid_post: mean cosine above 0.1)
    """
    if not request.condition:
        return None
    if request.condition not in vectors:
        raise SteerError(
            f"No vector named {request.condition!r} to steer only when; the panel has "
            f"{sorted(vectors)}."
        )
    if request.compare not in COMPARES:
        raise SteerError(f"compare must be one of {list(COMPARES)}; got {request.compare!r}.")
    site = request.condition_site
    direction = lent_direction(vectors[request.condition], site)
    return Condition(site, direction, threshold=request.threshold, compare=request.compare)


def monitor_direction(
    request: PanelRequest, vectors: Mapping[str, VectorLike]
) -> torch.Tensor | None:
    """The monitored vector's direction at the steering site (``None`` with no monitor)."""
    if not request.monitor:
        return None
    if request.monitor not in vectors:
        raise SteerError(
            f"No vector named {request.monitor!r} to monitor; the panel has {sorted(vectors)}."
        )
    return lent_direction(vectors[request.monitor], request.site)


def _plan(
    request: PanelRequest,
    vectors: Mapping[str, VectorLike],
    alphas: Sequence[float],
    sae: SAE | None,
) -> PanelSteer:
    if request.vector == FEATURE and sae is not None:
        return _feature_steer(request, sae, alphas)
    if request.vector not in vectors:
        raise SteerError(f"No vector named {request.vector!r}; the panel has {sorted(vectors)}.")
    vector, site = vectors[request.vector], request.site
    if isinstance(vector, LoReFT):  # trained at its own site and positions: alpha scales it
        steer = trained_steer(request.vector, vector, site, request.positions, alphas)
        return PanelSteer(steer, None, f"{request.vector} (trained)")
    (steer,) = steers_at(vector, site, list(alphas), request.positions)
    if isinstance(vector, SteeringVector) and site not in vector.directions:
        return PanelSteer(steer, vector.sites[0], request.vector)
    return PanelSteer(steer, None, request.vector)


def _feature_steer(request: PanelRequest, sae: SAE, alphas: Sequence[float]) -> PanelSteer:
    label = f"feature {request.feature} of {sae.source or 'the SAE'}"
    if request.feature_op not in FEATURE_OPS:
        raise SteerError(f"feature op must be one of {FEATURE_OPS}; got {request.feature_op!r}.")
    if request.feature_op == "clamp":
        if request.site != sae.site:
            site = Site.parse(sae.site)
            raise SteerError(
                f"A clamp reads the SAE's own encoding, so it acts at the SAE's site {sae.site} "
                f"(layer {site.layer}, hook point {site.kind}), not at {request.site}."
            )
        strengths = [0.0] * (len(alphas) - 1) + [1.0]  # baseline rows untouched
        steer = sae.clamp(request.feature, request.alpha, alpha=strengths,
                          positions=request.positions)  # fmt: skip
        return PanelSteer(steer, None, label)
    vectors = {FEATURE: sae.feature(request.feature)}
    return replace(_plan(request, vectors, alphas, None), label=label)


@dataclass(frozen=True)
class BaselineRun:
    """The unsteered row of a finished run, kept while nothing that feeds it changes.

    ``activations`` holds the sites the run captured (every residual site and the SAE's);
    ``readouts`` what the engine's monitors read on the row: every readable vector at each
    residual site (and at the steering site, with a monitor on)."""

    key: tuple[object, ...]
    text: str
    tokens: list[int]
    activations: dict[str, torch.Tensor]  # site -> [1, pos, d_model]
    readouts: Readouts = field(default_factory=dict)  # (vector, site) -> per new token


def format_alpha(alpha: float) -> str:
    """Alpha for display: at most 4 decimals, no float noise (the exact value stays in records).

    >>> format_alpha(5.0000000000000036), format_alpha(-0.25), format_alpha(1 / 3)
    ('5', '-0.25', '0.3333')
    """
    return f"{round(alpha, 4) + 0.0:g}"  # + 0.0 turns -0.0 into 0.0


def next_free_stem(stem: str) -> str:
    """``{stem}_{n:03d}`` for the smallest n with no file of any suffix, so exports never
    overwrite one another.

    >>> next_free_stem("/nonexistent/panel_norms")
    '/nonexistent/panel_norms_001'
    """
    folder, name = Path(stem).parent, Path(stem).name
    n = 1
    while any(folder.glob(f"{name}_{n:03d}.*")):
        n += 1
    return f"{stem}_{n:03d}"


QUEUE_S = 60.0  # a panel run queues this long behind another call on the model, then fails


def stream_rows(
    lm: SteerableModel,
    request: PanelRequest,
    steer: Steer,
    is_current: Callable[[], bool],
    capture: Sequence[str] = (),
    monitor: Mapping[str, tuple[str, torch.Tensor]] | None = None,
) -> Iterator[tuple[list[str], Generation | None]]:
    """Yield ``(texts so far, None)`` per token (one per row of ``steer``), then the result.

    Stops as soon as ``is_current()`` is false; the stream is closed on the way out, which
    takes its hooks off the model. Yields nothing more after a stop. ``capture`` names sites
    whose activations the final generation keeps, over the prompt and the new tokens;
    ``monitor`` the engine's monitors (``lm.stream``'s ``monitor=``).
    """
    steps = lm.stream(
        request.prompt,
        steer,
        max_new_tokens=request.max_new_tokens,
        temperature=request.temperature,
        top_k=request.top_k or None,
        top_p=request.top_p,
        seed=request.seed,
        capture=capture,
        monitor=dict(monitor) if monitor else None,
        wait=QUEUE_S,
    )
    last = None
    try:
        for step in steps:
            if not is_current():
                return
            last = step
            yield step.text, None
    finally:
        close = getattr(steps, "close", None)  # a generator: closing it takes its hooks off
        if close is not None:
            close()
    if last is not None:
        yield last.text, last.result()


def default_layer(lm: SteerableModel, vectors: dict[str, VectorLike], layer: int | None) -> int:
    if layer is not None:
        if not 0 <= layer < lm.n_layers:
            raise ValueError(f"layer {layer} is out of range: this model has 0..{lm.n_layers - 1}.")
        return layer
    first = next(iter(vectors.values()))
    sites = first.sites if isinstance(first, SteeringVector) else (
        [first.site] if isinstance(first, LoReFT) else [])  # fmt: skip
    if sites and (found := Site.parse(sites[0]).layer) is not None:
        return found
    return lm.n_layers // 2


def check_panel(lm: SteerableModel, vectors: Mapping[str, VectorLike], sae: SAE | None) -> None:
    """Refuse what the panel cannot offer, before any widget exists."""
    if not vectors and sae is None:
        raise ValueError("SteeringPanel needs at least one vector, e.g. {'joy': vec}, or sae=.")
    for name, vector in vectors.items():
        check_vector(name, vector)
    if sae is None:
        return
    if not isinstance(sae, SAE):
        raise TypeError(f"sae must be an SAE (sl.load_sae); got {type(sae).__name__}.")
    if FEATURE in vectors:
        raise ValueError(f"{FEATURE!r} names the SAE's feature; give the vector another name.")
    if sae.d_in != lm.d_model:
        raise ValueError(
            f"The SAE reads {sae.d_in} dimensions; this model has d_model={lm.d_model}."
        )
