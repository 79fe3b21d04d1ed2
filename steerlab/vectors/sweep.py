"""``sweep``: a steering vector over a grid of alphas x layers, scored per cell.

Each site costs one ``lm.generate`` call carrying every prompt x alpha row, one
steered forward for the first-token KL, and one unsteered forward for fluency.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from steerlab.core.bars import bar
from steerlab.core.prompts import Prompt, normalise
from steerlab.core.reft import LoReFT
from steerlab.core.scalars import flag, list_of
from steerlab.core.sites import Site
from steerlab.core.steer import Steer, at_alphas
from steerlab.vectors.scoring import (
    completion_nll,
    kl_divergence,
    next_token_logprobs,
    pooled_perplexity,
)
from steerlab.vectors.vector import SteeringVector

if TYPE_CHECKING:
    from steerlab.model import SteerableModel

Score = Callable[[str], float]
Sweepable = SteeringVector | LoReFT  # a LoReFT is swept at the one site it was trained at
COLUMNS = ("site", "layer", "alpha", "score", "perplexity", "kl", "n")


def _mean(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


@dataclass(frozen=True)
class SweepResult:
    """A tidy table: one record per (site, alpha) cell, plus the unsteered baseline.

    ``score`` is the mean behaviour score over the cell's completions (texts the scorer
    gives ``nan`` are skipped), ``perplexity`` the pooled perplexity of the completions
    under the unsteered model, ``kl`` the mean KL of the first new token's distribution
    from the unsteered one, ``n`` the number of completions. ``completions`` maps
    ``(site, alpha)`` (``(vector, site, alpha)`` for named vectors) to the cell's texts,
    in prompt order.

    >>> cells = [(2.0, 0.5, 2.1), (4.0, 0.9, 3.0), (8.0, 1.0, 9.0)]  # alpha, score, perplexity
    >>> result = SweepResult(
    ...     [{"site": "blocks.2.hook_resid_pre", "alpha": a, "score": s, "perplexity": p, "kl": 0.0,
    ...       "n": 1} for a, s, p in cells], baseline={"score": 0.0, "perplexity": 2.0})
    >>> result.best(min_score=0.8)["alpha"]  # alpha 8 scores more, past 2x baseline perplexity
    4.0
    """

    records: list[dict[str, Any]]
    baseline: dict[str, float] = field(default_factory=dict)
    completions: dict[tuple[Any, ...], list[str]] = field(default_factory=dict, repr=False)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def to_pandas(self) -> Any:
        """The records as a ``pandas.DataFrame`` (pandas must be installed)."""
        import pandas as pd

        return pd.DataFrame.from_records(self.records, columns=list(self.records[0]))

    def best(self, min_score: float | None = None, max_ppl_ratio: float = 2.0) -> dict[str, Any]:
        """The highest-scoring cell whose perplexity is within ``max_ppl_ratio`` x baseline.

        Ties go to the smaller ``|alpha|``, then the lower perplexity. Raises ``ValueError`` naming the closest
        miss when no cell qualifies, or saying that ``score=`` is needed when no cell has a score.
        """
        if all(math.isnan(r["score"]) for r in self.records):
            raise ValueError(
                "No cell has a score, so there is no best one: run sl.sweep(..., score=fn) with "
                "fn(text) -> float (e.g. steerlab.toy.concept_score), or read the perplexity "
                "and kl columns yourself."
            )
        limit = max_ppl_ratio * self.baseline["perplexity"]
        fluent = [r for r in self.records if r["perplexity"] <= limit]
        scored = [r for r in fluent if not math.isnan(r["score"])]
        good = [r for r in scored if min_score is None or r["score"] >= min_score]
        if not good:
            top = max(scored, key=lambda r: r["score"], default=None)
            hint = (
                f" best fluent score was {top['score']:.3g}" if top
                else " no fluent cell has a score" if fluent
                else " no cell was fluent"
            )  # fmt: skip
            raise ValueError(
                f"No cell has perplexity <= {limit:.3g} ({max_ppl_ratio}x baseline)"
                f"{'' if min_score is None else f' and score >= {min_score}'};{hint}."
            )
        return dict(max(good, key=lambda r: (r["score"], -abs(r["alpha"]), -r["perplexity"])))

    def _columns(self) -> list[str]:
        named = bool(self.records) and "vector" in self.records[0]
        return (["vector"] if named else []) + ["site", "alpha", "score", "perplexity", "kl", "n"]

    def _cells(self) -> list[list[str]]:
        formats = {"alpha": "{:g}", "score": "{:.3f}", "perplexity": "{:.3f}", "kl": "{:.4f}"}
        return [[formats.get(c, "{}").format(r[c]) for c in self._columns()] for r in self.records]

    def __repr__(self) -> str:
        rows = [self._columns(), *self._cells()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [f"SweepResult({len(self)} cells; baseline {self._baseline_text()})"]
        lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
        return "\n".join(lines)

    def _baseline_text(self) -> str:
        return ", ".join(f"{k}={v:.3g}" for k, v in self.baseline.items())

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in self._columns())
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in self._cells()
        )
        return (
            f"<b>SweepResult</b> &middot; {len(self)} cells &middot; baseline "
            f"{html.escape(self._baseline_text())}<table><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>"
        )


def _targets(vector: Sweepable, layers: Sequence[int] | None, sites: Sequence[str] | None):
    if layers is not None and sites is not None:
        raise ValueError("Give layers= or sites=, not both.")
    own = [vector.site] if isinstance(vector, LoReFT) else vector.sites
    if sites is not None:
        targets = list_of(sites, "sites")
    elif layers is not None:
        layers = list_of(layers, "layers")
        kinds = sorted({Site.parse(s).kind for s in own})
        if len(kinds) != 1:
            raise ValueError(f"layers= needs a vector of one hook kind; it has {kinds}.")
        targets = [Site(int(layer), kinds[0]).name for layer in layers]
    else:
        targets = own
    missing = [s for s in targets if s not in own]
    if missing and isinstance(vector, LoReFT):
        raise ValueError(f"A LoReFT steers only at the site it was trained at, {vector.site}; "
                         f"it cannot be swept at {missing}.")  # fmt: skip
    if missing:
        raise ValueError(
            f"The vector has no direction at {missing}; it was extracted at {own}. "
            "Extract at those sites first (sl.extract(..., sites=[...]))."
        )
    if not targets:
        raise ValueError("Nothing to sweep: layers/sites is empty.")
    return targets


def _steers_at(vector: Sweepable, site: str, alphas: list[float]) -> list[Steer]:
    """The steers of one grid row: ``vector`` at ``site``, one alpha per generated row."""
    if isinstance(vector, LoReFT):
        return at_alphas(vector.steers(), alphas)  # its own site; alphas scale its scale
    return vector.at(site).steers(alpha=alphas)


def sweep(
    lm: SteerableModel,
    vector: Sweepable | Mapping[str, Sweepable],
    prompts: Prompt | Sequence[Prompt],
    alphas: Sequence[float],
    *,
    layers: Sequence[int] | None = None,
    sites: Sequence[str] | None = None,
    score: Score | None = None,
    max_new_tokens: int = 24,
    temperature: float = 0.0,
    seed: int | None = None,
    chat: bool = False,
    progress: bool = True,
) -> SweepResult:
    """Steer with ``vector`` at each alpha and site, and score every cell.

    Args:
        lm: the model.
        vector: a ``SteeringVector`` (its ``scale`` multiplies every alpha), an
            ``sl.LoReFT`` (swept at its own site; alpha 1 is the intervention as trained),
            or a dict of named ones: records then start with a ``"vector"`` column, and
            ``completions`` keys with the name.
        prompts: the prompts each cell completes.
        alphas: steering strengths; all of them share one generation batch per site.
        layers: steer one layer at a time, at the vector's site of that layer.
        sites: or name the sites; by default every site of the vector, one at a time.
        score: ``text -> float`` behaviour score (e.g. ``steerlab.toy.metrics.concept_score``).
        max_new_tokens: completion length.
        temperature: 0 for greedy; with a ``seed``, rows of a prompt share random numbers.
        seed: sampling seed.
        chat: apply the chat template to the prompts.
        progress: show a progress bar over sites once the sweep takes over a second.

    >>> vec = sl.extract(lm, ["The day was happy"], ["The day was sad"], ["blocks.2.hook_resid_pre"])
    >>> sweep(lm, vec, ["Once upon a time"], [0, 4], max_new_tokens=8, progress=False,
    ...       score=lambda text: float("happy" in text))
    SweepResult(2 cells; baseline score=0, perplexity=1.92)
                         site  alpha  score  perplexity      kl  n
      blocks.2.hook_resid_pre      0  0.000       1.920  0.0000  1
      blocks.2.hook_resid_pre      4  1.000       9.223  0.0875  1
    """
    prompts = normalise(prompts)
    alphas = [float(a) for a in list_of(alphas, "alphas")]
    if not alphas:
        raise ValueError("alphas is empty.")
    named = not isinstance(vector, (SteeringVector, LoReFT))
    vectors = {"": vector} if isinstance(vector, (SteeringVector, LoReFT)) else dict(vector)
    if not vectors:
        raise ValueError("No vectors to sweep.")
    cells = [(name, v, site) for name, v in vectors.items() for site in _targets(v, layers, sites)]
    scorer = score or (lambda _text: math.nan)
    options: dict[str, Any] = dict(
        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, chat=chat
    )

    base = lm.generate(prompts, **options)
    baseline = {
        "score": _mean([scorer(t) for t in base.text]),
        "perplexity": pooled_perplexity(completion_nll(lm, base.prompt_tokens, base.tokens)),
    }
    records: list[dict[str, Any]] = []
    completions: dict[tuple[Any, ...], list[str]] = {}
    for name, v, site in bar(cells, desc="sweep", disable=not flag(progress, "progress")):
        steers = _steers_at(v, site, alphas)
        for record, texts in _sweep_site(lm, steers, prompts, alphas, options, scorer):
            key: tuple[Any, ...] = (site, record["alpha"])
            if named:
                record, key = {"vector": name, **record}, (name, *key)
            records.append(record)
            completions[key] = texts
    return SweepResult(records, baseline, completions)


def _sweep_site(
    lm: SteerableModel,
    steers: list[Steer],  # one site, one alpha per row
    prompts: list[Prompt],
    alphas: list[float],
    options: dict[str, Any],
    scorer: Score,
) -> Iterator[tuple[dict[str, Any], list[str]]]:
    """One row of the grid: every prompt x alpha in one ``generate`` call, then scored."""
    site = steers[0].site
    gen = lm.generate(prompts, steers, **options)  # prompt-major rows
    nll = completion_nll(lm, gen.prompt_tokens, gen.tokens)
    k = len(alphas)
    # An extra alpha-0 row per prompt, in the same batch, is the KL reference.
    reference = [replace(s, alpha=(0.0, *s.alpha)) for s in steers]
    logprobs = next_token_logprobs(lm, prompts, reference, chat=options["chat"]).unflatten(
        0, (len(prompts), k + 1)
    )  # [prompts, 1 + alphas, vocab]
    kl = kl_divergence(logprobs[:, 1:], logprobs[:, :1]).flatten()  # [rows]
    for j, alpha in enumerate(alphas):
        rows = range(j, len(gen), k)
        texts = [gen.text[r] for r in rows]
        record = {
            "site": site,
            "layer": Site.parse(site).layer,
            "alpha": alpha,
            "score": _mean([scorer(t) for t in texts]),
            "perplexity": pooled_perplexity([nll[r] for r in rows]),
            "kl": float(kl[list(rows)].mean()),
            "n": len(rows),
        }
        yield record, texts
