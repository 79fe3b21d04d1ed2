"""The decode step's model code, written out per family over the HF model's own weights.

The compiled step calls only leaf modules (linear layers, norms, the rotary table) and
never a module steerlab hooks (embeddings, blocks, attention, MLP), so no hook is traced
and a steer's data can change without touching the graph. A TransformerBridge replaces
the HF model's modules with bridge components; ``plain`` unwraps them to the originals.
A new family is a new class here and a row in ``FAMILIES``.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn


def plain(module: Any) -> Any:
    """The original module under any TransformerBridge wrappers."""
    while hasattr(module, "_original_component"):
        module = module._original_component
    return module


def part(module: Any, path: str) -> Any:
    """``module.a.b`` with bridge wrappers unwrapped at every step."""
    for name in path.split("."):
        module = plain(getattr(plain(module), name))
    return module


class Family(Protocol):
    """One architecture's decode step, a token per row, from embedding to logits."""

    n_layers: int
    n_kv_heads: int
    head_dim: int

    def embed(self, ids: torch.Tensor) -> torch.Tensor: ...  # [B, 1] -> [B, 1, d]

    def place(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """Positions in: added to ``h`` (learned) or returned for attention (rotary)."""
        ...

    def qkv(self, layer: int, h: torch.Tensor, placed: Any) -> tuple[torch.Tensor, ...]: ...

    def attn_out(self, layer: int, o: torch.Tensor) -> torch.Tensor: ...

    def mlp(self, layer: int, h: torch.Tensor) -> torch.Tensor: ...

    def scaling(self, layer: int) -> float: ...

    def logits(self, h: torch.Tensor) -> torch.Tensor: ...


def _heads(x: torch.Tensor, n: int, d: int) -> torch.Tensor:  # [B, 1, n*d] -> [B, n, 1, d]
    return x.view(x.shape[0], 1, n, d).transpose(1, 2)


class GPT2:
    """GPT-2: learned positions, LayerNorm, fused QKV (Conv1D), GELU MLP."""

    def __init__(self, model: nn.Module) -> None:
        self.body = part(model, "transformer")
        self.blocks = [plain(b) for b in self.body.h]
        self.attns = [part(b, "attn") for b in self.blocks]
        self.lm_head = part(model, "lm_head")
        attn = self.attns[0]
        self.n_layers, self.head_dim = len(self.blocks), attn.head_dim
        self.n_kv_heads = attn.num_heads
        self.width = attn.split_size

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, part(self.body, "wte").weight)

    def place(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return h + F.embedding(positions, part(self.body, "wpe").weight), None

    def qkv(self, layer: int, h: torch.Tensor, placed: Any) -> tuple[torch.Tensor, ...]:
        x = part(self.blocks[layer], "ln_1")(h)
        q, k, v = part(self.attns[layer], "c_attn")(x).split(self.width, dim=2)
        n, d = self.n_kv_heads, self.head_dim
        return _heads(q, n, d), _heads(k, n, d), _heads(v, n, d)

    def attn_out(self, layer: int, o: torch.Tensor) -> torch.Tensor:
        return part(self.attns[layer], "c_proj")(o)

    def mlp(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        block = self.blocks[layer]
        mlp = part(block, "mlp")
        x = part(block, "ln_2")(h)
        return part(mlp, "c_proj")(part(mlp, "act")(part(mlp, "c_fc")(x)))

    def scaling(self, layer: int) -> float:
        return float(self.attns[layer].scaling)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(part(self.body, "ln_f")(h))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Llama:
    """Llama and its close kin (Mistral, Qwen2): RMSNorm, rotary positions, gated MLP."""

    def __init__(self, model: nn.Module) -> None:
        self.body = part(model, "model")
        self.blocks = [plain(b) for b in self.body.layers]
        self.attns = [part(b, "self_attn") for b in self.blocks]
        self.lm_head = part(model, "lm_head")
        config = model.config.get_text_config()  # type: ignore[operator]
        self.n_layers, self.head_dim = len(self.blocks), self.attns[0].head_dim
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, part(self.body, "embed_tokens").weight)

    def place(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, Any]:
        cos, sin = part(self.body, "rotary_emb")(h, positions)  # [B, 1, head_dim] each
        return h, (cos[:, None], sin[:, None])

    def qkv(self, layer: int, h: torch.Tensor, placed: Any) -> tuple[torch.Tensor, ...]:
        attn, d = self.attns[layer], self.head_dim
        x = part(self.blocks[layer], "input_layernorm")(h)
        q = _heads(part(attn, "q_proj")(x), self.n_heads, d)
        k = _heads(part(attn, "k_proj")(x), self.n_kv_heads, d)
        v = _heads(part(attn, "v_proj")(x), self.n_kv_heads, d)
        cos, sin = placed
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def attn_out(self, layer: int, o: torch.Tensor) -> torch.Tensor:
        return part(self.attns[layer], "o_proj")(o)

    def mlp(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        block = self.blocks[layer]
        mlp = part(block, "mlp")
        x = part(block, "post_attention_layernorm")(h)
        gate = part(mlp, "act_fn")(part(mlp, "gate_proj")(x))
        return part(mlp, "down_proj")(gate * part(mlp, "up_proj")(x))

    def scaling(self, layer: int) -> float:
        return float(self.attns[layer].scaling)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(part(self.body, "norm")(h))


FAMILIES: dict[str, type] = {"gpt2": GPT2, "llama": Llama, "mistral": Llama, "qwen2": Llama}


def hf_model_of(backend: Any) -> nn.Module | None:
    """The HF causal LM under an hf or bridge backend (None for other backends)."""
    if backend.kind == "hf":
        return backend.model
    if backend.kind == "bridge":
        return getattr(backend.model, "original_model", None)
    return None


def family_reason(model: nn.Module, length: int) -> str | None:
    """Why the compiled step cannot run ``model`` for ``length`` positions, or None."""
    config = model.config.get_text_config()  # type: ignore[operator]
    kind = config.model_type
    if kind not in FAMILIES:
        return f"model_type {kind!r} has no compiled step (have: {', '.join(sorted(FAMILIES))})"
    if kind == "gpt2" and (config.reorder_and_upcast_attn or config.add_cross_attention):
        return "GPT-2 with reorder_and_upcast_attn or cross-attention"
    if kind != "gpt2" and getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) and length > window:
        return f"sliding-window attention ({window}) over {length} positions"
    return None
