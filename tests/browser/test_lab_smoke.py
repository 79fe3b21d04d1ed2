"""Smoke test of the harness: a widget callback runs in a real JupyterLab when a slider moves."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

WIDGET_CELL = """\
import ipywidgets as widgets

slider = widgets.IntSlider(value=3, min=0, max=10, description="n")
label = widgets.Label(value="value 3")
label.add_class("smoke-label")

def on_change(change):
    label.value = f"value {change['new']}"

slider.observe(on_change, names="value")
widgets.VBox([slider, label])
"""


def _write_notebook(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# smoke"), nbformat.v4.new_code_cell(WIDGET_CELL)]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    path = folder / "smoke.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.mark.browser
def test_slider_moves_and_callback_updates_label(
    tmp_path, jupyter_lab, lab_page, run_all_and_wait, screenshot_dir, console_errors
):
    notebook = _write_notebook(tmp_path)
    lab = jupyter_lab(tmp_path)
    run_all_and_wait(lab_page, lab, notebook.name)

    label = lab_page.locator(".smoke-label")
    label.wait_for()
    assert label.inner_text() == "value 3"
    handle = lab_page.locator(".widget-slider .noUi-handle").first
    handle.focus()
    handle.press("ArrowRight")

    lab_page.wait_for_function(
        "() => document.querySelector('.smoke-label')?.textContent === 'value 4'",
        timeout=10_000,
    )
    assert lab_page.locator(".widget-readout").first.inner_text() == "4"
    shot = screenshot_dir / "slider.png"
    lab_page.locator(".jp-NotebookPanel").screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5_000
    widget_errors = [e for e in console_errors if "widget" in e.lower()]
    assert not widget_errors, widget_errors
