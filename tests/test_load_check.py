"""The load-time check: bridge and hooked are compared with the HF model they came from."""

import json
import warnings

import pytest
import torch
from helpers import BACKENDS, load_tiny

import steerlab as sl
from steerlab.backends import tl
from steerlab.backends.parity import Reference, check, probe_ids, unbridged
from steerlab.testing import save_tiny


@pytest.fixture(scope="module")
def unscaled_gpt2(tmp_path_factory) -> str:
    """GPT-2 without attention scaling: TransformerBridge 3.9 scales it anyway."""
    folder = save_tiny(tmp_path_factory.mktemp("unscaled"), "gpt2")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "scale_attn_weights": False}))
    return str(folder)


def test_bridge_warns_when_transformer_lens_disagrees_with_hf(unscaled_gpt2):
    with pytest.warns(sl.ParityWarning, match="backend='bridge' disagrees"):
        sl.load(unscaled_gpt2, backend="bridge")
    with pytest.raises(sl.ParityError, match="logits differ"):
        sl.load(unscaled_gpt2, backend="bridge", strict=True)


def test_bridge_warns_on_cohere_below_tl4(tmp_path):
    """TransformerLens 3.9's Cohere attention differs from HF's (0.8% of the logits' norm);
    4.x's matches it (1e-8 on this tiny model), so there it loads under strict."""
    folder = save_tiny(tmp_path / "cohere", "cohere")
    if tl.major() == 3:
        with pytest.warns(sl.ParityWarning, match="logits differ"):
            sl.load(folder, backend="bridge")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error", sl.ParityWarning)
            sl.load(folder, backend="bridge", strict=True)


def test_hooked_and_hf_load_the_same_folder_without_a_warning(unscaled_gpt2):
    with warnings.catch_warnings():
        warnings.simplefilter("error", sl.ParityWarning)
        for backend in ("hooked", "hf"):
            sl.load(unscaled_gpt2, backend=backend, strict=True)


@pytest.mark.parametrize("backend", ["bridge", "hooked"])
def test_faithful_models_pass_strict(tiny_dirs, backend):
    with warnings.catch_warnings():
        warnings.simplefilter("error", sl.ParityWarning)
        sl.load(tiny_dirs["llama"], backend=backend, strict=True)


def test_check_refuses_a_reference_it_does_not_match(tiny_dirs):
    backend = BACKENDS[1]  # hooked on TransformerLens 3.9, else the bridge
    lm = load_tiny(tiny_dirs, "gpt2", backend)
    ids = probe_ids(lm.tokenizer)
    logits = lm.backend.forward(ids, torch.ones_like(ids), None).detach()
    check(lm.backend, Reference(ids, logits, torch.float32), strict=True, name="same")
    shifted = Reference(ids, logits * 1.01, torch.float32)  # off by 1% of the norm
    with pytest.raises(sl.ParityError, match=f"backend='{backend}'"):
        check(lm.backend, shifted, strict=True, name="shifted")
    loose = Reference(ids, shifted.logits, torch.bfloat16)  # within bfloat16 rounding
    check(lm.backend, loose, strict=True, name="bf16")


def test_unbridged_puts_the_bridge_back_afterwards(tiny_dirs):
    bridge = load_tiny(tiny_dirs, "gpt2", "bridge").model
    before = [(name, type(m)) for name, m in bridge.original_model.named_modules()]
    with unbridged(bridge.original_model) as hf_model:
        assert not any("_original_component" in n for n, _ in hf_model.named_modules())
    assert [(name, type(m)) for name, m in bridge.original_model.named_modules()] == before
