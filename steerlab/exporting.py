"""Write a plotly figure to PDF, SVG, PNG or HTML, chosen by the file suffix.

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
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import plotly.graph_objects as go

STATIC_FORMATS = ("pdf", "svg", "png")
FORMATS = (*STATIC_FORMATS, "html")
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
    scale: float = 2,
    width: int | None = None,
    height: int | None = None,
) -> Path:
    """Write ``fig`` to ``path`` in the format its suffix names: .pdf, .svg, .png or .html.

    Args:
        fig: The figure.
        path: Where to write; parent folders are created.
        scale: Pixel multiplier for PNG (a 700 px wide figure at scale 2 is 1400 px wide).
        width: Layout width in CSS pixels; the figure's own, else plotly's 700, when ``None``.
        height: Layout height in CSS pixels; the figure's own, else plotly's 500, when ``None``.

    Returns:
        The path written.

    Raises:
        ValueError: For a suffix outside .pdf/.svg/.png/.html, before anything is done.
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
        fig.write_image(path, format=fmt, scale=scale, width=width, height=height)
    return path


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
