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


# --- the README's shell recipes -----------------------------------------------------------

MAKEFILE = Path(__file__).parents[1] / "Makefile"


def _bash_blocks(text: str) -> list[tuple[int, str]]:
    return [(m.start(), m.group(1)) for m in re.finditer(r"```bash\n(.*?)```", text, flags=re.S)]


def test_shell_commands_come_after_the_venv_is_activated():
    """A fresh shell has no ``steerlab`` and the checkout's folder shadows the package."""
    text = README.read_text()
    activate = text.find("source .venv/bin/activate")
    assert activate >= 0, "the README never says how to activate the venv"
    for start, block in _bash_blocks(text):
        if re.search(r"^(\w+=\S+ )*(steerlab|python|lm_eval)\b|\$\(python", block, re.M):
            assert activate < start, block


def test_setup_sentence_names_the_extras_the_makefile_installs():
    extras = re.search(r'pip install --quiet -e "\.\[([^\]]+)\]"', MAKEFILE.read_text())
    assert extras
    assert f"steerlab[{extras[1]}]" in README.read_text()


def test_a_vector_is_uploaded_before_a_completion_names_it():
    server = next(b for _, b in _bash_blocks(README.read_text()) if "v1/vectors" in b)
    upload = re.search(r"v1/vectors\?name=(\w+)", server)
    assert upload
    uses = [m.start() for m in re.finditer(rf'"vector": "{upload[1]}"', server)]
    assert uses and min(uses) > upload.start()


def test_the_lm_eval_recipes_agree_on_the_bos_and_make_their_task_folder():
    recipes = [b for _, b in _bash_blocks(README.read_text()) if "lm_eval --model" in b]
    assert len(recipes) == 2
    for recipe in recipes:
        assert "add_bos_token=True" not in recipe  # a second BOS after the rolling prefix
        assert "custom_prefix_token_id=0" in recipe
        folder = re.search(r"--include_path (\S+)", recipe)
        assert folder and folder[1] == "$TASKS"
        assert re.search(r"^\s*TASKS=\$\(python -c .*lm_eval_tasks\(", recipe, re.M)
        for preset in re.findall(r"--preset \w+=(\S+)@", recipe):
            assert re.search(rf"\.at\('blocks\.\d+\.hook_\w+'\)\.save\('{preset}'\)", recipe)


def test_make_lab_turns_off_the_news_pop_up():
    """JupyterLab asks about news until its fetchNews setting is set; make lab sets it as a
    default setting of the venv's lab (checked in a real browser when it was written)."""
    import json
    import shlex

    text = MAKEFILE.read_text()
    target = re.search(r"^LAB_DEFAULTS\s*:=\s*(\S+)$", text, re.M)
    assert target and target[1].endswith("etc/jupyter/labconfig/default_setting_overrides.json")
    lab = text.split("\nlab: ")[1].split("\n")[0].split()  # directly, or through lab-settings
    settings = text.split("\nlab-settings: ")[1].split("\n")[0].split()
    assert "$(LAB_DEFAULTS)" in lab or ("lab-settings" in lab and "$(LAB_DEFAULTS)" in settings)
    recipe = re.split(r"^\$\(LAB_DEFAULTS\):.*\n", text, flags=re.M)[1].split("\n\n")[0]
    echo = next(line for line in recipe.splitlines() if "echo" in line)
    written = json.loads(shlex.split(echo.split("echo", 1)[1].split(">")[0])[0])
    notification = written["@jupyterlab/apputils-extension:notification"]
    assert notification == {"fetchNews": "false", "checkForUpdates": False}


def test_the_screenshot_list_shows_every_tutorial_with_figures():
    text = README.read_text().split("## Screenshots and figures")[1].split("\n## ")[0]
    for tutorial in ("03_looking_inside", "08_sae_features", "09_is_this_vector_any_good"):
        assert f"docs/images/{tutorial}_fig1.png" in text
    for image in re.findall(r"\((docs/images/[^)]+\.png)\)", text):
        assert (README.parent / image).is_file(), image
