"""``result.browse()`` in a real JupyterLab: pick a cell, move the factor slider, and the
listed texts are the run's samples at that factor, best first, each beside the same
instruction's unsteered text.

The notebook runs a small toy benchmark (mean difference at factors 0, 1, 2 and 4 beside
the prompting arm) and writes its samples to ``samples.json``; the expected page is computed
here from that file. Screenshots: ``test-output/browser/<test>/``; ``docs/images/browse_*.png``
are copies of them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TOY_WEIGHTS = REPO_ROOT / "steerlab" / "toy" / "assets" / "steerlab-tiny" / "model.safetensors"
RUN_CELL = """\
import json

import steerlab as sl
from steerlab.evals.methods import BUILT_IN
from steerlab.toy import ToyJudge, concept_data

lm = sl.load("steerlab-tiny")
full = concept_data("sentiment", lm=lm)
data = sl.evals.ConceptData(full.name, positives=full.positives[:12],
                            negatives=full.negatives[:12], instructions=full.instructions[:6])
mean_diff = BUILT_IN["mean_diff"]
methods = [sl.evals.Method("mean_diff", make=mean_diff.make, factors=[0, 1, 2, 4],
                           needs=mean_diff.needs),
           sl.evals.Prompting(prompt="Tell me a happy story.")]
result = sl.evals.benchmark(lm, [data], methods, site="blocks.2.hook_resid_pre",
                            judge=ToyJudge(lm), max_new_tokens=24, n_boot=50, progress=False)
with open("samples.json", "w") as f:
    json.dump(result.samples, f)
"""
BROWSE_CELL = "browser = result.browse()\nbrowser"
SUMMARY = ".steerlab-browse-summary"


def _write_notebook(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(RUN_CELL), nbformat.v4.new_code_cell(BROWSE_CELL)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}  # fmt: skip
    path = folder / "browse.ipynb"
    nbformat.write(nb, path)
    return path


def _expected(samples: list[dict], method: str, factor: float) -> list[dict]:
    rows = [s for s in samples if s["method"] == method and s["factor"] == factor]
    return sorted(rows, key=lambda s: (-s["score"], s["instruction_index"]))


def _squash(text: str) -> str:
    return " ".join(text.split())


def _shown(page) -> list[tuple[str, str, str]]:
    """(instruction, steered text, text beside it) of each listed sample, as the page shows."""
    out = []
    for block in page.locator(".steerlab-browse-sample").all():
        instruction = block.locator(".steerlab-browse-instruction").inner_text()
        steered = block.locator(".steerlab-browse-steered").inner_text()
        beside = block.locator(".steerlab-browse-reference-text").inner_text()
        out.append((_squash(instruction.removeprefix("instruction")), _squash(steered),
                    _squash(beside)))  # fmt: skip
    return out


@pytest.mark.browser
def test_pick_a_cell_and_move_the_factor_slider(
    tmp_path, jupyter_lab, lab_page, run_all_and_wait, screenshot_dir, console_errors
):
    if not TOY_WEIGHTS.exists():
        pytest.skip("the notebook runs on steerlab-tiny, whose weights are not in this checkout")
    notebook = _write_notebook(tmp_path)
    lab = jupyter_lab(tmp_path)
    run_all_and_wait(lab_page, lab, notebook.name, timeout_s=240)
    samples = json.loads((tmp_path / "samples.json").read_text())
    unsteered = {s["instruction_index"]: s["text"] for s in samples
                 if s["method"] == "mean_diff" and s["factor"] == 0}  # fmt: skip
    page = lab_page
    page.locator(".steerlab-browser").wait_for()

    # pick the mean difference's cell
    select = page.locator(".steerlab-browse-cell select")
    labels = [
        label.replace("\xa0", " ")  # ipywidgets shows spaces as no-break spaces
        for label in select.evaluate("s => [...s.options].map(o => o.textContent)")
    ]
    target = next(label for label in labels if label.startswith("mean_diff · happiness"))
    select.select_option(index=labels.index(target))
    page.wait_for_function(f"() => document.querySelector('{SUMMARY}')"
                           "?.textContent.startsWith('mean_diff')")  # fmt: skip
    readout = page.locator(".steerlab-browse-factor .widget-readout")
    first = float(readout.inner_text())
    chosen = float(re.search(r"at factor ([\d.]+)", target)[1])
    assert first == chosen  # the factor the selection split chose
    beside_label = (
        page.locator(".steerlab-browse-reference select")
        .evaluate("s => s.options[s.selectedIndex].textContent")
        .replace("\xa0", " ")
    )
    assert beside_label == "unsteered: mean_diff at factor 0"

    def check(factor: float) -> list[tuple[str, str, str]]:
        shown = _shown(page)
        expected = _expected(samples, "mean_diff", factor)
        assert [s[1] for s in shown] == [_squash(s["text"]) for s in expected]
        assert [s[0] for s in shown] == [_squash(s["instruction"]) for s in expected]
        assert [s[2] for s in shown] == [_squash(unsteered[s["instruction_index"]])
                                         for s in expected]  # fmt: skip
        return shown

    before = check(first)
    page.locator(".steerlab-browser").screenshot(path=str(screenshot_dir / "browse_cell.png"))

    # move the factor slider one step, with the keyboard
    factors = [0.0, 1.0, 2.0, 4.0]
    after_factor = factors[factors.index(first) + 1] if first != 4.0 else 2.0
    handle = page.locator(".steerlab-browse-factor .noUi-handle")
    handle.focus()
    handle.press("ArrowRight" if after_factor > first else "ArrowLeft")
    page.wait_for_function(f"() => document.querySelector('{SUMMARY}')"
                           f"?.textContent.includes('at factor {after_factor:g}:')")  # fmt: skip
    assert float(readout.inner_text()) == after_factor
    after = check(after_factor)
    assert [s[1] for s in after] != [s[1] for s in before]  # other texts at the other factor
    assert sorted(s[2] for s in after) == sorted(s[2] for s in before)  # the same unsteered
    page.locator(".steerlab-browser").screenshot(path=str(screenshot_dir / "browse_factor.png"))

    # the prompting arm beside it instead: its prompt in grey, then its text
    reference = page.locator(".steerlab-browse-reference select")
    options = [
        o.replace("\xa0", " ")
        for o in reference.evaluate("s => [...s.options].map(o => o.textContent)")
    ]
    reference.select_option(index=options.index("prompting: prompt, the concept in its prompt"))
    page.wait_for_function(f"() => document.querySelector('{SUMMARY}')"
                           "?.textContent.includes('beside each: prompting')")  # fmt: skip
    prompted = {s["instruction_index"]: s["text"] for s in samples if s["method"] == "prompt"}
    beside = [s[2] for s in _shown(page)]
    expected = _expected(samples, "mean_diff", after_factor)
    assert all(b.startswith("Tell me a happy story.") for b in beside)
    assert all(b.endswith(_squash(prompted[s["instruction_index"]])) for b, s in
               zip(beside, expected))  # fmt: skip
    widget_errors = [e for e in console_errors if "widget" in e.lower()]
    assert not widget_errors, widget_errors
