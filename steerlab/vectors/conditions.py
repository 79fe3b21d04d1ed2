"""``find_condition``: the site, threshold and comparator that best tell two prompt sets
apart, as CAST's ``find_best_condition_point`` searches them.

One forward per prompt reads every site at once; the grid (sites x comparators x
thresholds) is then arithmetic on the scores, never another forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from steerlab.core.bars import bar
from steerlab.core.errors import SteerError
from steerlab.core.prompts import Prompt
from steerlab.core.reads import COMPARES, PROMPT_READS, SCORES, Condition
from steerlab.core.reads import score as read_score
from steerlab.core.scalars import as_int, flag, list_of
from steerlab.core.sites import resolve
from steerlab.core.table import Table


@dataclass(frozen=True)
class FoundCondition:
    """The best condition by F1, and the whole grid it was chosen from.

    Attributes:
        condition: the best ``sl.Condition`` (site, direction, threshold, compare).
        f1: its F1 on the labelled prompts (``matching`` is the positive class).
        table: every (site, compare, threshold) tried, best first, with precision, recall
            and F1.
    """

    condition: Condition
    f1: float
    table: Table

    def __repr__(self) -> str:
        c = self.condition
        return (f"FoundCondition({c.site}, {c.compare} {c.threshold:.4g}, F1 {self.f1:.3f}; "
                f"{len(self.table)} grid cells)")  # fmt: skip


def find_condition(
    lm: Any,
    matching: Sequence[Prompt],
    other: Sequence[Prompt],
    sites: Sequence[str] | None = None,
    *,
    direction: Any = None,
    read: str = "mean",
    score: str = "cosine",
    thresholds: int = 50,
    batch_size: int = 32,
    chat: bool = False,
    progress: bool = True,
) -> FoundCondition:
    """Grid-search site, threshold and comparator by F1 on labelled prompts (CAST).

    At each site the condition's direction is ``direction`` (a tensor, or a steering
    vector's direction there), or by default the difference of the two sets' mean prompt
    activations (reduced by ``read`` as the condition will read them). Thresholds lie
    midway between neighbouring observed scores (at most ``thresholds`` per site, evenly
    spread over them); both comparators are tried. Ties keep the first cell in site, comparator and
    threshold order.

    Args:
        lm: the model.
        matching: prompts the condition should fire on.
        other: prompts it should not fire on.
        sites: where to look; every block's ``hook_resid_post`` when None.
        direction: the condition direction (None: the mean difference per site).
        read: ``"mean"`` or ``"last"``: how the condition reduces a prompt.
        score: ``"cosine"`` (CAST) or ``"projection"``.
        thresholds: how many thresholds per site, at most.
        batch_size: prompts per forward.
        chat: apply the chat template.
        progress: a progress bar over the forwards (shown only on long work).

    >>> found = sl.find_condition(lm, ["The sea was calm"], ["The forest was dark"],
    ...                           sites=["blocks.0.hook_resid_post"])
    >>> found.f1
    1.0
    """
    matching, other, sites, directions = _checked(lm, matching, other, sites, direction, read,
                                                  score, thresholds, batch_size)  # fmt: skip
    thresholds, batch_size = int(thresholds), int(batch_size)  # numpy's ints are ints too
    reduced, dtype = _reduced(
        lm, matching + other, sites, read, batch_size, chat, progress
    )  # site -> [n, d]
    labels = torch.tensor([True] * len(matching) + [False] * len(other))
    records: list[dict[str, Any]] = []
    best: tuple[float, str, torch.Tensor, float, str] | None = None
    for site in sites:
        h = reduced[site]
        c = directions.get(site)
        if c is None:
            c = _mean_difference(h, labels, site, dtype)
        scores = read_score(h, c, score)  # [n]
        for compare in COMPARES:
            for t, p, r, f in _grid(scores, labels, compare, thresholds):
                records.append({"site": site, "compare": compare, "threshold": t,
                                "precision": p, "recall": r, "f1": f})  # fmt: skip
                if best is None or f > best[0]:
                    best = (f, site, c, t, compare)
    assert best is not None
    f1, site, c, t, compare = best
    condition = Condition(site, c, threshold=t, compare=compare, read=read, score=score)
    records.sort(key=lambda rec: -float(rec["f1"]))  # stable: ties keep grid order
    table = Table("find_condition", ["site", "compare", "threshold", "precision", "recall", "f1"],
                  records, {"threshold": ".4g", "precision": ".3f", "recall": ".3f",
                            "f1": ".3f"})  # fmt: skip
    return FoundCondition(condition, f1, table)


# A mean difference whose norm is within this fraction of the activations' own norm is the
# rounding of the forwards (two identical sets, batched differently, differ by ~1e-7 of it in
# float32), not a direction; half-precision forwards round coarser (``_noise_floor``).
NOISE_FLOOR = 1e-4


def _checked(lm: Any, matching: object, other: object, sites: object, direction: Any,
             read: object, score: object, thresholds: object,
             batch_size: object) -> tuple[list, list, list[str], dict[str, torch.Tensor]]:  # fmt: skip
    """Every argument of ``find_condition`` checked against ``lm``, before any forward:
    ``(matching, other, sites, directions by site)`` (no directions when ``direction`` is
    None)."""
    if not hasattr(lm, "run_with_cache") or not hasattr(lm, "n_layers"):
        raise SteerError(f"find_condition needs a model (sl.load(...)); got "
                         f"{type(lm).__name__}.")  # fmt: skip
    matching, other = list_of(matching, "matching"), list_of(other, "other")
    if not matching or not other:
        raise SteerError("find_condition needs prompts of both classes: matching and other "
                         f"have {len(matching)} and {len(other)}.")  # fmt: skip
    if read not in PROMPT_READS:
        raise SteerError(f"find_condition reads prompts: read must be one of "
                         f"{list(PROMPT_READS)}; got {read!r}.")  # fmt: skip
    if score not in SCORES:
        raise SteerError(f"score must be one of {list(SCORES)}; got {score!r}.")
    for name, value in (("thresholds", thresholds), ("batch_size", batch_size)):
        number = as_int(value)
        if number is None or number < 1:
            raise SteerError(f"{name} must be an int >= 1; got {value!r:.60}.", name)
    sites = list_of(sites, "sites") if sites is not None else [
        f"blocks.{i}.hook_resid_post" for i in range(lm.n_layers)]  # fmt: skip
    if not sites:
        raise SteerError("find_condition needs at least one site.")
    repeated = sorted({s for s in sites if sites.count(s) > 1})
    if repeated:
        raise SteerError(f"sites repeat {repeated}: give each site once.")
    valid = lm.sites()
    for site in sites:
        resolve(site, valid)
    directions = {} if direction is None else {
        site: Condition(site, direction).direction.to(torch.float32) for site in sites}  # fmt: skip
    for site, c in directions.items():
        if c.shape[0] != lm.d_model:
            raise SteerError(f"direction at {site} has {c.shape[0]} values; this model has "
                             f"d_model={lm.d_model}.", "direction")  # fmt: skip
    return matching, other, sites, directions


def _mean_difference(h: torch.Tensor, labels: torch.Tensor, site: str,
                     dtype: torch.dtype) -> torch.Tensor:  # fmt: skip
    """The mean activation of ``matching`` minus that of ``other`` at ``site``; refused
    when it is no larger than the rounding of the forwards that read ``h [n, d]``."""
    c = h[labels].mean(0) - h[~labels].mean(0)
    size, scale = float(c.norm()), float(h.norm(dim=-1).mean())
    if size <= _noise_floor(dtype) * scale:
        kind = str(dtype).removeprefix("torch.")
        raise SteerError(
            f"At {site} the two sets' mean activations differ by {size:.3g}, against a typical "
            f"activation norm of {scale:.3g}: within the rounding of a {kind} forward, so no "
            "direction tells them apart there. Give prompts that differ, or other sites.",
            "sites",
        )
    return c


def _noise_floor(dtype: torch.dtype) -> float:
    """The fraction of the activations' norm that a mean difference must pass: ``NOISE_FLOOR``,
    or one of ``dtype``'s own rounding steps where that is coarser (float16: 1e-3, bfloat16:
    8e-3; a real difference between two sets' means is rarely under 1% of their norm)."""
    return max(NOISE_FLOOR, torch.finfo(dtype).eps)


def _reduced(lm: Any, prompts: list[Prompt], sites: list[str], read: str, batch_size: int,
             chat: bool, progress: bool) -> tuple[dict[str, torch.Tensor], torch.dtype]:  # fmt: skip
    """Each prompt's activation at each site, reduced over its real tokens: [n, d] float32;
    and the dtype the model computed them in."""
    parts: dict[str, list[torch.Tensor]] = {s: [] for s in sites}
    dtype = torch.float32
    starts = range(0, len(prompts), batch_size)
    for start in bar(
        starts, desc="find_condition", disable=not flag(progress, "progress") or len(starts) < 2
    ):
        acts = lm.run_with_cache(prompts[start : start + batch_size], sites=sites, chat=chat)
        real = acts.attention_mask.to(torch.float32)[..., None]  # [b, pos, 1]
        for site in sites:
            dtype = acts[site].dtype
            h = acts[site].to(torch.float32)
            if read == "last":  # left-padded: the last column is every row's last token
                parts[site].append(h[:, -1])
            else:
                parts[site].append((h * real).sum(1) / real.sum(1))
    return {s: torch.cat(p) for s, p in parts.items()}, dtype


def _grid(scores: torch.Tensor, labels: torch.Tensor, compare: str,
          count: int) -> list[tuple[float, float, float, float]]:  # fmt: skip
    """``(threshold, precision, recall, F1)`` for thresholds taken from ``scores``: midway
    between neighbouring observed scores, so that no prompt sits on a threshold, where the
    rounding of another batch's forward could flip its decision from what the grid says."""
    observed = scores.unique()  # sorted
    if len(observed) > 1:
        observed = (observed[:-1] + observed[1:]) / 2
    if len(observed) > count:
        observed = observed[torch.linspace(0, len(observed) - 1, count).round().long()]
    fires = scores[None] > observed[:, None] if compare == "above" else (
        scores[None] < observed[:, None])  # fmt: skip
    tp = (fires & labels).sum(1).float()
    fp = (fires & ~labels).sum(1).float()
    fn = (~fires & labels).sum(1).float()
    precision = torch.where(tp + fp > 0, tp / (tp + fp), torch.zeros_like(tp))
    recall = tp / (tp + fn)
    f1 = torch.where(precision + recall > 0, 2 * precision * recall / (precision + recall),
                     torch.zeros_like(tp))  # fmt: skip
    return list(zip(observed.tolist(), precision.tolist(), recall.tolist(), f1.tolist()))
