"""The first hour: tab completion, quiet progress, and README claims that hold when run."""

from __future__ import annotations

import re
import rlcompleter
import time
from pathlib import Path

import pytest

import steerlab as sl
from steerlab.core import bars as progress

README = Path(__file__).parents[1] / "README.md"


# --- tab completion ---------------------------------------------------------------------------


def test_dir_lists_the_public_names_lazy_ones_included():
    names = dir(sl)
    assert set(sl.__all__) <= set(names)
    assert {"export", "plots", "SteeringPanel", "use_paper_theme", "__version__"} <= set(names)
    assert not {"Any", "import_module", "annotations"} & set(names)
    assert all(hasattr(sl, name) for name in names)


def test_tab_completes_lazy_names():
    completer = rlcompleter.Completer({"sl": sl})
    assert completer.complete("sl.exp", 0) == "sl.export("
    assert completer.complete("sl.Steering", 0) in ("sl.SteeringPanel(", "sl.SteeringVector(")


# --- quiet by default -------------------------------------------------------------------------


def test_loading_and_extracting_a_toy_model_print_no_progress_bar(capfd, monkeypatch):
    # A long delay makes this independent of machine speed: it checks that every bar on
    # this path waits for the delay, not that this machine loads the model in under 1 s.
    monkeypatch.setattr(progress, "DELAY_S", 60.0)
    lm = sl.load("steerlab-tiny", backend="hf")
    sl.extract(lm, ["I was happy."], ["I was sad."], ["blocks.1.hook_resid_pre"])
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "extract" not in err and "it/s" not in err


def test_the_delay_is_scoped_to_load():
    from transformers.utils import logging

    sl.load("steerlab-tiny", backend="hf")
    previous = logging.set_tqdm_hook(None)  # what load left installed
    assert previous is None


def test_slow_work_still_shows_its_bar(capfd, monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.05)
    for _ in progress.bar(range(3), desc="slow-demo"):
        time.sleep(0.1)
    assert "slow-demo" in capfd.readouterr().err


# --- README claims ----------------------------------------------------------------------------


@pytest.mark.slow
def test_readme_sweep_needs_steering_to_win(tmp_path, monkeypatch):
    """The quickstart's ``table.best()`` is a steered cell, the one its comment names."""
    block = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)[1]
    code = block.split("\nfig = ")[0]  # the vector and sweep lines; the figures need Chromium
    claim = re.search(r"layer (\d+), alpha (\S+) \(score ([\d.]+); unsteered ([\d.]+)\)", code)
    assert claim, "the README's table.best() comment no longer states its result"
    monkeypatch.chdir(tmp_path)
    from steerlab.toy import concept_score

    namespace = {"sl": sl, "concept_score": concept_score, "lm": sl.load("steerlab-tiny")}
    exec(compile(code, str(README), "exec"), namespace)
    best, table = namespace["table"].best(), namespace["table"]
    assert best["alpha"] != 0
    assert (best["layer"], best["alpha"]) == (int(claim[1]), float(claim[2]))
    assert best["score"] == pytest.approx(float(claim[3]))
    assert table.baseline["score"] == pytest.approx(float(claim[4]))
    assert best["score"] > table.baseline["score"]
    assert len(namespace["out"].text) == 1
