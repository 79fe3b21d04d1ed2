"""An in-notebook export control: format dropdown, button, status label."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go

from steerlab.exporting import FORMATS, export


def export_button(
    fig: go.Figure,
    path_stem: str | Path | Callable[[], str | Path],
    *,
    default_format: str = "pdf",
) -> widgets.HBox:
    """A row with a format dropdown, an Export button and a status label for one figure.

    Clicking writes ``{path_stem}.{format}`` with :func:`steerlab.exporting.export` and reports
    the path written, or the error (for example, no browser for PDF), in the label.

    Args:
        fig: The figure to export; a ``FigureWidget`` exports its current state.
        path_stem: Path without suffix, e.g. ``"figures/norms"``, or a function called at
            each click that returns one (the live panel names each export afresh).
        default_format: Format selected at first, one of pdf, svg, png, html.

    Returns:
        An ``HBox`` of (``Dropdown``, ``Button``, ``Label``).

    >>> box = export_button(go.Figure(), "/tmp/fig", default_format="html")
    >>> [type(w).__name__ for w in box.children]
    ['Dropdown', 'Button', 'Label']
    """
    if default_format not in FORMATS:
        raise ValueError(f"default_format must be one of {FORMATS}, not {default_format!r}")
    dropdown = widgets.Dropdown(
        options=list(FORMATS), value=default_format, layout=widgets.Layout(width="6em")
    )
    tooltip = "a new file per export" if callable(path_stem) else f"{path_stem}.*"
    button = widgets.Button(description="Export", icon="download", tooltip=tooltip)
    status = widgets.Label(value="")

    def on_click(_: widgets.Button) -> None:
        stem = path_stem() if callable(path_stem) else path_stem
        path = Path(f"{stem}.{dropdown.value}")
        status.value = f"writing {path} …"
        start = time.perf_counter()
        try:
            export(fig, path)
        except (RuntimeError, OSError, ValueError) as error:
            status.value = f"failed: {error}"
            return
        status.value = f"saved {path} ({time.perf_counter() - start:.1f} s)"

    button.on_click(on_click)
    return widgets.HBox([dropdown, button, status])
