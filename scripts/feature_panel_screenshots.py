"""Screenshots of the panel's SAE feature picker and activation strip in a real JupyterLab.

    .venv/bin/python scripts/feature_panel_screenshots.py docs/images

Starts JupyterLab as ``make lab`` does (``panel_screenshots.in_browser``), runs tutorial 08 in
headless chromium through Playwright, clicks "clamp" in its panel, then the first of
the prompt's top features, waits for the clamped run, and saves the panel with its feature
picker, completions and strip at 1024 and 1440 px wide (768 px tall), as
``feature_panel_{width}.png``. It prints the steered title and the strip's first values.
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

NOTEBOOK = "tutorials/08_sae_features.ipynb"
TITLE = ".steerlab-panel .steerlab-steered-title"
DISABLED = "e => e.disabled === true || e.hasAttribute('disabled')"


def shoot(page, lab, out: Path) -> None:
    run_notebook(page, lab, NOTEBOOK, timeout_s=240)
    page.wait_for_function(
        f"() => document.querySelector('{TITLE}')?.textContent.includes('feature')"
    )
    panel = page.locator(".steerlab-panel")
    panel.scroll_into_view_if_needed()
    panel.locator(".widget-toggle-button", has_text="clamp").click()
    page.wait_for_function(
        f"() => document.querySelector('{TITLE}')?.textContent.includes('clamp feature')",
        timeout=60_000,
    )
    first = panel.locator(".steerlab-top-feature").first
    picked = first.inner_text().strip()
    first.click()
    page.wait_for_function(
        f"() => document.querySelector('{TITLE}')?.textContent.includes('clamp feature {picked} ')",
        timeout=60_000,
    )
    page.wait_for_timeout(2000)  # plotly draws the strip and the figure
    print("steered title:", page.locator(TITLE).inner_text())
    site_controls = panel.locator(".widget-slider, .widget-dropdown").filter(
        has=page.locator(".widget-label", has_text=re.compile(r"^(layer|hook point)$"))
    )
    print("in clamp mode, layer and hook point disabled:",
          [c.locator("select, .noUi-target").first.evaluate(DISABLED) for c in site_controls.all()])  # fmt: skip
    print("strip drawn:", panel.locator(".steerlab-feature-strip .js-plotly-plot").count() == 1)
    for width in (1024, 1440):
        page.set_viewport_size({"width": width, "height": 768})
        page.wait_for_timeout(1500)
        # the picker at the top of the screen: the completions and the strip under it
        panel.locator(".steerlab-feature-picker").evaluate("e => e.scrollIntoView(true)")
        page.mouse.move(1, 1)  # off the strip, whose plotly toolbar shows on hover
        page.wait_for_timeout(500)
        page.screenshot(path=str(out / f"feature_panel_{width}.png"))
        print(out / f"feature_panel_{width}.png")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", default=REPO / "docs" / "images")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    in_browser(shoot, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
