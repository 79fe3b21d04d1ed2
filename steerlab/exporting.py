"""Write a plotly figure to PDF, SVG, PNG or HTML, chosen by the file suffix; or from a button.

Static formats go through kaleido 1.x, which drives a Chrome or Chromium installed on the
machine. A browser is looked for the way kaleido's own finder does (``BROWSER_PATH``, then
``chromium`` and friends on ``PATH``) *before* kaleido starts, so that a missing browser is
a clear error rather than a hang. One kaleido server is started per process and reused:
an export then takes a fraction of a second instead of a browser start each time.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ipywidgets as widgets
    import plotly.graph_objects as go

STATIC_FORMATS = ("pdf", "svg", "png")
FORMATS = (*STATIC_FORMATS, "html")
THEMES = ("paper", None)
PAPER_WIDTHS = ("column", "page")  # sizes in steerlab.plots.theme.PAPER_WIDTHS_IN
DEFAULT_SIZE = (700, 500)  # plotly's layout size when a figure sets none
PRINT_DPI = 300  # PNG resolution at a named paper width
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")

_server_lock = threading.Lock()
_server_started = False


def find_browser() -> str | None:
    """The Chrome/Chromium kaleido would use: ``BROWSER_PATH`` if set, else one on ``PATH``.

    Returns:
        An executable path, or ``None`` when there is none (or ``BROWSER_PATH`` names none).

    >>> find_browser() is None or os.access(find_browser(), os.X_OK)
    True
    """
    override = os.environ.get("BROWSER_PATH")
    if override is not None:
        return override if os.path.isfile(override) and os.access(override, os.X_OK) else None
    for name in BROWSER_NAMES:
        if path := shutil.which(name):
            return path
    return None


def export(
    fig: go.Figure,
    path: str | os.PathLike[str],
    *,
    width: int | str | None = None,
    height: int | None = None,
    scale: float | None = None,
    theme: str | None = "paper",
) -> Path:
    """Write ``fig`` to ``path`` in the format its suffix names: .pdf, .svg, .png or .html.

    By default the figure is drawn in the paper theme (white background, Okabe–Ito colours)
    on a copy; ``fig`` itself is not changed. A named ``width`` sets the printed size: the PDF
    page is then 3.4 in (``"column"``) or 7 in (``"page"``) wide, with 8-9 pt text, so it goes
    into LaTeX with ``\\includegraphics`` at its natural size.

    Args:
        fig: The figure (a ``FigureWidget`` exports its current state).
        path: Where to write; parent folders are created.
        width: ``"column"`` or ``"page"``; or the layout width in CSS pixels; the figure's
            own, else plotly's 700, when ``None``.
        height: Layout height in CSS pixels. With a named width it defaults to the figure's
            own aspect ratio; otherwise to the figure's own height, else plotly's 500.
        scale: Pixel multiplier for PNG (a 700 px wide figure at scale 2 is 1400 px wide);
            2 by default, and 300 dpi with a named width. PDF and SVG are always drawn at
            scale 1, so that their page size is the layout size (0.75 pt per CSS pixel).
        theme: ``"paper"`` (the default) or ``None`` to keep the figure's own template.

    Returns:
        The path written.

    Raises:
        ValueError: For a suffix outside .pdf/.svg/.png/.html, an unknown width name or
            theme, before anything is done.
        RuntimeError: For a static format when no Chrome/Chromium can be found.

    >>> import plotly.graph_objects as go
    >>> export(go.Figure(), "/tmp/empty.html").suffix
    '.html'
    """
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ValueError(
            f"cannot export to {path.name!r}: the suffix must be one of "
            + ", ".join(f".{f}" for f in FORMATS)
        )
    if theme not in THEMES:
        raise ValueError(f"theme must be one of {THEMES}, not {theme!r}")
    if isinstance(width, str) and width not in PAPER_WIDTHS:
        raise ValueError(
            f"width must be a number of pixels or one of {PAPER_WIDTHS}, not {width!r}"
        )
    fig, width, height, scale = _prepared(fig, width, height, scale, theme)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "html":
        # plotly.js inlined, so that the file opens offline; width/height fix the layout size.
        fig.write_html(
            path,
            include_plotlyjs=True,
            default_width=width or "100%",
            default_height=height or "100%",
        )
        return path
    _start_kaleido()
    with warnings.catch_warnings():
        # plotly passes per-call browser options that the shared server rightly ignores.
        warnings.filterwarnings("ignore", message="The kopts argument is ignored")
        fig.write_image(
            path, format=fmt, scale=scale if fmt == "png" else 1, width=width, height=height
        )
    return path


def export_button(
    fig: go.Figure,
    path_stem: str | Path | Callable[[], str | Path],
    *,
    default_format: str = "pdf",
) -> widgets.HBox:
    """A row with a format dropdown, an Export button and a status label for one figure.

    Clicking writes ``{path_stem}.{format}`` with :func:`export` and reports the path
    written, or the error (for example, no browser for PDF), in the label.

    Args:
        fig: The figure to export; a ``FigureWidget`` exports its current state.
        path_stem: Path without suffix, e.g. ``"figures/norms"``, or a function called at
            each click that returns one (the live panel names each export afresh).
        default_format: Format selected at first, one of pdf, svg, png, html.

    Returns:
        An ``HBox`` of (``Dropdown``, ``Button``, ``Label``).

    Raises:
        ValueError: For a ``default_format`` outside pdf, svg, png and html.

    >>> import plotly.graph_objects as go
    >>> box = export_button(go.Figure(), "/tmp/fig", default_format="html")
    >>> [type(w).__name__ for w in box.children]
    ['Dropdown', 'Button', 'Label']
    """
    if default_format not in FORMATS:
        raise ValueError(f"default_format must be one of {FORMATS}, not {default_format!r}")
    import ipywidgets as widgets

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


def _prepared(
    fig: go.Figure,
    width: int | str | None,
    height: int | None,
    scale: float | None,
    theme: str | None,
) -> tuple[go.Figure, int | None, int | None, float]:
    """A themed copy of ``fig`` and the pixel width, height and PNG scale to draw it at."""
    import plotly.graph_objects as go

    from steerlab.plots import theme as themes

    copy = go.Figure(fig)  # a FigureWidget becomes a plain figure; the caller's is untouched
    if not isinstance(width, str):
        if theme == "paper":
            themes.apply(copy)
        return copy, width, height, 2 if scale is None else scale
    own_width = copy.layout.width or DEFAULT_SIZE[0]
    own_height = copy.layout.height or DEFAULT_SIZE[1]
    px_width, _ = themes.paper_size(width)
    if height is None:
        height = round(px_width * own_height / own_width)
    if theme == "paper":
        themes.apply(copy, themes.print_font_size(), themes.print_font_size(themes.PAPER_TITLE_PT))
        # Text sizes set on the figure itself (make_subplots titles its subplots at 16 px)
        # would print at 12 pt: printed text follows the theme instead.
        copy.update_annotations(font_size=None)
        copy.update_layout(title_font_size=None)
    return copy, px_width, height, PRINT_DPI / 96 if scale is None else scale


def _start_kaleido() -> None:
    """Check for a browser, then start kaleido's shared server once per process."""
    global _server_started
    browser = find_browser()
    if browser is None:
        raise RuntimeError(_no_browser_message())
    with _server_lock:
        if _server_started:
            return
        import kaleido

        # mathjax=False: no MathJax fetch from a CDN (the machine may be offline), faster start.
        kaleido.start_sync_server(mathjax=False, silence_warnings=True)
        _server_started = True


def _no_browser_message() -> str:
    where = os.environ.get("BROWSER_PATH")
    found = (
        f"BROWSER_PATH={where!r} is not an executable file"
        if where is not None
        else f"none of {', '.join(BROWSER_NAMES)} is on PATH"
    )
    return (
        "PDF/SVG/PNG export needs Chrome or Chromium (kaleido drives it), and "
        f"{found}. Fix: on Debian/Ubuntu run `apt-get install -y chromium` as root "
        "(or `scripts/install_browser.sh`), or set BROWSER_PATH to a Chrome/Chromium executable. "
        "Export to .html works without a browser."
    )
