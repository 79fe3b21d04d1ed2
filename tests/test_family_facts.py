"""One record per HF ``model_type`` (``backends/families.py``), read by every part.

The expected contents below are the five tables steerlab kept apart before the record,
written out by hand from that code: the record must say exactly what they said. Then each
part must refuse a family it lacks naming itself and what it has, and a new row must be
all a family needs for every part that reads it.
"""

from __future__ import annotations

import pytest
import torch

import steerlab as sl
from steerlab.backends import hooked_config
from steerlab.backends.convert import FAMILIES as CONVERT_FAMILIES
from steerlab.backends.convert import hooked_config_fields
from steerlab.backends.families import (
    FACTS,
    HF,
    HOOKED,
    STEP,
    VLLM,
    FamilyFacts,
    has_plain_head,
    lookup,
    refusal,
    table,
)
from steerlab.backends.head import plain_head
from steerlab.backends.hf import LAYOUTS as HF_LAYOUTS
from steerlab.core.errors import FamilyError
from steerlab.core.prompts import encode
from steerlab.engine.compiled.families import STEPS, family_reason, step_class
from steerlab.engine.vllm.sites import layout_for
from steerlab.testing import char_tokenizer, tiny_model


def _row(blocks="model.layers", attn="self_attn", mlp="mlp", parallel=False, flat_mlp=False,
         embed_scale=None, residual_scale=None, variant_check=False) -> tuple:  # fmt: skip
    """A row of the old ``backends/hf.py`` ``LAYOUTS``, as a tuple; the defaults are Llama's."""
    return (blocks, attn, mlp, parallel, flat_mlp, embed_scale, residual_scale, variant_check)


_H = "transformer.h"
_POST = _row(attn="post_attention_layernorm", mlp="post_feedforward_layernorm")
_SCALES = dict(embed_scale="embedding_multiplier", residual_scale="residual_multiplier")
_LLAMA_LIKE = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
               "gemma", "phi3", "smollm3", "starcoder2", "glm", "olmo")  # fmt: skip
OLD_HF = {
    **dict.fromkeys(_LLAMA_LIKE, _row()),
    **dict.fromkeys(("gemma2", "gemma3_text", "olmo2", "olmo3"), _POST),
    "glm4": _row(attn="post_self_attn_layernorm", mlp="post_mlp_layernorm"),
    "granite": _row(**_SCALES),
    "granitemoe": _row(mlp="block_sparse_moe", **_SCALES),
    "gpt2": _row(_H, "attn"),
    "opt": _row("model.decoder.layers", mlp="fc2", flat_mlp=True, variant_check=True),
    "stablelm": _row(parallel=("use_parallel_residual",)),
    "gpt_neox": _row("gpt_neox.layers", "attention", parallel=("use_parallel_residual",)),
    "gptj": _row(_H, "attn", parallel=True),
    "falcon": _row(_H, "self_attention", parallel=("parallel_attn", "new_decoder_architecture")),
    "phi": _row(parallel=True),
    "cohere": _row(parallel=True),
    "cohere2": _row(parallel=True),
}
# backends/convert.py's FAMILIES: (TransformerLens weight converter, pinned values)
OLD_HOOKED = {
    "gpt2": ("convert_gpt2_weights", {}),
    "llama": ("convert_llama_weights", {"attention_bias": False, "mlp_bias": False}),
    "mistral": ("convert_mistral_weights", {}),
}
_VLLM_LLAMA = ("model.layers", "model.embed_tokens", "self_attn", "mlp",
               "post_attention_layernorm", "pair")  # fmt: skip
# engine/vllm/sites.py's LAYOUTS: (blocks, embed, attn, mlp, mid_norm, form)
OLD_VLLM = {
    "gpt2": ("transformer.h", "transformer.wte", "attn", "mlp", None, "full"),
    **dict.fromkeys(("llama", "mistral", "qwen2", "qwen3"), _VLLM_LLAMA),
}
# engine/compiled/families.py's FAMILIES: the step class's name
OLD_STEP = {"gpt2": "GPT2", "llama": "Llama", "mistral": "Llama", "qwen2": "Llama"}
OLD_PLAIN_HEAD = {"gpt2", "llama", "mistral", "qwen2"}  # backends/head.py's PLAIN_HEAD


def _hf_row(layout) -> tuple:
    return (layout.blocks, layout.attn, layout.mlp, layout.parallel, layout.flat_mlp,
            layout.embed_scale, layout.residual_scale, layout.unsupported is not None)  # fmt: skip


def test_the_record_says_what_the_five_tables_said():
    assert {t: _hf_row(layout) for t, layout in table(HF).items()} == OLD_HF
    hooked = {t: (c.weights, dict(c.pinned)) for t, c in table(HOOKED).items()}
    assert hooked == OLD_HOOKED
    vllm = {
        t: (v.blocks, v.embed, v.attn, v.mlp, v.mid_norm, v.form) for t, v in table(VLLM).items()
    }
    assert vllm == OLD_VLLM
    assert {t: STEPS[name].__name__ for t, name in table(STEP).items()} == OLD_STEP
    assert {t for t in FACTS if has_plain_head(t)} == OLD_PLAIN_HEAD
    assert set(FACTS) == set(OLD_HF)  # every family the record knows has a hook table


def test_the_conversions_are_the_same_objects_the_record_holds():
    assert FACTS["gpt2"].hooked is hooked_config.GPT2
    assert FACTS["llama"].hooked is hooked_config.LLAMA
    assert FACTS["mistral"].hooked is hooked_config.MISTRAL
    assert dict(CONVERT_FAMILIES) == dict(table(HOOKED)) and dict(HF_LAYOUTS) == dict(table(HF))


def test_the_views_follow_the_record(monkeypatch):
    """``hf.LAYOUTS`` and ``convert.FAMILIES`` are views, not copies that could go stale."""
    monkeypatch.setitem(FACTS, "my_llama", FACTS["llama"])
    assert HF_LAYOUTS["my_llama"] is FACTS["llama"].hf and "my_llama" in CONVERT_FAMILIES
    with pytest.raises(TypeError):
        HF_LAYOUTS["other"] = FACTS["llama"].hf  # type: ignore[index]


PARTS = [
    (HF, "no hook table for HuggingFace model_type 'bloom'",
     f"Supported: {', '.join(sorted(OLD_HF))}."),
    (HOOKED, "backend='hooked' converts local models",
     "of type gpt2, llama, mistral; this one is 'bloom'"),
    (VLLM, "vLLM engine has no site table for model_type 'bloom'",
     "it knows gpt2, llama, mistral, qwen2, qwen3."),
    (STEP, "model_type 'bloom' has no compiled step", "(have: gpt2, llama, mistral, qwen2)"),
]  # fmt: skip


@pytest.mark.parametrize(("part", "names_part", "names_known"), PARTS)
def test_each_part_refuses_an_unknown_family_naming_itself_and_what_it_has(
    part, names_part, names_known
):
    with pytest.raises(FamilyError) as error:
        lookup("bloom", part)
    assert names_part in str(error.value) and names_known in str(error.value)
    assert refusal("bloom", part) == str(error.value)
    assert isinstance(error.value, ValueError)  # what callers caught before


@pytest.mark.parametrize(
    ("model_type", "part", "words"),
    [("gemma2", HOOKED, "this one is 'gemma2'"), ("qwen3", STEP, "'qwen3' has no compiled step"),
     ("opt", VLLM, "no site table for model_type 'opt'")],
)  # fmt: skip
def test_a_family_one_part_knows_is_refused_by_another(model_type, part, words):
    assert lookup(model_type, HF) is FACTS[model_type].hf
    with pytest.raises(FamilyError, match=words):
        lookup(model_type, part)


def test_a_compiled_step_without_a_plain_head_is_refused_when_the_row_is_made():
    with pytest.raises(FamilyError, match="plain_head=True"):
        FamilyFacts(step="llama")
    assert set(table(STEP).values()) <= set(STEPS)  # every step a row names exists


def _renamed_llama():
    """A tiny Llama whose config calls its family ``my_llama``, which no part knows."""
    model = tiny_model("llama", n_layers=2, d_model=32)
    model.config.model_type = "my_llama"
    return model


def test_without_a_row_every_part_refuses_the_family():
    model = _renamed_llama()
    with pytest.raises(FamilyError, match="no hook table for HuggingFace model_type 'my_llama'"):
        sl.wrap(model, char_tokenizer())
    with pytest.raises(FamilyError, match="this one is 'my_llama'"):
        hooked_config_fields(model.config)
    with pytest.raises(FamilyError, match="no site table for model_type 'my_llama'"):
        layout_for("my_llama")
    assert family_reason(model, 8) == refusal("my_llama", STEP)
    assert plain_head(model) is None


def test_one_row_is_all_a_family_needs_in_every_part(monkeypatch):
    """Every part reads the record: one row makes the renamed Llama work everywhere."""
    monkeypatch.setitem(FACTS, "my_llama", FACTS["llama"])
    model = _renamed_llama()
    lm = sl.wrap(model, char_tokenizer())
    v = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(0))
    steered = lm.logits("hello", sl.Steer("blocks.0.hook_resid_post", v, alpha=1.0))
    # The same steer as a plain PyTorch hook on HF's first block: the hf table's row is used.
    handle = model.model.layers[0].register_forward_hook(lambda _m, _a, out: out + v)
    try:
        with torch.no_grad():
            ids = torch.tensor([encode(lm.tokenizer, "hello", chat=False)])
            expected = model(input_ids=ids).logits
    finally:
        handle.remove()
    assert torch.allclose(steered, expected, atol=1e-5)
    assert hooked_config_fields(model.config)["n_layers"] == 2
    assert layout_for("my_llama").form == "pair"
    assert family_reason(model, 8) is None and step_class(model.config).__name__ == "Llama"
    assert plain_head(model) is model.lm_head
