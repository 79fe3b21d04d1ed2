"""``BenchmarkResult.browse()``: a benchmark's samples in the notebook, cell by cell.

Pick a method × concept cell (the leaderboard's order); its samples at the chosen factor are
listed best first, each with the instruction, the steered text and, beside it, the same
instruction's text from an arm that did not steer (``steerlab.evals.samples``), the three
ratings and the judge's replies where the run kept them. The factor slider shows the cell at
its other factors. Loaded only when ``browse()`` is called: ipywidgets is the notebook extra's.

The look follows the live panel's (``steerlab.widgets``): bordered panes, texts in a
monospace font with their line breaks, a model input in grey before its text.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as widgets

from steerlab.core.errors import SteerError
from steerlab.evals.samples import Reference, SampleIndex

RATING_NAMES = (("concept_rating", "concept"), ("instruction_rating", "instruction"),
                ("fluency_rating", "fluency"))  # fmt: skip
JUDGE_CRITERIA = ("concept", "instruction", "fluency")  # judge_replies' order
HINT = ("<i>Pick a cell; its samples at the factor the selection split chose are listed best "
        "first. Drag the <b>factor</b> slider (or click it and press ← →) to see the cell at "
        "other factors.</i>")  # fmt: skip
PANE = ("border:1px solid #ddd;padding:4px;white-space:pre-wrap;font-family:monospace;"
        "line-height:1.45;overflow-wrap:anywhere")  # fmt: skip
NO_REFERENCE = "none"
# Text at a text's line height, not a widget row's 28 px (as the live panel's PANEL_CSS).
STYLE = "<style>.steerlab-browser .widget-html-content { line-height: 1.45; }</style>"


class SampleBrowser(widgets.VBox):
    """The sample browser: a cell picker, a factor slider, a reference picker and the list.

    Args:
        result: a ``BenchmarkResult``.
        method, concept: the cell shown first; None: the leaderboard's top method and the
            first concept.
        factor: the factor shown first; None: the one the selection split chose.
        limit: samples listed at most (``result.to_pandas()`` has them all).

    Attributes:
        cell: the cell picker (value: ``(method, concept)``).
        factor: the factor slider (value: the factor).
        reference: the picker of the arm shown beside the steered text.
        summary, listing: what the cell and factor show, as HTML widgets.
    """

    def __init__(self, result: Any, *, method: str | None = None, concept: str | None = None,
                 factor: float | None = None, limit: int = 50) -> None:  # fmt: skip
        self.index = SampleIndex(result)
        self.limit = limit
        first = self.index.cells[0]
        if method is not None or concept is not None:
            first = self.index.check_cell(method or first[0], concept or first[1])
        table = {(r["method"], r["concept"]): r for r in result.table}
        options = [(_cell_label(cell, table.get(cell)), cell) for cell in self.index.cells]
        self.cell = widgets.Dropdown(options=options, value=first, description="cell",
                                     layout=widgets.Layout(width="40em"))  # fmt: skip
        self.factor = widgets.SelectionSlider(options=[0.0], description="factor",
                                              continuous_update=False)  # fmt: skip
        self.reference = widgets.Dropdown(options=[NO_REFERENCE], description="beside it",
                                          layout=widgets.Layout(width="32em"))  # fmt: skip
        self.summary = widgets.HTML("")
        self.listing = widgets.HTML("", layout=widgets.Layout(width="100%"))
        for widget, css in ((self.cell, "steerlab-browse-cell"),
                            (self.factor, "steerlab-browse-factor"),
                            (self.reference, "steerlab-browse-reference"),
                            (self.summary, "steerlab-browse-summary"),
                            (self.listing, "steerlab-browse-samples")):  # fmt: skip
            widget.add_class(css)
        self._quiet = False
        self._choose_cell(first, factor)
        self.cell.observe(lambda change: self._choose_cell(change["new"], None), "value")
        self.factor.observe(lambda _: self._render(), "value")
        self.reference.observe(lambda _: self._render(), "value")
        controls = widgets.HBox([self.cell, self.factor, self.reference],
                                layout=widgets.Layout(flex_flow="row wrap"))  # fmt: skip
        css = widgets.HTML(STYLE, layout=widgets.Layout(display="none"))
        super().__init__([widgets.HTML(HINT), controls, self.summary, self.listing, css],
                         layout=widgets.Layout(width="100%", max_width="1400px"))  # fmt: skip
        self.add_class("steerlab-browser")

    def _choose_cell(self, cell: tuple[str, str], factor: float | None) -> None:
        """Point the slider and the reference picker at ``cell``, then render once."""
        factors = self.index.factors(cell)
        if factor is not None and factor not in factors:
            raise SteerError(f"factor={factor!r} is not one of cell {cell}'s factors {factors}.")
        references = self.index.references(cell)
        self._quiet = True  # one render for the whole change, not one per widget
        try:
            self.factor.options = [(f"{f:g}", f) for f in factors]
            self.factor.value = self.index.default_factor(cell) if factor is None else factor
            self.factor.disabled = len(factors) == 1
            self.reference.options = [(r.label, r) for r in references] or [NO_REFERENCE]
            self.reference.value = references[0] if references else NO_REFERENCE
        finally:
            self._quiet = False
        self._render()

    def _render(self) -> None:
        if self._quiet:
            return
        cell, factor = self.cell.value, self.factor.value
        reference = self.reference.value if isinstance(self.reference.value, Reference) else None
        shown = self.index.shown(cell, factor)
        self.summary.value = _summary(cell, factor, shown, self.index, reference, self.limit)
        self.listing.value = "".join(
            _sample_html(rank, sample, cell, reference,
                         self.index.counterpart(reference, sample) if reference else None)
            for rank, sample in enumerate(shown[: self.limit], start=1)
        )  # fmt: skip

    def __repr__(self) -> str:
        method, concept = self.cell.value
        shown = self.index.shown(self.cell.value, self.factor.value)
        return (f"SampleBrowser({len(self.index.cells)} cells; showing {method} · {concept} at "
                f"factor {self.factor.value:g}: {len(shown)} samples)")  # fmt: skip


def _cell_label(cell: tuple[str, str], row: dict[str, Any] | None) -> str:
    method, concept = cell
    if row is None:
        return f"{method} · {concept}"
    score = row.get("score")
    shown = f"{score:.3f}" if isinstance(score, (int, float)) else "–"
    return f"{method} · {concept} — test score {shown} at factor {row['factor']:g}"


def _summary(cell: tuple[str, str], factor: float, shown: list[dict[str, Any]],
             index: SampleIndex, reference: Reference | None, limit: int) -> str:  # fmt: skip
    method, concept = cell
    why = " (chosen on the selection split)" if factor == index.chosen.get(cell) else ""
    scores = [s["score"] for s in shown if isinstance(s.get("score"), (int, float))]
    mean = f"; mean score {sum(scores) / len(scores):.3f}" if scores else ""
    more = f"; the first {limit} listed" if len(shown) > limit else ""
    beside = (f"beside each: {html.escape(reference.label)}." if reference else
              "beside each: nothing, this run has no unsteered or prompting arm for "
              f"{html.escape(concept)}.")  # fmt: skip
    kept = (
        ""
        if any(s.get("judge_replies") for s in shown)
        else (" <span style='color:#888'>The judge's replies were not kept in this run.</span>")
    )
    return (
        f"<b>{html.escape(method)}</b> · {html.escape(concept)} at factor "
        f"<b>{factor:g}</b>{why}: {len(shown)} samples, best first{mean}{more}. "
        f"{beside}{kept}"
    )


def _sample_html(rank: int, sample: dict[str, Any], cell: tuple[str, str],
                 reference: Reference | None, other: dict[str, Any] | None) -> str:  # fmt: skip
    """One sample: its rank and split, the instruction, then a grid of two columns (titles,
    texts, ratings in rows of their own, so both texts start level)."""
    head = (
        f"<b>#{rank}</b> · {html.escape(str(sample.get('split', '')))} split · "
        f"instruction {sample['instruction_index']}"
    )
    instruction = (f"<div class='steerlab-browse-instruction'><b>instruction</b> "
                   f"{html.escape(sample['instruction'])}</div>")  # fmt: skip
    left = (
        f"<b>steered</b> · {html.escape(cell[0])} at factor {sample['factor']:g}",
        _text(sample, "steerlab-browse-steered"),
        _ratings(sample),
    )
    if reference is None:
        right = ("", "<div style='color:#888'>no unsteered or prompting arm in this run</div>", "")
    elif other is None:
        right = (
            _reference_title(reference),
            "<div style='color:#888'>no sample for this instruction</div>",
            "",
        )
    else:
        right = (_reference_title(reference), _text(other, "steerlab-browse-reference-text"),
                 _ratings(other))  # fmt: skip
    cells = "".join(f"<div>{a}</div><div>{b}</div>" for a, b in zip(left, right))
    grid = ("<div style='display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);"
            f"gap:2px 8px;align-items:start;padding-right:4px'>{cells}</div>")  # fmt: skip
    return (
        f"<div class='steerlab-browse-sample' style='border-top:1px solid #ddd;"
        f"padding:6px 0;margin-top:4px'><div>{head}</div>{instruction}{grid}"
        f"{_judge(sample)}</div>"
    )


def _reference_title(reference: Reference) -> str:
    kind, _, rest = reference.label.partition(": ")
    return f"<b>{html.escape(kind)}</b> · {html.escape(rest)}"


def _text(sample: dict[str, Any], css: str) -> str:
    """A text pane; a model input that is more than the instruction shows in grey first."""
    prefix = ""
    if sample.get("model_input", sample["instruction"]) != sample["instruction"]:
        prefix = f"<span style='color:#888'>{html.escape(sample['model_input'])}</span>\n"
    text = sample["text"]
    body = (html.escape(text) if text.strip() else
            "<i style='color:#b00020'>(empty generation)</i>")  # fmt: skip
    return f"<div class='steerlab-pane {css}' style='{PANE}'>{prefix}{body}</div>"


def _ratings(sample: dict[str, Any]) -> str:
    parts = " · ".join(f"{name} {_number(sample.get(key))}" for key, name in RATING_NAMES)
    warn = " · <span style='color:#b00020'>⚠ unreadable rating</span>" if sample.get(
        "parse_failed") else ""  # fmt: skip
    return (
        f"<span style='font-size:90%'>score <b>{_number(sample.get('score'))}</b> "
        f"({parts}){warn}</span>"
    )


def _judge(sample: dict[str, Any]) -> str:
    """The judge's three replies, folded; nothing where the run did not keep them."""
    replies = sample.get("judge_replies")
    if not replies:
        return ""
    items = "".join(f"<div><b>{name}</b>: <span style='white-space:pre-wrap'>"
                    f"{html.escape(str(reply))}</span></div>"
                    for name, reply in zip(JUDGE_CRITERIA, replies))  # fmt: skip
    return (
        f"<details class='steerlab-browse-judge'><summary>the judge's replies</summary>"
        f"{items}</details>"
    )


def _number(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else "–"
