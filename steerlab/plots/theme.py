"""A paper theme: readable fonts and a colourblind-safe palette, applied in one call."""

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


def paper_template() -> go.layout.Template:
    """The paper template: white background, 14 pt text, thin grid, Okabe–Ito colours.

    Returns:
        A template to register or to set on a figure's layout.

    >>> paper_template().layout.colorway[0]
    '#0072B2'
    """
    axis = {
        "showline": True,
        "linecolor": "#444444",
        "ticks": "outside",
        "gridcolor": "#E5E5E5",
        "zeroline": False,
        "title": {"font": {"size": 15}},
    }
    return go.layout.Template(
        layout={
            "font": {"family": "Helvetica, Arial, sans-serif", "size": 14, "color": "#222222"},
            "title": {"font": {"size": 17}, "x": 0.02, "xanchor": "left"},
            "colorway": PALETTE,
            "paper_bgcolor": "white",
            "plot_bgcolor": "white",
            "xaxis": axis,
            "yaxis": axis,
            "legend": {"bgcolor": "rgba(255,255,255,0.8)", "font": {"size": 13}},
            "colorscale": {"sequential": "Viridis", "diverging": "RdBu_r"},
            "margin": {"l": 70, "r": 30, "t": 60, "b": 60},
        }
    )


def use_paper_theme() -> None:
    """Register the paper template and make it plotly's default for every later figure.

    >>> use_paper_theme()
    >>> import plotly.io as pio; pio.templates.default
    'steerlab_paper'
    """
    pio.templates[TEMPLATE_NAME] = paper_template()
    pio.templates.default = TEMPLATE_NAME


def apply(fig: go.Figure) -> go.Figure:
    """Set the paper template on one figure, in place, and return it.

    Args:
        fig: Any plotly figure.

    Returns:
        The same figure, for chaining.

    >>> apply(go.Figure()).layout.template.layout.font.size
    14
    """
    fig.update_layout(template=paper_template())
    return fig
