"""The live panel in a real JupyterLab: moving the alpha slider restreams only the steered pane."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO_ROOT / "tutorials" / "04_live_panel.ipynb"
TOY_WEIGHTS = REPO_ROOT / "steerlab" / "toy" / "assets" / "steerlab-tiny" / "model.safetensors"
PRESSES = 16  # alpha step 0.5 in the tutorial: 0 -> 8


@pytest.mark.browser
def test_alpha_slider_changes_steered_pane_only(
    tmp_path, jupyter_lab, lab_page, run_all_and_wait, screenshot_dir, console_errors
):
    if not TOY_WEIGHTS.exists():
        pytest.skip("the tutorial runs on steerlab-tiny, whose weights are not in this checkout")
    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)  # Lab writes checkpoints next to it
    lab = jupyter_lab(tmp_path)
    run_all_and_wait(lab_page, lab, NOTEBOOK.name, timeout_s=120)

    page = lab_page
    steered, baseline = page.locator(".steerlab-steered"), page.locator(".steerlab-baseline")
    steered.wait_for()
    # The last cell put alpha back to 0: both panes show the same completion.
    page.wait_for_function(
        "() => document.querySelector('.steerlab-steered-title')?.textContent.includes('α = 0')"
    )
    before_steered, before_baseline = steered.inner_text(), baseline.inner_text()
    assert before_steered == before_baseline and len(before_steered) > 20

    alpha = page.locator(".steerlab-panel .widget-hslider").filter(
        has=page.locator(".widget-label", has_text=re.compile(r"^alpha$"))
    )
    handle = alpha.locator(".noUi-handle")
    handle.focus()
    for _ in range(PRESSES):
        handle.press("ArrowRight")
    assert alpha.locator(".widget-readout").inner_text() == "8.0"
    # Rendered once the steered title names the new alpha (the debounced run has finished).
    page.wait_for_function(
        "() => document.querySelector('.steerlab-steered-title')?.textContent.includes('α = 8')",
        timeout=30_000,
    )
    after_steered, after_baseline = steered.inner_text(), baseline.inner_text()
    assert after_baseline == before_baseline
    assert after_steered != before_steered
    assert page.locator(".steerlab-error").inner_text() == ""
    assert "hooks on model: 0" in page.locator(".steerlab-hooks").inner_text()
    assert page.locator(".steerlab-panel .js-plotly-plot").count() == 1

    shot = screenshot_dir / "live_panel.png"
    page.locator(".steerlab-panel").screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    widget_errors = [e for e in console_errors if "widget" in e.lower()]
    assert not widget_errors, widget_errors
