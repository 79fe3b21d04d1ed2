"""backend="hooked" on local folders: every HF config attribute is mapped, inert, or refused.

Each conversion is checked against the HF model's own logits on the same weights, at
lengths where the attribute matters (past the RoPE scaling threshold, past the window).
"""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import steerlab as sl
from steerlab.backends.convert import (
    FAMILIES,
    INERT_ANY_FAMILY,
    PINNED_ANY_FAMILY,
    ConversionError,
    hooked_from_hf,
)
from steerlab.testing import save_tiny, tiny_config

LLAMA3 = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
              high_freq_factor=4.0, original_max_position_embeddings=16)  # fmt: skip
LINEAR = dict(rope_type="linear", rope_theta=10000.0, factor=4.0)


def tiny_hf(family: str, **overrides) -> torch.nn.Module:
    """A tiny random HF model whose config carries ``overrides``."""
    torch.manual_seed(0)
    config = tiny_config(family)
    for key, value in overrides.items():
        setattr(config, key, value)
    return AutoModelForCausalLM.from_config(config).eval()


CASES = {
    "llama rope llama3": ("llama", dict(rope_parameters=LLAMA3)),
    "llama rope linear": ("llama", dict(rope_parameters=LINEAR)),
    "llama multi-head": ("llama", dict(num_key_value_heads=4)),
    "mistral sliding window": ("mistral", dict(sliding_window=6)),
    "mistral window and llama3": ("mistral", dict(sliding_window=6, rope_parameters=LLAMA3)),
    "gpt2 unscaled attention": ("gpt2", dict(scale_attn_weights=False)),
    "gpt2 inverse layer scaling": ("gpt2", dict(scale_attn_weights=False,
                                                scale_attn_by_inverse_layer_idx=True)),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_hooked_logits_match_hf(case):
    family, overrides = CASES[case]
    hf = tiny_hf(family, **overrides)
    hooked = hooked_from_hf(hf, None, device="cpu")
    ids = torch.randint(3, 98, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, actual = hf(ids).logits, hooked(ids)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)


REFUSED = {
    "rope_type='yarn'": ("llama", dict(rope_parameters={**LINEAR, "rope_type": "yarn"})),
    "rope_parameters['beta_fast']": ("llama", dict(rope_parameters={**LINEAR, "beta_fast": 2})),
    "rope_type='linear' together with sliding_window": (
        "mistral", dict(sliding_window=6, rope_parameters=LINEAR)),
    "attention_bias=True": ("llama", dict(attention_bias=True)),
    "mlp_bias=True": ("llama", dict(mlp_bias=True)),
    "add_cross_attention=True": ("gpt2", dict(add_cross_attention=True)),
    "quantization_config": ("llama", dict(quantization_config={"quant_method": "awq"})),
    "my_new_field=3": ("mistral", dict(my_new_field=3)),
    "'gelu_10'": ("gpt2", dict(activation_function="gelu_10")),
}  # fmt: skip


@pytest.mark.parametrize("named", REFUSED)
def test_unmappable_attributes_are_refused_by_name(named):
    family, overrides = REFUSED[named]
    with pytest.raises(ConversionError, match="backend='hf'") as error:
        hooked_from_hf(tiny_hf(family, **overrides), None, device="cpu")
    assert named in str(error.value)


def test_unknown_attributes_at_their_default_pass():
    hooked_from_hf(tiny_hf("llama", my_new_flag=None, pruned_heads={}), None, device="cpu")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_attribute_of_each_family_is_in_the_table(family):
    """A transformers release that adds a config field makes this fail until a row names it."""
    row = FAMILIES[family]
    named = row.mapped | row.inert | set(row.pinned) | INERT_ANY_FAMILY | set(PINNED_ANY_FAMILY)
    config = AutoConfig.for_model(family)
    attributes = {key for key in {**vars(config), **config.to_dict()} if not key.startswith("_")}
    assert attributes - named == set()


def _folder(tmp_path, family: str, **overrides) -> str:
    folder = save_tiny(tmp_path / family, family)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **overrides}))
    return str(folder)


def test_sliding_window_generation_matches_hf_past_the_window(tmp_path):
    folder = _folder(tmp_path, "mistral", sliding_window=4)
    prompts = ["The quick brown fox", "Hi"]
    runs = [sl.load(folder, backend=b).generate(prompts, max_new_tokens=8, stop_at_eos=False)
            for b in ("hf", "hooked")]  # fmt: skip
    assert runs[1].tokens == runs[0].tokens


def test_hooked_stops_at_every_eos_of_the_generation_config(tmp_path):
    folder = save_tiny(tmp_path / "llama", "llama")
    free = sl.load(folder, backend="hf").generate("Hi", max_new_tokens=12, stop_at_eos=False)
    stop = next(t for t in free.tokens[0][2:] if t > 2)  # an ordinary token the model emits
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, stop]}))
    end = free.tokens[0].index(stop)
    for backend in ("hf", "bridge", "hooked"):
        out = sl.load(folder, backend=backend).generate("Hi", max_new_tokens=12)
        assert out.tokens[0][:end] == free.tokens[0][:end], backend
        assert len(out.tokens[0]) <= end + 1 < 12, backend
