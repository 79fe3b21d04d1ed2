"""Issue 41, the panel and what the README and tutorials say about it and about BiPO.

The panel's expected texts come from ``lm.generate`` with the same steer built by hand, not
through the panel; the README's BiPO block is run as written.
"""

from __future__ import annotations

import json
import math
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import traitlets

import steerlab as sl
from steerlab.toy import mean_concept_score
from steerlab.widgets import SteeringPanel

PROMPT, NEW = "Once upon a time", 8
REFT_SITE = "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def lm(tiny_dirs) -> sl.SteerableModel:
    return sl.load(tiny_dirs["gpt2"], backend="hf")


def a_loreft(lm, positions="first:2+last:2") -> sl.LoReFT:
    torch.manual_seed(0)
    d, rank = lm.d_model, 2
    R = torch.linalg.qr(torch.randn(d, rank))[0].T.contiguous()  # orthonormal rows
    return sl.LoReFT(REFT_SITE, R, torch.randn(rank, d) * 0.3, torch.randn(rank) * 2,
                     positions=positions)  # fmt: skip


def test_a_loreft_locks_and_shows_its_trained_positions(lm):
    reft = a_loreft(lm)
    vec = sl.SteeringVector({"blocks.0.hook_resid_pre": torch.randn(lm.d_model)})
    panel = SteeringPanel(lm, {"v": vec, "sea": reft}, prompt=PROMPT, max_new_tokens=NEW,
                          debounce=0, alpha=1.0, layer=0)  # fmt: skip
    try:
        c = panel.controls
        c.positions.value = "generated"  # the user's choice for the vector
        c.vector.value = "sea"
        assert c.positions.disabled and c.positions.value == reft.positions
        assert [label for label, _ in c.positions.options] == ["first:2+last:2 (trained)"]
        assert "positions first:2+last:2" in panel.steered_title.value
        assert panel.record()["positions"] == reft.positions
        want = lm.generate(PROMPT, sl.Steer(reft.site, reft.R[0], [0.0, 1.0], reft.positions,
                                            reft), max_new_tokens=NEW)  # fmt: skip
        assert panel.error is None and panel.steered_text == want.text[1]
        with pytest.raises(traitlets.TraitError):  # locked: no other positions on offer
            c.positions.value = "all"
        c.vector.value = "v"  # back: the user's own site and positions, unlocked
        assert (c.layer.value, c.hook.value, c.positions.value) == (0, "hook_resid_pre",
                                                                     "generated")  # fmt: skip
        assert not (c.positions.disabled or c.layer.disabled or c.hook.disabled)
        assert panel.rendered.site == "blocks.0.hook_resid_pre"
        assert panel.steered_text == lm.generate(
            PROMPT, sl.Steer("blocks.0.hook_resid_pre", vec, [0.0, 1.0], "generated"),
            max_new_tokens=NEW).text[1]  # fmt: skip
        assert "(extracted at" not in panel.steered_title.value  # not lent elsewhere
        assert lm.hook_count() == 0
    finally:
        panel.close()


def test_a_panel_that_starts_on_a_loreft_unlocks_to_the_usual_positions(lm):
    panel = SteeringPanel(lm, {"sea": a_loreft(lm, "last:1"), "v": torch.randn(lm.d_model)},
                          prompt=PROMPT, max_new_tokens=NEW, debounce=0)  # fmt: skip
    try:
        c = panel.controls
        assert c.positions.disabled and c.positions.value == "last:1"
        c.vector.value = "v"
        assert not c.positions.disabled and c.positions.value == "all"
        assert "from token 4" in [label for label, _ in c.positions.options]
        assert panel.error is None
    finally:
        panel.close()


def test_a_loreft_refuses_positions_it_was_not_trained_on(lm):
    from steerlab.widgets.runner import PanelRequest, panel_steer

    reft = a_loreft(lm)
    request = PanelRequest(1, PROMPT, "sea", 1, "hook_resid_post", 1.0, "all", 0.0, 0, 1.0, 0, 4)
    with pytest.raises(sl.SteerError, match=r"trained on, 'first:2\+last:2', not 'all'"):
        panel_steer(request, {"sea": reft}, [0.0, 1.0])


def test_the_condition_tooltip_says_the_cosine_is_blind_to_sign(lm):
    """CAST's cosine scores ``h`` and a prompt opposite the vector alike; the tooltip says so
    and names the signed score. Checked on the engine: ``v`` and ``-v`` give equal scores."""
    v = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(1))
    scores = [
        lm.generate(
            [PROMPT, "A lazy dog"],
            sl.Steer(
                "blocks.1.hook_resid_pre",
                v,
                1.0,
                "generated",
                when=sl.Condition("blocks.0.hook_resid_post", d),
            ),
            max_new_tokens=1,
        ).condition_scores  # fmt: skip
        for d in (v, -v)
    ]
    assert torch.allclose(scores[0], scores[1])
    panel = SteeringPanel(lm, {"v": v}, prompt=PROMPT, max_new_tokens=2, debounce=0)
    tip = panel.controls.condition.tooltip
    panel.close()
    assert "read as this vector" not in tip
    assert "either way" in tip and "opposite the vector scores as high" in tip
    assert "score='projection'" in tip


REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def test_the_readme_bipo_block_steers_at_its_own_alpha_with_bipos_defaults():
    """The README's BiPO block, run as written on steerlab-tiny (the quickstart's model):
    its defaults train, ``vec * 4`` turns held-out openings happy and ``vec * -4`` sad, by
    the toy's rule-based concept score, and the block's comments state what it printed."""
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
                if "sl.train.bipo(" in b]  # fmt: skip
    assert "lr=" not in block and "epochs=" not in block  # bipo's defaults, as shipped
    namespace = {"sl": sl, "lm": sl.load("steerlab-tiny", backend="bridge")}
    exec(compile(block, str(README), "exec"), namespace)
    history = namespace["history"]
    assert history.loss[0] == pytest.approx(math.log(2), abs=1e-4)
    assert history.loss[-1] < 0.6
    plain, happier, sadder = (mean_concept_score(namespace[k])
                              for k in ("plain", "happier", "sadder"))  # fmt: skip
    assert plain <= 0.25 and happier >= 0.9 and sadder <= 0.1
    stated = re.search(r"\[mean_concept_score.*# \[(.*?)\]", block).group(1)
    assert [float(x) for x in stated.split(",")] == [plain, happier, sadder]
    shown = re.search(r"History\(bipo: (\d+) steps, loss ([\d.]+) -> ([\d.]+)", block)
    assert shown.groups() == (str(history.steps), f"{history.loss[0]:.4f}",
                              f"{history.loss[-1]:.4f}")  # fmt: skip


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_lab_starts_the_default_kernel_without_a_dialog(tmp_path):
    """``make lab``'s settings, read back by JupyterLab's own reader (jupyterlab_server),
    start the default kernel as the browser test's do; and ``lab`` depends on them."""
    venv = tmp_path / "venv"
    subprocess.run(["make", "-s", "lab-settings", f"VENV={venv}"], cwd=REPO, check=True)
    reader = ("import json, sys; from jupyterlab_server.settings_utils import _get_overrides; "
              "print(json.dumps(_get_overrides(sys.argv[1])[0]))")  # fmt: skip
    env = {**os.environ, "JUPYTER_CONFIG_PATH": str(venv / "etc" / "jupyter")}
    read = subprocess.run([sys.executable, "-c", reader, str(tmp_path / "none")], env=env,
                          check=True, capture_output=True, text=True)  # fmt: skip
    overrides = json.loads(read.stdout)
    browser = runpy.run_path(str(REPO / "tests" / "browser" / "conftest.py"))
    for file, values in browser["LAB_SETTINGS"].items():  # the browser test's, by plugin id
        plugin = file.removesuffix(".jupyterlab-settings").replace("-extension/", "-extension:")
        assert overrides[plugin] == {**overrides[plugin], **values}, plugin
    (lab,) = [line for line in (REPO / "Makefile").read_text().splitlines()
              if line.startswith("lab:")]  # fmt: skip
    assert "lab-settings" in lab.split()


def test_the_readme_links_every_screenshot_and_figure_in_docs_images():
    linked = set(re.findall(r"\(docs/images/([\w.]+\.png)\)", README.read_text()))
    shipped = {p.name for p in (REPO / "docs" / "images").glob("*.png")}
    assert linked == shipped, (sorted(shipped - linked), sorted(linked - shipped))


def test_the_monitor_strip_is_the_engines_readout_for_kept_and_replaced_vectors(lm):
    """The strip's rows are ``out.monitors`` of the same steer through ``lm.generate``: for a
    three-site vector (read at its own sites only), and for a monitor vector replaced
    under the same name (the kept baseline's readout of the old one is not reused)."""
    g = torch.Generator().manual_seed(5)
    sites = [f"blocks.{i}.hook_resid_pre" for i in range(3)]
    three = sl.SteeringVector({s: torch.randn(lm.d_model, generator=g) for s in sites})
    first, second = (torch.randn(lm.d_model, generator=g) for _ in range(2))
    panel = SteeringPanel(lm, {"three": three, "m": first}, prompt=PROMPT, layer=1, alpha=3.0,
                          max_new_tokens=NEW, debounce=0)  # fmt: skip
    try:
        for monitor in ("m", "three", "m"):
            panel.controls.monitor.value = monitor
            if monitor == "m" and panel.vectors["m"] is first:
                panel.add_vector("m", second, select=False)
                panel.controls.alpha.value = 5.0  # a run: the baseline reads the new "m"
            site, alpha = "blocks.1.hook_resid_pre", panel.controls.alpha.value
            reads = {"r": (site, panel.vectors[monitor] if monitor == "m" else
                           three.directions[site])}  # fmt: skip
            want = (
                lm.generate(
                    PROMPT,
                    sl.Steer(site, three, alpha=[0.0, alpha]),
                    max_new_tokens=NEW,
                    monitor=reads,
                )
                .monitors["r"]
                .generated
            )
            assert panel.error is None
            got = panel.monitor_strip.data[0].z
            for row in (0, 1):
                assert list(got[row]) == pytest.approx(want[row].tolist(), abs=1e-5)
        assert lm.hook_count() == 0
    finally:
        panel.close()
