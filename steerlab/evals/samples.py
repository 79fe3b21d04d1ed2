"""A benchmark's samples, cell by cell: what ``BenchmarkResult.browse()`` shows, without the
widgets, and ``to_pandas()``.

A cell is one method × concept of the table. At a factor, its samples are shown best first,
each beside a *reference*: the same instruction's text from an arm that did not steer. The
benchmark has no unsteered arm of its own, so the references are what the run holds, named
for what they are:

- ``unsteered``: an arm without a steer whose model input is the instruction alone
  (``sl.evals.Prompting(template="{instruction}", ...)``), or a method's rows at factor 0;
- ``prompting``: an arm without a steer that puts the concept in the prompt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from steerlab.core.errors import SteerError

FIRST_COLUMNS = ("method", "concept", "factor", "split", "instruction_index", "instruction",
                 "model_input", "text", "concept_rating", "instruction_rating",
                 "fluency_rating", "score", "parse_failed")  # fmt: skip


@dataclass(frozen=True)
class Reference:
    """An arm whose text for the same instruction is shown beside a steered one.

    Attributes:
        method: the arm's method name.
        factor: its rows' factor (0 for a method's unsteered rows; the arm's own for an arm
            without a steer).
        kind: ``"unsteered"`` or ``"prompting"``.
        label: what the browser calls it.
    """

    method: str
    factor: float
    kind: str
    label: str


class SampleIndex:
    """The samples of a benchmark result, by cell and factor, with their references.

    Args:
        result: a ``BenchmarkResult`` (its ``samples``, ``table``, ``leaderboard``,
            ``prompts`` and ``steers``).

    >>> from types import SimpleNamespace as NS
    >>> s = [{"method": "m", "concept": "c", "factor": f, "instruction_index": 0,
    ...       "instruction": "Hi", "model_input": "Hi", "text": t, "score": x}
    ...      for f, t, x in ((0.0, "plain", 1.0), (2.0, "steered", 2.0))]
    >>> index = SampleIndex(NS(samples=s, table=[{"method": "m", "concept": "c", "factor": 2.0}],
    ...                        leaderboard=[{"method": "m"}], prompts={}, steers={}))
    >>> [x["text"] for x in index.shown(("m", "c"), 2.0)], index.references(("m", "c"))[0].label
    (['steered'], 'unsteered: m at factor 0')
    """

    def __init__(self, result: Any) -> None:
        self.samples: list[dict[str, Any]] = list(result.samples)
        if not self.samples:
            raise SteerError("This benchmark result has no samples to browse.")
        self._by_cell: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for sample in self.samples:
            self._by_cell.setdefault((sample["method"], sample["concept"]), []).append(sample)
        self.chosen = {(r["method"], r["concept"]): r["factor"] for r in result.table}
        order = [r["method"] for r in result.leaderboard]
        methods = list(dict.fromkeys(s["method"] for s in self.samples))
        methods.sort(key=lambda m: order.index(m) if m in order else len(order))
        concepts = list(dict.fromkeys(s["concept"] for s in self.samples))
        self.cells = [(m, c) for m in methods for c in concepts if (m, c) in self._by_cell]
        prompts = getattr(result, "prompts", {}) or {}
        steers = getattr(result, "steers", {}) or {}
        self._no_steer = {cell for cell in self.cells
                          if cell in prompts or (cell in steers and steers[cell] is None)}  # fmt: skip

    def check_cell(self, method: str, concept: str) -> tuple[str, str]:
        """``(method, concept)`` if the result has that cell, else a ``SteerError`` naming it."""
        if (method, concept) not in self._by_cell:
            methods = sorted({m for m, _ in self.cells})
            concepts = sorted({c for _, c in self.cells})
            raise SteerError(f"No cell method={method!r}, concept={concept!r} in this result; "
                             f"methods: {methods}, concepts: {concepts}.")  # fmt: skip
        return method, concept

    def factors(self, cell: tuple[str, str]) -> list[float]:
        """The cell's factors, ascending."""
        return sorted({s["factor"] for s in self._by_cell[cell]})

    def default_factor(self, cell: tuple[str, str]) -> float:
        """The factor the selection split chose (the table's), else the cell's first."""
        chosen = self.chosen.get(cell)
        return chosen if chosen in self.factors(cell) else self.factors(cell)[0]

    def shown(self, cell: tuple[str, str], factor: float) -> list[dict[str, Any]]:
        """The cell's samples at ``factor``, best score first (ties: by instruction)."""
        rows = [s for s in self._by_cell[cell] if s["factor"] == factor]
        return sorted(rows, key=lambda s: (-_score(s), s["instruction_index"]))

    def references(self, cell: tuple[str, str]) -> list[Reference]:
        """The arms without a steer on the cell's concept: unsteered ones first, then
        prompting; the cell itself is left out."""
        concept = cell[1]
        found: list[Reference] = []
        for other in (c for c in self.cells if c[1] == concept):
            rows = self._by_cell[other]
            method = other[0]
            if other in self._no_steer:
                if other == cell:
                    continue
                alone = all(s["model_input"] == s["instruction"] for s in rows)
                kind = "unsteered" if alone else "prompting"
                how = "the instruction alone" if alone else "the concept in its prompt"
                found.append(Reference(method, rows[0]["factor"], kind,
                                       f"{kind}: {method}, {how}"))  # fmt: skip
            elif any(s["factor"] == 0 for s in rows):
                found.append(Reference(method, 0.0, "unsteered",
                                       f"unsteered: {method} at factor 0"))  # fmt: skip
        return sorted(found, key=lambda r: r.kind != "unsteered")

    def counterpart(self, reference: Reference, sample: dict[str, Any]) -> dict[str, Any] | None:
        """The reference arm's sample for the same concept and instruction, or None."""
        rows = self._by_cell.get((reference.method, sample["concept"]), [])
        return next((s for s in rows if s["factor"] == reference.factor
                     and s["instruction_index"] == sample["instruction_index"]), None)  # fmt: skip


def samples_frame(samples: list[dict[str, Any]]) -> Any:
    """The samples as a pandas DataFrame: one row each, the benchmark's columns first, then
    any others the samples carry (such as ``judge_replies``)."""
    try:
        import pandas as pd
    except ImportError as error:
        raise ImportError("BenchmarkResult.to_pandas needs pandas: "
                          "pip install 'steerlab[notebook]'.") from error  # fmt: skip
    seen = list(dict.fromkeys(k for s in samples for k in s))
    columns = [c for c in FIRST_COLUMNS if c in seen] + [c for c in seen if c not in FIRST_COLUMNS]
    return pd.DataFrame.from_records(samples, columns=columns)


def _score(sample: dict[str, Any]) -> float:
    score = sample.get("score")
    return float(score) if isinstance(score, (int, float)) and math.isfinite(score) else -math.inf
