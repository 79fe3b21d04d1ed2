"""Run tutorials in a real JupyterLab and screenshot what a reader sees: their tables and
figures, and every text output, checked for a bare ``nan``.

    .venv/bin/python scripts/tutorial_screenshots.py docs/images/browser 01 06 07

Uses ``panel_screenshots.in_browser`` (JupyterLab as ``make lab`` starts it, headless
chromium). For each tutorial: Run All Cells, then one PNG per table and per plotly figure,
``{tutorial}_{n}.png``, at 1024 px wide. It prints every output line that shows ``nan``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from panel_screenshots import REPO, in_browser  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "browser"))
from conftest import run_notebook  # noqa: E402

SHOWN = ".jp-OutputArea-output table, .jp-OutputArea-output.js-plotly-plot"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("numbers", nargs="+", help="tutorial numbers, e.g. 01 06 07")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    notebooks = [next((REPO / "tutorials").glob(f"{n}_*.ipynb")) for n in args.numbers]

    for notebook in notebooks:  # a fresh JupyterLab each: one open notebook at a time

        def shoot(page, lab, out: Path, notebook: Path = notebook) -> None:
            run_notebook(page, lab, notebook.relative_to(REPO), timeout_s=240)
            page.wait_for_timeout(2000)  # plotly draws
            texts = page.locator(".jp-OutputArea-output").all_inner_texts()
            for text in texts:
                for line in text.splitlines():
                    if re.search(r"\bnan\b", line, flags=re.I):
                        print(f"{notebook.stem}: nan shown: {line[:120]}")
            n = 0
            cells = page.locator(".jp-NotebookPanel .jp-Cell")
            for i in range(cells.count()):  # cell by cell: JupyterLab draws only what is near
                cell = cells.nth(i)
                if not cell.is_visible():
                    continue
                cell.scroll_into_view_if_needed()
                page.wait_for_timeout(300)
                for element in cell.locator(SHOWN).all():
                    if not element.is_visible():
                        continue
                    n += 1
                    path = out / f"{notebook.stem}_{n}.png"
                    element.screenshot(path=str(path))
                    print(path)

        in_browser(shoot, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
