"""Screenshots of the panel's "steer only when" row and monitor strip in a real JupyterLab.

    .venv/bin/python scripts/condition_panel_screenshots.py docs/images

Writes a short notebook beside this script (removed afterwards): the toy model, a happy
vector, the sea condition that ``sl.find_condition`` finds, and a panel on a sea story that
steers happy only when the prompt reads as the sea, with the happy monitor on. Runs it in
headless chromium through Playwright (``panel_screenshots.in_browser``) and saves the panel
at 1024 and 1440 px wide (768 px tall) as ``condition_panel_{width}.png``. Prints the fired
label and whether the monitor strip was drawn.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from panel_screenshots import REPO, in_browser  # noqa: E402

sys.path.insert(0, str(REPO / "tests" / "browser"))
from conftest import run_notebook  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parent / "_condition_panel_shot.ipynb"
CELLS = [
    f"import sys\nsys.path.insert(0, {str(REPO)!r})  # this checkout's steerlab",
    """import steerlab as sl
from steerlab.toy.evidence import CONTRAST_PAIRS
from steerlab.widgets import SteeringPanel

lm = sl.load("steerlab-tiny")
sea = [f"One day, {n} the fox went to the {p}." for n in ("Mia", "Tom", "Ben")
       for p in ("sea", "beach", "shore", "harbor")]
forest = [f"One day, {n} the fox went to the {p}." for n in ("Mia", "Tom", "Ben")
          for p in ("forest", "woods", "grove", "trail")]
found = sl.find_condition(lm, matching=sea, other=forest,
                          sites=["blocks.1.hook_resid_post"], progress=False)
pos, neg = zip(*CONTRAST_PAIRS["sentiment"])
happy = sl.extract(lm, pos, neg, ["blocks.2.hook_resid_pre"], token="mean", progress=False)""",
    """panel = SteeringPanel(lm, {"happy": happy, "sea": found.condition.direction},
                      prompt="Long ago, a bear called Sam lived near the bay.",
                      alpha=4.0, max_new_tokens=24)
c = panel.controls
c.positions.value = "generated"
c.condition_layer.value = 1
c.threshold.value = round(found.condition.threshold, 3)
c.compare.value = found.condition.compare
c.condition.value = "sea"
c.monitor.value = "happy"
panel""",
]


def shoot(page, lab, out: Path) -> None:
    run_notebook(page, lab, NOTEBOOK.relative_to(REPO), timeout_s=240)
    panel = page.locator(".steerlab-panel")
    page.wait_for_selector(".steerlab-monitor-strip .js-plotly-plot", timeout=60_000)
    page.wait_for_timeout(2000)  # plotly draws the strip and the figure
    print("fired label:", panel.locator(".steerlab-fired").inner_text())
    print("monitor strip drawn:", panel.locator(".steerlab-monitor-strip .js-plotly-plot").count())
    for width in (1024, 1440):
        page.set_viewport_size({"width": width, "height": 768})
        page.wait_for_timeout(1500)
        panel.locator(".steerlab-condition-row").evaluate("e => e.scrollIntoView(true)")
        page.wait_for_timeout(500)
        page.screenshot(path=str(out / f"condition_panel_{width}.png"))
        print(out / f"condition_panel_{width}.png")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", default=REPO / "docs" / "images")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}  # fmt: skip
    nbformat.write(notebook, NOTEBOOK)
    try:
        in_browser(shoot, args.out)
    finally:
        NOTEBOOK.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
