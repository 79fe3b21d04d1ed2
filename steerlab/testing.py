"""Tiny random models for tests and benchmarks: built from configs, nothing downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

_SPECIALS = ("<|bos|>", "<|eos|>", "<|pad|>")


def char_tokenizer(*, add_bos: bool = True) -> Any:
    """A character-level fast tokenizer over printable ASCII, with BOS, EOS and PAD."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIALS)}
    for code in range(32, 127):
        vocab[chr(code)] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|pad|>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", 0)]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )


def tiny_config(family: str = "gpt2", *, n_layers: int = 3, d_model: int = 64, vocab: int = 98,
                n_ctx: int = 128) -> Any:  # fmt: skip
    """A small random-model config for ``family`` (``gpt2``, ``llama``, ``gemma2``, ...)."""
    from transformers import AutoConfig

    ids = dict(bos_token_id=0, eos_token_id=1, pad_token_id=2, vocab_size=vocab)
    if family == "gpt2":
        return AutoConfig.for_model(
            "gpt2", n_layer=n_layers, n_embd=d_model, n_head=4, n_positions=n_ctx, **ids
        )
    return AutoConfig.for_model(
        family,
        num_hidden_layers=n_layers,
        hidden_size=d_model,
        intermediate_size=2 * d_model,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=d_model // 4,
        max_position_embeddings=n_ctx,
        tie_word_embeddings=False,
        **ids,
    )


def tiny_model(family: str = "gpt2", *, seed: int = 0, **config: Any) -> Any:
    """A random HF causal LM in eval mode; the same seed gives the same weights."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(family, **config)
    cfg._attn_implementation = "eager"  # the TransformerBridge runs eager attention too
    return AutoModelForCausalLM.from_config(cfg).eval()


def save_tiny(directory: str | Path, family: str = "gpt2", **config: Any) -> Path:
    """Write a tiny random model and its tokenizer as a local HF-format folder."""
    directory = Path(directory)
    tiny_model(family, **config).save_pretrained(directory)
    char_tokenizer().save_pretrained(directory)
    return directory
