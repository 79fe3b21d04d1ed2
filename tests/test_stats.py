"""Compact statistics: numbers checked against torch, names resolved on every backend."""

from __future__ import annotations

import pytest
import torch

import steerlab as sl
from steerlab.stats import PERCENTILES, describe, module_name


def test_describe_matches_torch():
    x = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    s = describe(x)
    assert s.shape == (4, 50)
    assert s.mean == pytest.approx(float(x.double().mean()))
    assert s.std == pytest.approx(float(x.double().std()))
    assert (s.min, s.max) == pytest.approx((float(x.min()), float(x.max())))
    assert s.norm == pytest.approx(float(x.double().norm()))
    assert list(s.percentiles) == list(PERCENTILES)
    assert s.percentiles[50] == pytest.approx(float(x.double().quantile(0.5)))
    assert sum(s.histogram) == x.numel()
    compact = describe(x, compact=True)
    assert compact.percentiles is None and compact.histogram is None
    assert set(compact.to_dict()) == {"shape", "mean", "std", "min", "max", "norm"}


def test_activations_leave_pads_out(lm):
    acts = lm.run_with_cache(["Hi", "A longer prompt"], sites=["blocks.1.hook_resid_post"])
    stats = sl.stats.activations(acts, compact=True)
    tensor = acts["blocks.1.hook_resid_post"]
    real = tensor[acts.attention_mask.bool()]
    entry = stats["blocks.1.hook_resid_post"]
    assert entry.shape == tuple(tensor.shape)
    assert entry.mean == pytest.approx(float(real.double().mean()), rel=1e-5)
    assert entry.norm == pytest.approx(float(real.double().norm()), rel=1e-5)
    text = repr(stats)
    assert "blocks.1.hook_resid_post" in text and len(text.splitlines()) == 3
    assert "p50" in repr(sl.stats.activations(acts))  # the full form adds percentiles


def test_activations_of_a_chat_turn():
    lm = sl.load("steerlab-tiny", backend="hf")
    chat = lm.chat(system="You are a storyteller.")
    reply = chat.say("Hi", max_new_tokens=3, capture=["blocks.0.hook_resid_post"])
    stats = sl.stats.activations(reply.activations, compact=True)
    assert stats["blocks.0.hook_resid_post"].shape[-1] == lm.d_model


def test_weights_by_site_and_by_module_name(lm):
    by_site = sl.stats.weights(lm, ["blocks.1.hook_mlp_out"], compact=True)
    assert by_site and all(".1." in name for name in by_site)
    where = module_name(lm, "blocks.1.hook_mlp_out")
    params = lm.model.get_submodule(where).named_parameters()
    norms = {f"{where}.{name}".replace("._original_component", ""): float(p.detach().double().norm())
             for name, p in params}  # fmt: skip
    assert set(norms) == set(by_site)
    for name, entry in by_site.items():
        assert entry.norm == pytest.approx(norms[name], rel=1e-5)
    block = sl.stats.weights(lm, "blocks.1.hook_resid_pre", compact=True)
    assert len(block) > len(by_site)
    first = next(name for name, _ in lm.model.named_parameters())
    assert list(sl.stats.weights(lm, first)) == [first]
    assert len(sl.stats.weights(lm, "hook_embed", compact=True)) >= 1
    with pytest.raises(KeyError, match="Did you mean"):
        sl.stats.weights(lm, "blocks.1.hook_mlp_ot")


def test_to_dict_is_plain_data(lm):
    import json

    stats = sl.stats.weights(lm, ["blocks.0.hook_attn_out"])
    json.dumps(stats.to_dict())
    assert "<table>" in stats._repr_html_()
