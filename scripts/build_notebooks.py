"""Execute notebooks in place and keep their outputs, so nbval has references to compare.

    .venv/bin/python scripts/build_notebooks.py                 # tutorials/ and notebooks/
    .venv/bin/python scripts/build_notebooks.py tutorials/01_first_steering.ipynb
    .venv/bin/python scripts/build_notebooks.py --figures docs/images   # and export every figure

Each notebook runs in a fresh kernel with its own folder as the working directory, offline
(``HF_HUB_OFFLINE=1``, as under ``make test``). Every plotly figure is stored twice: as plotly
JSON (interactive in JupyterLab) and as a PNG (what GitHub and nbviewer show, since they run no
JavaScript); nbval never compares images. This needs a Chromium (``scripts/install_browser.sh``).
Afterwards ``metadata.widgets`` is deleted:
nbclient stores the state of every widget there, plotly.js included (about 5 MB a notebook),
and nothing reads it back. Cell timing metadata is not recorded, so a rebuild of an unchanged
notebook changes only what really changed (widget ids, plotly uids).
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

PLOTLY_JSON = "application/vnd.plotly.v1+json"
# Interactive JSON plus a static PNG fallback in one output (plotly reads PLOTLY_RENDERER).
BUILD_ENV = {"PLOTLY_RENDERER": "plotly_mimetype+png"}
COLUMN_CELLS = 12  # a heatmap wider than this is exported at page width
COLUMN_BARS = 6  # and a bar chart with more horizontal bars than this

REPO = Path(__file__).resolve().parents[1]
DEFAULT = sorted([*REPO.glob("tutorials/*.ipynb"), *REPO.glob("notebooks/*.ipynb")])
# The same kernel environment as under pytest, or stored and fresh outputs would differ.
KERNEL_ENV = runpy.run_path(str(REPO / "tutorials" / "conftest.py"))["KERNEL_ENV"]


def build(path: Path, timeout: int, allow_errors: bool = False) -> float:
    """Run every cell of ``path`` and write it back with outputs; returns seconds taken."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
        allow_errors=allow_errors,
    )
    start = time.perf_counter()
    client.execute()
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def export_figures(path: Path, folder: Path) -> list[Path]:
    """Export every plotly figure stored in ``path`` as a print-size PNG in ``folder``.

    Files are named ``{notebook}_fig{k}.png`` in order. A figure with subplots, wider than
    it is tall by more than 2:1, a heatmap over more than 12 columns or more than 6 horizontal
    bars gets the page width (7 in); the rest one column (3.4 in).
    """
    sys.path.insert(0, str(REPO))
    import plotly.graph_objects as go

    from steerlab.exporting import export

    nb = nbformat.read(path, as_version=4)
    written = []
    figures = [
        output.data[PLOTLY_JSON]
        for cell in nb.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if PLOTLY_JSON in output.get("data", {})
    ]
    for k, spec in enumerate(figures, start=1):
        fig = go.Figure(spec)
        axes = [key for key in fig.layout.to_plotly_json() if key.startswith("xaxis")]
        wide = (fig.layout.height or 500) * 2 < (fig.layout.width or 700)
        cells = max((len(row) for t in fig.data if t.type == "heatmap" for row in t.z), default=0)
        # horizontal bars, one per method: at column width only every other label fits
        bars = max((len(t.y) for t in fig.data if t.type == "bar" and t.orientation == "h"),
                   default=0)  # fmt: skip
        page = len(axes) > 1 or wide or cells > COLUMN_CELLS or bars > COLUMN_BARS
        width = "page" if page else "column"
        written.append(export(fig, folder / f"{path.stem}_fig{k}.png", width=width))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, default=DEFAULT)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    parser.add_argument(
        "--allow-errors", action="store_true", help="keep going past a failing cell (drafts only)"
    )
    parser.add_argument(
        "--figures", type=Path, help="also export every figure as a print-size PNG into this folder"
    )
    parser.add_argument(
        "--figures-only", action="store_true", help="export the stored figures without rebuilding"
    )
    args = parser.parse_args(argv)
    for name, value in {**KERNEL_ENV, **BUILD_ENV}.items():
        os.environ.setdefault(name, value)  # kernels inherit this environment
    for path in args.notebooks:
        if not args.figures_only:
            seconds = build(path.resolve(), args.timeout, args.allow_errors)
            size = path.stat().st_size / 1024
            print(f"{path}: {seconds:.1f} s, {size:.0f} KiB")
        if args.figures is not None:
            for written in export_figures(path.resolve(), args.figures):
                print(f"  {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
