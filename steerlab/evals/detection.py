"""Concept detection, AxBench's way: score each text by the largest ``h·v̂`` over its tokens
at the site, and report the ROC AUC of the concept's positive texts against its negatives."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from steerlab.core.concepts import ConceptData
from steerlab.core.errors import SteerError
from steerlab.core.ops import Add
from steerlab.core.rows import as_steers
from steerlab.core.scalars import as_real, list_of
from steerlab.core.steer import Steer
from steerlab.core.table import Table
from steerlab.vectors.extract import without_bos


def token_activations(lm: Any, texts: Sequence[str], site: str,
                      batch_size: int = 32) -> list[torch.Tensor]:  # fmt: skip
    """Each text's activations at ``site`` on its real tokens, its BOS left out:
    ``[tokens, d_model]`` per text, read once and scored against any number of directions."""
    out = []
    for start in range(0, len(texts), batch_size):
        acts = lm.run_with_cache(list(texts[start : start + batch_size]), sites=[site])
        real = without_bos(acts.tokens, acts.attention_mask, lm.tokenizer.bos_token_id)
        h = acts[site].float().cpu()  # [batch, pos, d]
        out += [h[row][real[row].cpu()] for row in range(len(h))]
    return out


def max_latents(activations: Sequence[torch.Tensor], direction: torch.Tensor) -> torch.Tensor:
    """``[texts]``: each text's max over its tokens of ``h·v̂``."""
    unit = direction.detach().float().cpu() / direction.detach().float().norm()
    return torch.stack([(h @ unit).max() for h in activations])


def token_latents(lm: Any, texts: Sequence[str], site: str, direction: torch.Tensor,
                  batch_size: int = 32) -> torch.Tensor:  # fmt: skip
    """``[texts]``: each text's max over its real tokens (its BOS left out) of ``h·v̂``."""
    return max_latents(token_activations(lm, texts, site, batch_size), direction)


def roc_auc(positive: Sequence[float] | torch.Tensor, negative: Sequence[float] | torch.Tensor
            ) -> float:  # fmt: skip
    """The probability that a random positive scores above a random negative (ties count
    half): the area under the ROC curve, by the Mann-Whitney U statistic over the pooled
    scores' ranks (tied scores share their average rank). Memory grows with n + m, never
    with n x m.

    >>> roc_auc([3.0, 2.0], [1.0, 2.0])
    0.875

    Raises:
        SteerError: either side empty, or a score that is not a finite real number (NaN
            included, as scikit-learn's ``roc_auc_score`` refuses it).
    """
    pos, neg = _scores(positive, "positive"), _scores(negative, "negative")
    pooled = torch.cat([pos, neg])
    _, where, counts = torch.unique(pooled, sorted=True, return_inverse=True,
                                    return_counts=True)  # fmt: skip
    # each distinct score's average rank (1-based): the ranks its ties span, averaged
    ends = torch.cumsum(counts, 0).double()
    average = ends - (counts.double() - 1) / 2
    rank_sum = float(average[where[: len(pos)]].sum())
    u = rank_sum - len(pos) * (len(pos) + 1) / 2  # positives above negatives, ties half
    return u / (len(pos) * len(neg))


def _scores(values: Sequence[float] | torch.Tensor, name: str) -> torch.Tensor:
    """``[n]`` float64 scores, each a finite real number, refused by name otherwise."""
    if isinstance(values, torch.Tensor):
        if values.dtype == torch.bool or values.is_complex():
            raise SteerError(f"roc_auc's {name} scores must be real numbers; got a "
                             f"{values.dtype} tensor.", name)  # fmt: skip
        scores = values.detach().cpu().double().flatten()
        bad = (~torch.isfinite(scores)).nonzero()
        if len(bad):
            i = int(bad[0, 0])
            raise SteerError(f"roc_auc's {name} scores must be finite real numbers; got "
                             f"{float(scores[i])} at [{i}].", name)  # fmt: skip
    else:
        numbers = []
        for i, value in enumerate(list_of(values, name)):
            number = as_real(value)
            if number is None:
                raise SteerError(f"roc_auc's {name} scores must be finite real numbers; got "
                                 f"{value!r:.40} at [{i}].", name)  # fmt: skip
            numbers.append(number)
        scores = torch.tensor(numbers, dtype=torch.float64)
    if not len(scores):
        raise SteerError(f"roc_auc needs at least one positive and one negative score; "
                         f"the {name} scores are empty.", name)  # fmt: skip
    return scores


def _direction(steer: Any, site: str) -> Any:
    """The steer's one direction at ``site``, or None (LoReFT, several sites, prompting)."""
    if steer is None:
        return None
    steers = as_steers(steer)
    if len(steers) != 1 or not isinstance(steers[0], Steer) or steers[0].site != site:
        return None
    if not isinstance(steers[0].op, Add) or not steers[0].alpha[0]:
        return None
    return steers[0].vector * math.copysign(1.0, steers[0].alpha[0])  # -v detects the other pole


def detection_table(lm: Any, concepts: list[ConceptData], methods: Sequence[Any],
                    steers: dict[tuple[str, str], Any], site: str) -> Table:  # fmt: skip
    """Method x concept ROC AUC, for the methods whose steer is one direction at ``site``
    (or at the method's own ``site``, where it has one); each concept's texts are read once
    a site, whatever the number of methods."""
    columns = ["method", "concept", "auroc", "n"]
    if not lm.engine.capabilities.capture:  # vLLM: no activations to read
        return Table(f"concept detection: not measured, the {lm.engine.kind} engine does not "
                     "record activations (run it on an in-process model)", columns, [])  # fmt: skip
    records = []
    for data in concepts:
        if not data.positives or not data.negatives:
            continue
        read: dict[str, tuple[list[Any], list[Any]]] = {}
        for method in methods:
            where = getattr(method, "site", None) or site
            direction = _direction(steers.get((method.name, data.name)), where)
            if direction is None:
                continue
            if where not in read:  # the texts' activations, once per concept and site
                read[where] = (token_activations(lm, list(data.positives), where),
                               token_activations(lm, list(data.negatives), where))  # fmt: skip
            pos, neg = (max_latents(h, direction) for h in read[where])
            records.append({"method": method.name, "concept": data.name,
                            "auroc": roc_auc(pos, neg), "n": len(pos) + len(neg)})  # fmt: skip
    return detection_rows(records)


def detection_rows(records: list[dict[str, Any]]) -> Table:
    """The detection table of measured rows (method, concept, auroc, n)."""
    return Table("concept detection: ROC AUC of positives against negatives (max over tokens "
                 "of h·v̂)", ["method", "concept", "auroc", "n"], records, {"auroc": ".3f"})  # fmt: skip
