"""A paper theme: readable fonts and a colourblind-safe palette, applied in one call.

Two families of sizes: on screen (14 px text, the default), and printed at a paper width,
where text is set in points so that it reads like the paper's own captions (8-9 pt).
"""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

TEMPLATE_NAME = "steerlab_paper"

# Okabe & Ito, "Color Universal Design" (2008), https://jfly.uni-koeln.de/color/ ;
# black is left out of the cycle so that it stays free for annotations.
OKABE_ITO: list[str] = [
    "#E69F00",  # orange
    "#56B4E9",  # sky blue
    "#009E73",  # bluish green
    "#F0E442",  # yellow
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#CC79A7",  # reddish purple
    "#000000",  # black
]
PALETTE: list[str] = [OKABE_ITO[i] for i in (4, 5, 2, 0, 6, 1, 3)]  # strongest contrasts first

# Printed widths in inches: one column of a two-column paper (ICML, NeurIPS workshop,
# ACL: 3.25-3.4 in) and the full text width (6.75-7 in).
PAPER_WIDTHS_IN: dict[str, float] = {"column": 3.4, "page": 7.0}
CSS_PX_PER_IN = 96  # plotly lays out in CSS pixels; a PDF page is 0.75 pt per pixel
PAPER_FONT_PT = 8.0  # tick labels, legends, cell text
PAPER_TITLE_PT = 9.0
SCREEN_FONT_PX = 14


def paper_size(width: str, aspect: float = 0.7) -> tuple[int, int]:
    """Layout size in CSS pixels for a named paper width: ``(width, round(width * aspect))``.

    Exported as PDF at scale 1 this is the printed size, so the figure goes into LaTeX with
    ``\\includegraphics`` and no rescaling, and its text stays at the theme's point sizes.

    >>> paper_size("column")
    (326, 228)
    """
    if width not in PAPER_WIDTHS_IN:
        raise ValueError(f"paper width must be one of {sorted(PAPER_WIDTHS_IN)}, not {width!r}")
    px = round(PAPER_WIDTHS_IN[width] * CSS_PX_PER_IN)
    return px, round(px * aspect)


def paper_template(
    font_size: float = SCREEN_FONT_PX, title_size: float | None = None
) -> go.layout.Template:
    """The paper template: white background, thin grid, Okabe–Ito colours.

    Args:
        font_size: Base text size in CSS pixels (ticks, legend); titles are a little larger
            and margins scale with it. 14 suits a screen; ``print_font_size()`` suits a page.
        title_size: The figure title's size in CSS pixels; ``17/14 * font_size`` if ``None``.

    Returns:
        A template to register or to set on a figure's layout.

    >>> paper_template().layout.colorway[0]
    '#0072B2'
    """
    k = font_size / SCREEN_FONT_PX
    title_size = round(17 * k, 1) if title_size is None else title_size
    label_size = max(font_size, round(15 * k, 1))  # axis titles, subplot titles
    axis = {
        "showline": True,
        "linecolor": "#444444",
        "ticks": "outside",
        "ticklen": round(5 * k),
        "gridcolor": "#E5E5E5",
        "zeroline": False,
        "automargin": True,
        "title": {"font": {"size": label_size}, "standoff": round(8 * k)},
    }
    return go.layout.Template(
        layout={
            "font": {
                "family": "Helvetica, Arial, sans-serif",
                "size": font_size,
                "color": "#222222",
            },
            "title": {"font": {"size": title_size}, "x": 0.02, "xanchor": "left"},
            "colorway": PALETTE,
            "paper_bgcolor": "white",
            "plot_bgcolor": "white",
            "xaxis": axis,
            "yaxis": axis,
            "legend": {
                "bgcolor": "rgba(255,255,255,0.8)",
                "font": {"size": max(font_size, round(13 * k, 1))},
            },
            "colorscale": {"sequential": "Viridis", "diverging": "RdBu_r"},
            "margin": {
                "l": round(70 * k),
                "r": round(30 * k),
                "t": round(60 * k),
                "b": round(60 * k),
            },
            "annotationdefaults": {"font": {"size": label_size}},
        }
    )


def print_font_size(points: float = PAPER_FONT_PT) -> float:
    """The font size in CSS pixels that prints at ``points`` (a PDF has 0.75 pt per pixel).

    >>> round(print_font_size() * 0.75, 1)
    8.0
    """
    return points / 0.75


def use_paper_theme() -> None:
    """Register the paper template and make it plotly's default for every later figure.

    >>> use_paper_theme()
    >>> import plotly.io as pio; pio.templates.default
    'steerlab_paper'
    """
    pio.templates[TEMPLATE_NAME] = paper_template()
    pio.templates.default = TEMPLATE_NAME


def apply(
    fig: go.Figure, font_size: float = SCREEN_FONT_PX, title_size: float | None = None
) -> go.Figure:
    """Set the paper template on one figure, in place, and return it.

    Args:
        fig: Any plotly figure.
        font_size: Base text size in CSS pixels, as for ``paper_template``.
        title_size: Title size in CSS pixels, as for ``paper_template``.

    Returns:
        The same figure, for chaining.

    >>> apply(go.Figure()).layout.template.layout.font.size
    14
    """
    fig.update_layout(template=paper_template(font_size, title_size))
    return fig
