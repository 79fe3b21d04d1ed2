"""Tiny random models for tests and benchmarks: built from configs, nothing downloaded."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from steerlab.core.positions import kept
from steerlab.core.tagging import tag

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


# --- a fake backend for the loop, chat, scheduler and server tests -----------------------

_VOCAB = 98  # char_tokenizer: 3 specials + printable ASCII


class FakeCache:
    """Token ids and positions fed so far, per row."""

    def __init__(self, batch: int) -> None:
        self.ids = torch.zeros(batch, 0, dtype=torch.long)


class FakeCacheOps:
    def fork(self, data: Any) -> Any:
        return copy.deepcopy(data)

    def repeat(self, data: Any, n: int) -> Any:
        data.ids = data.ids.repeat_interleave(n, 0)
        return data

    def crop(self, data: Any, length: int) -> Any:
        data.ids = data.ids[:, :length]
        return data

    def select(self, data: Any, rows: torch.Tensor) -> Any:
        data.ids = data.ids[rows]
        return data

    def take(self, data: Any, row: int, keep: torch.Tensor) -> Any:
        new = copy.copy(data)
        new.ids = data.ids[row : row + 1, keep]
        return new

    def stack(self, parts: list[Any], length: int) -> Any:
        some = copy.copy(next(p for p in parts if p is not None))
        rows = [torch.zeros(1, 0, dtype=torch.long) if p is None else p.ids for p in parts]
        some.ids = torch.cat([torch.cat([r.new_zeros(1, length - r.shape[1]), r], 1)
                              for r in rows])  # fmt: skip
        return some


class FakeModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.resid = nn.Identity()  # the one hookable site


class FakeBackend:
    """A backend for testing the loop, chat, the scheduler and the server in milliseconds.

    Logits favour token ``(token + position) % 98`` (the ``char_tokenizer`` vocabulary),
    plus whatever a steer added at its one site, so a wrong position, a stale cache or a
    row mixed up with another changes the tokens. It records every forward's shape
    (``forwards``), the positions it was given (``positions``) and the sites steered
    (``attached``).

    >>> fake = sl.SteerableModel(FakeBackend(), char_tokenizer())
    >>> fake.generate("ab", max_new_tokens=4).text
    ['dgkp']
    """

    kind = "fake"
    site = "blocks.0.hook_resid_pre"
    n_layers, d_model, n_ctx, n_vocab = 1, _VOCAB, 512, _VOCAB
    cache_ops = FakeCacheOps()

    def __init__(self) -> None:
        self.model = FakeModel()
        self.forwards: list[tuple[int, ...]] = []  # (batch, new positions) per forward
        self.positions: list[torch.Tensor] = []
        self.attached: list[str] = []

    @property
    def input_device(self) -> torch.device:
        return torch.device("cpu")

    def sites(self) -> list[str]:
        return [self.site]

    def attach(self, site: Any, fn: Any) -> list[Any]:
        self.attached.append(str(site))

        def hook(_module: nn.Module, _args: Any, output: torch.Tensor) -> Any:
            return fn(output)

        return [self.model.resid.register_forward_hook(tag(hook))]

    def new_cache(self, batch: int) -> FakeCache:
        return FakeCache(batch)

    def modules(self) -> list[nn.Module]:
        return [self.model]

    def generation_eos(self) -> set[int]:
        return set()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache: Any, *,
                positions: torch.Tensor | None = None, last_only: bool = False,
                keep: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        assert positions is not None, "the loop always hands positions over"
        self.forwards.append(tuple(input_ids.shape))
        self.positions.append(positions.clone())
        if cache is not None:
            cache.ids = torch.cat([cache.ids, input_ids], 1)
        target = (input_ids + positions) % _VOCAB  # [batch, new]
        resid = self.model.resid(torch.nn.functional.one_hot(target, _VOCAB).float() * 5)
        logits = resid + 0.01 * torch.arange(_VOCAB)  # ties break the same way everywhere
        return kept(logits, last_only, keep)
