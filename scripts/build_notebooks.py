"""Execute notebooks in place and keep their outputs, so nbval has references to compare.

    .venv/bin/python scripts/build_notebooks.py                 # tutorials/ and notebooks/
    .venv/bin/python scripts/build_notebooks.py tutorials/01_first_steering.ipynb

Each notebook runs in a fresh kernel with its own folder as the working directory, offline
(``HF_HUB_OFFLINE=1``, as under ``make test``). Afterwards ``metadata.widgets`` is deleted:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, default=DEFAULT)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    parser.add_argument(
        "--allow-errors", action="store_true", help="keep going past a failing cell (drafts only)"
    )
    args = parser.parse_args(argv)
    for name, value in KERNEL_ENV.items():
        os.environ.setdefault(name, value)  # kernels inherit this environment
    for path in args.notebooks:
        seconds = build(path.resolve(), args.timeout, args.allow_errors)
        size = path.stat().st_size / 1024
        print(f"{path}: {seconds:.1f} s, {size:.0f} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
