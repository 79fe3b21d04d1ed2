"""The decode step's model code, written out per family over the HF model's own weights.

The compiled step calls only leaf modules (linear layers, norms, the rotary table) and
never a module steerlab hooks (embeddings, blocks, attention, MLP), so no hook is traced
and a steer's data can change without touching the graph. A TransformerBridge replaces
the HF model's modules with bridge components; ``plain`` unwraps them to the originals.
A new step is a class here, named in ``STEPS``; a family uses it by that name in its
record's ``step`` field (``backends/families.py``).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from steerlab.backends.families import STEP, lookup, refusal
from steerlab.backends.head import unembed


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

    @staticmethod
    def unsupported(config: Any) -> str | None:
        """A variant of the family this step does not write out, or None."""
        if config.reorder_and_upcast_attn or config.add_cross_attention:
            return "GPT-2 with reorder_and_upcast_attn or cross-attention"
        return None

    def __init__(self, model: nn.Module) -> None:
        body = part(model, "transformer")
        blocks = [plain(b) for b in body.h]
        self.wte, self.wpe = part(body, "wte").weight, part(body, "wpe").weight
        self.ln_f, self.lm_head = part(body, "ln_f"), part(model, "lm_head")
        # Every module the step calls, resolved now: the step itself only indexes lists.
        self.ln_1 = [part(b, "ln_1") for b in blocks]
        self.ln_2 = [part(b, "ln_2") for b in blocks]
        self.c_attn = [part(b, "attn.c_attn") for b in blocks]
        self.attn_proj = [part(b, "attn.c_proj") for b in blocks]
        self.c_fc = [part(b, "mlp.c_fc") for b in blocks]
        self.act = [part(b, "mlp.act") for b in blocks]
        self.mlp_proj = [part(b, "mlp.c_proj") for b in blocks]
        attns = [part(b, "attn") for b in blocks]
        self.scales = [float(a.scaling) for a in attns]
        self.n_layers, self.head_dim = len(blocks), attns[0].head_dim
        self.n_kv_heads, self.width = attns[0].num_heads, attns[0].split_size

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.wte)

    def place(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return h + F.embedding(positions, self.wpe), None

    def qkv(self, layer: int, h: torch.Tensor, placed: Any) -> tuple[torch.Tensor, ...]:
        q, k, v = self.c_attn[layer](self.ln_1[layer](h)).split(self.width, dim=2)
        n, d = self.n_kv_heads, self.head_dim
        return _heads(q, n, d), _heads(k, n, d), _heads(v, n, d)

    def attn_out(self, layer: int, o: torch.Tensor) -> torch.Tensor:
        return self.attn_proj[layer](o)

    def mlp(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        x = self.ln_2[layer](h)
        return self.mlp_proj[layer](self.act[layer](self.c_fc[layer](x)))

    def scaling(self, layer: int) -> float:
        return self.scales[layer]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return unembed(self.lm_head, self.ln_f(h))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Llama:
    """Llama and its close kin (Mistral, Qwen2): RMSNorm, rotary positions, gated MLP."""

    @staticmethod
    def unsupported(config: Any) -> str | None:
        """A variant of the family this step does not write out, or None."""
        return "pretraining_tp > 1" if getattr(config, "pretraining_tp", 1) != 1 else None

    def __init__(self, model: nn.Module) -> None:
        body = part(model, "model")
        blocks = [plain(b) for b in body.layers]
        self.embed_tokens = part(body, "embed_tokens").weight
        self.rotary, self.norm = part(body, "rotary_emb"), part(body, "norm")
        self.lm_head = part(model, "lm_head")
        self.ln_1 = [part(b, "input_layernorm") for b in blocks]
        self.ln_2 = [part(b, "post_attention_layernorm") for b in blocks]
        self.q = [part(b, "self_attn.q_proj") for b in blocks]
        self.k = [part(b, "self_attn.k_proj") for b in blocks]
        self.v = [part(b, "self_attn.v_proj") for b in blocks]
        self.o = [part(b, "self_attn.o_proj") for b in blocks]
        self.gate = [part(b, "mlp.gate_proj") for b in blocks]
        self.up = [part(b, "mlp.up_proj") for b in blocks]
        self.down = [part(b, "mlp.down_proj") for b in blocks]
        self.act = [part(b, "mlp.act_fn") for b in blocks]
        attns = [part(b, "self_attn") for b in blocks]
        self.scales = [float(a.scaling) for a in attns]
        config = model.config.get_text_config()  # type: ignore[union-attr,operator]
        self.n_layers, self.head_dim = len(blocks), attns[0].head_dim
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.embed_tokens)

    def place(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, Any]:
        cos, sin = self.rotary(h, positions)  # [B, 1, head_dim] each
        return h, (cos[:, None], sin[:, None])

    def qkv(self, layer: int, h: torch.Tensor, placed: Any) -> tuple[torch.Tensor, ...]:
        x, d = self.ln_1[layer](h), self.head_dim
        q = _heads(self.q[layer](x), self.n_heads, d)
        k = _heads(self.k[layer](x), self.n_kv_heads, d)
        v = _heads(self.v[layer](x), self.n_kv_heads, d)
        cos, sin = placed
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        return q, k, v

    def attn_out(self, layer: int, o: torch.Tensor) -> torch.Tensor:
        return self.o[layer](o)

    def mlp(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        x = self.ln_2[layer](h)
        return self.down[layer](self.act[layer](self.gate[layer](x)) * self.up[layer](x))

    def scaling(self, layer: int) -> float:
        return self.scales[layer]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return unembed(self.lm_head, self.norm(h))


# The step classes by name; which families use which is each one's ``step`` field in
# ``backends/families.py``.
STEPS: dict[str, type[GPT2] | type[Llama]] = {"gpt2": GPT2, "llama": Llama}


def step_class(config: Any) -> type[GPT2] | type[Llama]:
    """The compiled step's class for an HF text config (``FamilyError`` for a family
    without one; ``family_reason`` says so first)."""
    return STEPS[lookup(config.model_type, STEP)]


def hf_model_of(backend: Any) -> Any:
    """The HF causal LM under an hf or bridge backend (None for other backends)."""
    if backend.kind == "hf":
        return backend.model
    if backend.kind == "bridge":
        return getattr(backend.model, "original_model", None)
    return None


def family_reason(model: nn.Module, length: int) -> str | None:
    """Why the compiled step cannot run ``model`` for ``length`` positions, or None."""
    config = model.config.get_text_config()  # type: ignore[union-attr,operator]
    why = refusal(config.model_type, STEP) or step_class(config).unsupported(config)
    if why is not None:
        return why
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True) and length > window:
        return f"sliding-window attention ({window}) over {length} positions"
    return None
