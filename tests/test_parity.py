"""Unsteered greedy decoding equals HuggingFace generate, token for token, on every backend."""

import pytest
import torch
from helpers import BACKENDS, PROMPTS, load_tiny
from transformers import AutoModelForCausalLM, AutoTokenizer

import steerlab as sl
from steerlab.testing import save_tiny


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_matches_hf_generate(tiny_dirs, family, backend):
    path = tiny_dirs[family]
    tokenizer = AutoTokenizer.from_pretrained(path)
    reference = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        expected = reference.generate(
            **batch, max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=None,
        )[:, batch.input_ids.shape[1] :]  # fmt: skip

    out = load_tiny(tiny_dirs, family, backend).generate(
        PROMPTS, max_new_tokens=16, stop_at_eos=False
    )
    assert out.tokens == expected.tolist()
    assert out.finish_reasons == ["length"] * 3


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("backend", ["hooked", "bridge"])
def test_lens_logits_match_hf(tiny_dirs, family, backend):
    path = tiny_dirs[family]
    reference = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    lm = load_tiny(tiny_dirs, family, backend)
    ids = torch.randint(3, 90, (2, 11), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected = reference(ids).logits
        got = lm.backend.forward(ids, mask, None)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_all_sites_agree_across_backends(tiny_dirs, family):
    """The canonical names mean the same activation on every backend (pads aside)."""
    caches = {b: load_tiny(tiny_dirs, family, b).run_with_cache(PROMPTS) for b in BACKENDS}
    sites = caches["hf"].keys()
    real = caches["hf"].attention_mask.bool()
    others = [b for b in BACKENDS if b != "hf"]  # hooked only on TransformerLens 3.9
    assert all(set(caches[other]) == set(sites) for other in others)
    for site in sites:
        for other in others:
            torch.testing.assert_close(
                caches[other][site][real], caches["hf"][site][real], atol=1e-4, rtol=1e-4,
                msg=lambda m, site=site, other=other: f"{other} {site}: {m}",
            )  # fmt: skip


@pytest.mark.parametrize("family", ["gemma2", "qwen2", "mistral"])
def test_hf_table_rows_agree_with_the_bridge(tmp_path, family):
    """Each HF layout row maps the canonical sites to what TransformerLens means by them."""
    folder = save_tiny(tmp_path / family, family)
    hf = sl.load(folder, backend="hf").run_with_cache(PROMPTS)
    bridge = sl.load(folder, backend="bridge").run_with_cache(PROMPTS)
    assert set(hf) == set(bridge) and len(hf) == 16
    real = hf.attention_mask.bool()
    for site in hf:
        torch.testing.assert_close(bridge[site][real], hf[site][real], atol=1e-4, rtol=1e-4)
