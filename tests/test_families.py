"""Every family in the hf table against plain HuggingFace, on tiny random configs.

Each family is checked four ways, none of them computed by steerlab: greedy decoding
equals ``model.generate``; steering ``resid_pre``/``resid_post`` equals a plain PyTorch
hook on the block; ``run_with_cache`` equals ``output_hidden_states``; and the sublayer
sites add up to the residual stream they claim to write to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

import steerlab as sl
from steerlab.backends.hf import LAYOUTS
from steerlab.core.sites import Site, SiteError
from steerlab.testing import char_tokenizer

TINY = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=64, vocab_size=98, max_position_embeddings=64,
    bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False,
)  # fmt: skip
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
# name -> (model_type, config overrides); variants exercise the config flags the table reads.
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": ("gpt2", {}),
    "llama": ("llama", {}),
    "mistral": ("mistral", {"sliding_window": 6}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {"head_dim": 8}),
    "gemma": ("gemma", {"head_dim": 8}),
    "gemma2": ("gemma2", {"head_dim": 8}),
    "gemma3_text": ("gemma3_text", {"head_dim": 8, "sliding_window": 6}),
    "phi3": ("phi3", {}),
    "smollm3": ("smollm3", {}),
    "starcoder2": ("starcoder2", {}),
    "glm": ("glm", {"head_dim": 8}),
    "glm4": ("glm4", {"head_dim": 8}),
    "olmo": ("olmo", {}),
    "olmo2": ("olmo2", {}),
    "olmo3": ("olmo3", {"sliding_window": 6}),
    "mixtral": ("mixtral", {"num_local_experts": 4, "head_dim": 8}),
    "qwen2_moe": ("qwen2_moe", {"num_experts": 4, "shared_expert_intermediate_size": 32, **MOE}),
    "qwen3_moe": ("qwen3_moe", {"num_experts": 4, "head_dim": 8, **MOE}),
    "granite": ("granite", {"embedding_multiplier": 3.0, "residual_multiplier": 0.5}),
    "granitemoe": (
        "granitemoe",
        {"num_local_experts": 4, "embedding_multiplier": 3.0, "residual_multiplier": 0.5},
    ),
    "opt": ("opt", {"ffn_dim": 64, "word_embed_proj_dim": 32}),
    "stablelm": ("stablelm", {}),
    "stablelm-parallel": ("stablelm", {"use_parallel_residual": True}),
    "gpt_neox": ("gpt_neox", {}),
    "gpt_neox-sequential": ("gpt_neox", {"use_parallel_residual": False}),
    "gptj": ("gptj", {"rotary_dim": 4}),
    "falcon": ("falcon", {}),
    "falcon-sequential": ("falcon", {"parallel_attn": False}),
    "falcon-new-arch": ("falcon", {"new_decoder_architecture": True, "num_kv_heads": 2}),
    "phi": ("phi", {}),
    "cohere": ("cohere", {}),
    "cohere2": ("cohere2", {"head_dim": 8, "sliding_window": 6}),
}
PARALLEL = {
    "stablelm-parallel", "gpt_neox", "gptj", "falcon", "falcon-new-arch", "phi", "cohere",
    "cohere2",
}  # fmt: skip
LEARNED_POSITIONS = {"gpt2", "opt"}  # hook_embed is the token embedding alone
PROMPTS = ["Hi", "The quick brown fox"]
WEIGHT_SCALE = 8.0


@dataclass
class Family:
    name: str
    model: Any  # the HF model, also wrapped by ``lm``
    lm: sl.SteerableModel
    blocks: nn.ModuleList  # found here without steerlab's table


def tiny_hf(model_type: str, seed: int = 0, **overrides: Any) -> Any:
    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **{**TINY, **overrides})
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # at init scale the blocks barely move the logits: make them matter
        for weight in model.parameters():
            if weight.ndim > 1:
                weight.mul_(WEIGHT_SCALE)
    return model


def decoder_blocks(model: nn.Module) -> nn.ModuleList:
    """The outermost module list with one entry per layer."""
    n_layers = model.config.get_text_config().num_hidden_layers
    lists = (m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) == n_layers)
    return next(lists)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Models this small run fastest on one thread, and far faster on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request) -> Family:
    model_type, overrides = FAMILIES[request.param]
    model = tiny_hf(model_type, **overrides)
    return Family(request.param, model, sl.wrap(model, char_tokenizer()), decoder_blocks(model))


def test_every_claimed_model_type_is_tested():
    assert {model_type for model_type, _ in FAMILIES.values()} == set(LAYOUTS)


def test_greedy_matches_hf_generate(family):
    tokenizer = char_tokenizer()
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        expected = family.model.generate(
            **batch, max_new_tokens=8, do_sample=False, pad_token_id=2, eos_token_id=None
        )[:, batch.input_ids.shape[1] :]
    out = family.lm.generate(PROMPTS, max_new_tokens=8, stop_at_eos=False)
    assert out.tokens == expected.tolist()


def add_to_block(block: nn.Module, where: str, delta: torch.Tensor) -> Any:
    """A plain PyTorch hook adding ``delta`` to a block's input or output."""
    if where == "hook_resid_pre":

        def pre(_m: nn.Module, args: tuple, kwargs: dict) -> Any:
            if args:
                return (args[0] + delta, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + delta}

        return block.register_forward_pre_hook(pre, with_kwargs=True)

    def post(_m: nn.Module, _args: Any, output: Any) -> Any:
        if isinstance(output, torch.Tensor):
            return output + delta
        return (output[0] + delta, *output[1:])

    return block.register_forward_hook(post)


@pytest.mark.parametrize("site", ["blocks.1.hook_resid_pre", "blocks.0.hook_resid_post"])
def test_resid_steering_matches_a_plain_hook(family, site):
    v = torch.randn(32, generator=torch.Generator().manual_seed(3))
    prompt = "The quick brown fox"
    got = family.lm.logits([prompt], sl.Steer(site, v, alpha=4.0))
    parsed = Site.parse(site)
    assert parsed.layer is not None
    handle = add_to_block(family.blocks[parsed.layer], parsed.kind, 4.0 * v)
    try:
        with torch.no_grad():
            expected = family.model(**char_tokenizer()(prompt, return_tensors="pt")).logits
    finally:
        handle.remove()
    unsteered = family.lm.logits([prompt])
    assert not torch.allclose(unsteered, expected, atol=1e-3)  # the steer does something
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_run_with_cache_matches_hidden_states(family):
    cache = family.lm.run_with_cache(PROMPTS)
    mask = cache.attention_mask
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with torch.no_grad():
        hidden = family.model(
            input_ids=cache.tokens, attention_mask=mask, position_ids=positions,
            output_hidden_states=True,
        ).hidden_states  # fmt: skip
    n_layers = family.lm.n_layers
    real = mask.bool()
    assert len(hidden) == n_layers + 1
    for layer in range(n_layers):
        pre = cache[f"blocks.{layer}.hook_resid_pre"]
        torch.testing.assert_close(pre[real], hidden[layer][real], atol=1e-5, rtol=1e-5)
    # hidden[-1] is after the final norm, so resid_post compares only below the last layer.
    for layer in range(n_layers - 1):
        post = cache[f"blocks.{layer}.hook_resid_post"]
        torch.testing.assert_close(post[real], hidden[layer + 1][real], atol=1e-5, rtol=1e-5)


def test_sublayer_sites_add_up_to_the_stream(family):
    """attn_out and mlp_out are exactly what each block adds to its residual stream."""
    cache = family.lm.run_with_cache(PROMPTS)
    real = cache.attention_mask.bool()

    def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
        torch.testing.assert_close(actual[real], expected[real], atol=1e-5, rtol=1e-5)

    if family.name not in LEARNED_POSITIONS:
        close(cache["hook_embed"], cache["blocks.0.hook_resid_pre"])
    for layer in range(family.lm.n_layers):
        pre, attn, mlp, post = (
            cache[f"blocks.{layer}.hook_{kind}"]
            for kind in ("resid_pre", "attn_out", "mlp_out", "resid_post")
        )
        if family.name in PARALLEL:
            close(post, pre + attn + mlp)
        else:
            mid = cache[f"blocks.{layer}.hook_resid_mid"]
            close(mid, pre + attn)
            close(post, mid + mlp)


def test_sublayer_steering_shifts_the_stream(family):
    """Adding v to a sublayer output is adding v to the stream right after it."""
    v = torch.randn(32, generator=torch.Generator().manual_seed(4))
    prompt = ["The quick brown fox"]

    def steered(kind: str) -> torch.Tensor:
        return family.lm.logits(prompt, sl.Steer(f"blocks.0.{kind}", v, alpha=2.0))

    after_attn = "hook_resid_post" if family.name in PARALLEL else "hook_resid_mid"
    torch.testing.assert_close(steered("hook_attn_out"), steered(after_attn), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        steered("hook_mlp_out"), steered("hook_resid_post"), atol=1e-5, rtol=1e-5
    )


def test_resid_mid_exists_exactly_where_the_block_is_sequential(family):
    has_mid = "blocks.0.hook_resid_mid" in family.lm.sites()
    assert has_mid == (family.name not in PARALLEL)
    if has_mid:
        return
    calls = []
    handle = family.model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        with pytest.raises(SiteError, match="no hook_resid_mid.*parallel block"):
            family.lm.generate("Hi", sl.Steer("blocks.0.hook_resid_mid", torch.ones(32)))
        with pytest.raises(SiteError, match="parallel block"):
            family.lm.backend.attach(Site.parse("blocks.0.hook_resid_mid"), lambda a: None)
    finally:
        handle.remove()
    assert calls == [] and family.lm.hook_count() == 0


def test_unknown_model_type_is_refused():
    with pytest.raises(ValueError, match="no hook table for HuggingFace model_type 'bloom'"):
        sl.wrap(tiny_hf("bloom"), char_tokenizer())


def test_post_norm_opt_is_refused():
    model = tiny_hf("opt", ffn_dim=64, do_layer_norm_before=False)
    with pytest.raises(ValueError, match="does not cover post-norm OPT"):
        sl.wrap(model, char_tokenizer())
