"""The panel's layout in a real JupyterLab at 1024 and 1440 px: the two panes start level,
no title splits "α = 4", the seed box is not clipped, the condition row is one line."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TOY_WEIGHTS = REPO_ROOT / "steerlab" / "toy" / "assets" / "steerlab-tiny" / "model.safetensors"
CELLS = [
    """import steerlab as sl
from steerlab.toy.evidence import CONTRAST_PAIRS
from steerlab.widgets import SteeringPanel

lm = sl.load("steerlab-tiny")
pos, neg = zip(*CONTRAST_PAIRS["sentiment"])
happy = sl.extract(lm, pos, neg, ["blocks.2.hook_resid_pre"], token="mean", progress=False)""",
    """panel = SteeringPanel(lm, {"happy": happy}, alpha=4.0, max_new_tokens=24,
                      prompt="Long ago, a bear called Sam lived near the bay.")
c = panel.controls
c.positions.value = "generated"
c.condition_layer.value = 1
c.threshold.value = 0.034
c.condition.value = "happy"
c.monitor.value = "happy"
panel""",
]
# Boxes of what the checks compare, in page pixels.
MEASURE = r"""() => {
    const panel = document.querySelector('.steerlab-panel');
    const box = e => e.getBoundingClientRect();
    const title = panel.querySelector('.steerlab-steered-title');
    const walker = document.createTreeWalker(title, NodeFilter.SHOW_TEXT);
    let alphaLines = 0;
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        const found = /α = [-0-9.]+/.exec(node.textContent);
        if (found === null) continue;
        const range = document.createRange();
        range.setStart(node, found.index);
        range.setEnd(node, found.index + found[0].length);
        const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
        alphaLines = Math.max(alphaLines, tops.size);
    }
    const seed = [...panel.querySelectorAll('.widget-inline-hbox')].find(
        w => w.querySelector('.widget-label')?.textContent === 'seed');
    const clip = seed.parentElement;  // the column the seed box sits in
    const row = panel.querySelector('.steerlab-condition-row');
    const controls = [...row.children].filter(e => !e.classList.contains('steerlab-fired'));
    return {
        baselineTop: box(panel.querySelector('.steerlab-baseline')).top,
        steeredTop: box(panel.querySelector('.steerlab-steered')).top,
        alphaLines,
        seedRight: box(seed.querySelector('input')).right,
        seedBoxRight: box(seed).right,
        columnRight: box(clip).right,
        rowTops: controls.map(e => Math.round(box(e).top)),
        rowRight: Math.max(...controls.map(e => box(e).right)),
        panelRight: box(panel).right,
    };
}"""


@pytest.mark.browser
def test_the_panel_lays_out_cleanly_at_1024_and_1440_px(
    tmp_path, jupyter_lab, lab_page, run_all_and_wait, screenshot_dir
):
    if not TOY_WEIGHTS.exists():
        pytest.skip("the panel runs on steerlab-tiny, whose weights are not in this checkout")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}  # fmt: skip
    nbformat.write(notebook, tmp_path / "layout.ipynb")
    lab = jupyter_lab(tmp_path)
    page = lab_page
    run_all_and_wait(page, lab, "layout.ipynb", timeout_s=180)
    page.wait_for_selector(".steerlab-monitor-strip .js-plotly-plot", timeout=60_000)
    page.wait_for_function(
        "() => document.querySelector('.steerlab-steered-title')?.textContent.includes('only when')"
    )
    measured = {}
    for width in (1024, 1440):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(1500)
        page.locator(".steerlab-panel").evaluate("e => e.scrollIntoView(true)")
        page.screenshot(path=str(screenshot_dir / f"panel_controls_{width}.png"))
        page.locator(".steerlab-condition-row").evaluate("e => e.scrollIntoView(true)")
        page.screenshot(path=str(screenshot_dir / f"panel_layout_{width}.png"))
        measured[width] = page.evaluate(MEASURE)
    print(measured)
    for width, m in measured.items():
        assert abs(m["baselineTop"] - m["steeredTop"]) <= 1, (width, m)
        assert m["alphaLines"] == 1, (width, m)  # "α = 4" never split over two lines
        assert m["seedRight"] <= m["seedBoxRight"] <= m["columnRight"] + 0.5, (width, m)
        assert len(set(m["rowTops"])) == 1, (width, m)  # the condition row is one line
        assert m["rowRight"] <= m["panelRight"] + 0.5, (width, m)
