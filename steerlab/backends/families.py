"""What steerlab knows about each HuggingFace ``model_type``: one record per family.

Every part of steerlab that depends on the architecture reads its own field of the
family's ``FamilyFacts``, so one row of ``FACTS`` answers "what does steerlab know about
model_type X":

- ``hf``: where the HF backend hooks the canonical sites (``Layout``; ``hf.py``);
- ``hooked``: how ``backend="hooked"`` converts the config (``Conversion``; ``convert.py``);
- ``vllm``: where the sites live in vLLM's own model classes (``VLLMLayout``; ``engine/vllm``);
- ``step``: the name of the compiled decode step's class; the classes are engine code and
  live in ``engine/compiled/families.py``, keyed by that name;
- ``plain_head``: the logits are exactly ``lm_head`` of the final hidden state (``head.py``).

A part asks ``lookup(model_type, part)`` and gets its field, or a ``FamilyError`` that
names the families it has. A new family is a row here (and a step class, for a new step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, Literal, TypeVar

from steerlab.backends import hooked_config
from steerlab.backends.hooked_config import Conversion
from steerlab.core.errors import FamilyError

T = TypeVar("T")


@dataclass(frozen=True)
class Layout:
    """How one architecture family writes to its residual stream, in HF's modules.

    Attributes:
        blocks: dotted path to the list of decoder blocks.
        attn: block submodule whose output is added to the stream after attention
            (for Gemma 2/3 and OLMo 2 that is the norm after the attention).
        mlp: the same for the MLP (OPT has no MLP module: its last linear, ``fc2``).
        parallel: True, or config flags any of which make attention and MLP both read
            the block input. Such blocks have no ``hook_resid_mid``.
        flat_mlp: the MLP runs on ``[batch * pos, d_model]`` rather than ``[batch, pos, d_model]``.
        embed_scale: config attribute the model multiplies the token embeddings by.
        residual_scale: config attribute the model multiplies each sublayer output by
            before adding it to the stream (Granite).
        unsupported: given the config, names a variant the row does not cover, or None.
    """

    blocks: str = "model.layers"
    attn: str = "self_attn"
    mlp: str = "mlp"
    parallel: bool | tuple[str, ...] = False
    flat_mlp: bool = False
    embed_scale: str | None = None
    residual_scale: str | None = None
    unsupported: Callable[[Any], str | None] | None = None

    def is_parallel(self, config: Any) -> bool:
        if isinstance(self.parallel, bool):
            return self.parallel
        return any(getattr(config, flag, False) for flag in self.parallel)


@dataclass(frozen=True)
class VLLMLayout:
    """Dotted paths inside a vLLM model for one family (``engine/vllm/sites.py`` explains
    the two forms).

    Attributes:
        blocks: the list of decoder layers.
        embed: the token embedding (its output is ``hook_embed``).
        attn: the attention submodule of a block (its output is ``hook_attn_out``).
        mlp: the MLP submodule of a block (its output is ``hook_mlp_out``).
        mid_norm: the norm that takes ``(attn_out, residual)`` in the ``pair`` form.
        form: ``"full"`` (a block returns the whole stream) or ``"pair"`` (``(delta, residual)``).
    """

    blocks: str
    embed: str
    attn: str
    mlp: str
    mid_norm: str | None
    form: Literal["full", "pair"]


@dataclass(frozen=True)
class FamilyFacts:
    """Everything steerlab knows about one HF ``model_type``; None where a part lacks it.

    Attributes:
        hf: the HF backend's hook table row.
        hooked: how ``backend="hooked"`` converts the config and weights.
        vllm: where the canonical sites live in vLLM's model classes.
        step: the compiled decode step's class name (a key of the compiled ``STEPS``).
        plain_head: the logits are exactly ``lm_head(final hidden state)``: no logit
            scaling or soft-capping. The compiled step computes logits so, hence needs it.
    """

    hf: Layout | None = None
    hooked: Conversion | None = None
    vllm: VLLMLayout | None = None
    step: str | None = None
    plain_head: bool = False

    def __post_init__(self) -> None:
        if self.step is not None and not self.plain_head:
            raise FamilyError(f"a compiled step ({self.step!r}) needs plain_head=True")


@dataclass(frozen=True)
class Part(Generic[T]):
    """A part of steerlab that reads one field of a family's record.

    Attributes:
        read: the field it reads (None: the family lacks this part).
        refusal: what it says of a family it lacks, with ``{model_type}`` and ``{known}``
            (the families it has, sorted) filled in.
    """

    read: Callable[[FamilyFacts], T | None]
    refusal: str


HF: Part[Layout] = Part(
    lambda facts: facts.hf,
    "steerlab has no hook table for HuggingFace model_type {model_type!r}. "
    "Supported: {known}. Use backend='bridge' for others.",
)
HOOKED: Part[Conversion] = Part(
    lambda facts: facts.hooked,
    "backend='hooked' converts local models of type {known}; this one is {model_type!r}. "
    "Use backend='bridge' (any HF architecture TransformerLens supports) or pass a hub name "
    "TransformerLens knows.",
)
VLLM: Part[VLLMLayout] = Part(
    lambda facts: facts.vllm,
    "steerlab's vLLM engine has no site table for model_type {model_type!r}; it knows "
    "{known}. Use backend='hf' or 'bridge' for this model.",
)
STEP: Part[str] = Part(
    lambda facts: facts.step,
    "model_type {model_type!r} has no compiled step (have: {known})",
)


def _opt_unsupported(config: Any) -> str | None:
    if not config.do_layer_norm_before:
        return "post-norm OPT (do_layer_norm_before=False, as in opt-350m)"
    if config.word_embed_proj_dim != config.hidden_size:
        return "OPT with projected embeddings (word_embed_proj_dim != hidden_size)"
    return None


# Most decoders share Llama's HF layout (``model.layers``, ``self_attn``, ``mlp``).
_LLAMA = Layout()
_LLAMA_LIKE = (
    "mixtral", "qwen2_moe", "qwen3_moe", "gemma", "phi3", "smollm3", "starcoder2", "glm",
    "olmo",
)  # fmt: skip
_POST_NORMS = Layout(attn="post_attention_layernorm", mlp="post_feedforward_layernorm")
_GRANITE = Layout(embed_scale="embedding_multiplier", residual_scale="residual_multiplier")
_H = "transformer.h"
_VLLM_LLAMA = VLLMLayout("model.layers", "model.embed_tokens", "self_attn", "mlp",
                         "post_attention_layernorm", "pair")  # fmt: skip
_VLLM_GPT2 = VLLMLayout("transformer.h", "transformer.wte", "attn", "mlp", None, "full")

FACTS: dict[str, FamilyFacts] = {
    # Families that parts other than the HF backend know too.
    "gpt2": FamilyFacts(
        hf=Layout(blocks=_H, attn="attn"),
        hooked=hooked_config.GPT2,
        vllm=_VLLM_GPT2,
        step="gpt2",
        plain_head=True,
    ),
    "llama": FamilyFacts(
        hf=_LLAMA, hooked=hooked_config.LLAMA, vllm=_VLLM_LLAMA, step="llama", plain_head=True
    ),
    "mistral": FamilyFacts(
        hf=_LLAMA, hooked=hooked_config.MISTRAL, vllm=_VLLM_LLAMA, step="llama", plain_head=True
    ),
    "qwen2": FamilyFacts(hf=_LLAMA, vllm=_VLLM_LLAMA, step="llama", plain_head=True),
    "qwen3": FamilyFacts(hf=_LLAMA, vllm=_VLLM_LLAMA),
    # Families only the HF backend knows.
    **{model_type: FamilyFacts(_LLAMA) for model_type in _LLAMA_LIKE},
    **{
        model_type: FamilyFacts(_POST_NORMS)
        for model_type in ("gemma2", "gemma3_text", "olmo2", "olmo3")
    },
    "glm4": FamilyFacts(Layout(attn="post_self_attn_layernorm", mlp="post_mlp_layernorm")),
    "granite": FamilyFacts(_GRANITE),
    "granitemoe": FamilyFacts(replace(_GRANITE, mlp="block_sparse_moe")),
    "opt": FamilyFacts(
        Layout("model.decoder.layers", mlp="fc2", flat_mlp=True, unsupported=_opt_unsupported)
    ),
    "stablelm": FamilyFacts(Layout(parallel=("use_parallel_residual",))),
    # Parallel blocks: attention and MLP both read the block input.
    "gpt_neox": FamilyFacts(
        Layout("gpt_neox.layers", "attention", parallel=("use_parallel_residual",))
    ),
    "gptj": FamilyFacts(Layout(blocks=_H, attn="attn", parallel=True)),
    "falcon": FamilyFacts(
        Layout(_H, "self_attention", parallel=("parallel_attn", "new_decoder_architecture"))
    ),
    "phi": FamilyFacts(Layout(parallel=True)),
    "cohere": FamilyFacts(Layout(parallel=True)),
    "cohere2": FamilyFacts(Layout(parallel=True)),
}


class _Table(Mapping[str, T]):
    """``part``'s field of every family that has one, read from ``FACTS`` at each use."""

    def __init__(self, part: Part[T]) -> None:
        self.part = part

    def __getitem__(self, model_type: str) -> T:
        value = _field(model_type, self.part)
        if value is None:
            raise KeyError(model_type)
        return value

    def __iter__(self) -> Iterator[str]:
        return (model_type for model_type in list(FACTS) if model_type in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, model_type: object) -> bool:
        return _field(model_type, self.part) is not None


def table(part: Part[T]) -> Mapping[str, T]:
    """``part``'s field of every family that has one, by ``model_type``: a read-only view
    of ``FACTS``, never a copy that could fall out of step with it.

    >>> sorted(table(STEP).items())
    [('gpt2', 'gpt2'), ('llama', 'llama'), ('mistral', 'llama'), ('qwen2', 'llama')]
    """
    return _Table(part)


def _field(model_type: object, part: Part[T]) -> T | None:
    facts = FACTS.get(model_type) if isinstance(model_type, str) else None
    return None if facts is None else part.read(facts)


def _refusal(model_type: str, part: Part[T]) -> str:
    return part.refusal.format(model_type=model_type, known=", ".join(sorted(table(part))))


def refusal(model_type: str, part: Part[T]) -> str | None:
    """Why ``part`` cannot serve ``model_type`` (naming the families it has), or None.

    >>> refusal("gpt2", STEP) is None, refusal("bloom", STEP)
    (True, "model_type 'bloom' has no compiled step (have: gpt2, llama, mistral, qwen2)")
    """
    return None if _field(model_type, part) is not None else _refusal(model_type, part)


def lookup(model_type: str, part: Part[T]) -> T:
    """``part``'s field of ``model_type``'s record, or a ``FamilyError`` saying what it has.

    >>> lookup("qwen2", VLLM).form
    'pair'
    """
    value = _field(model_type, part)
    if value is None:
        raise FamilyError(_refusal(model_type, part))
    return value


def has_plain_head(model_type: str | None) -> bool:
    """Whether ``model_type``'s logits are exactly ``lm_head`` of its final hidden state."""
    facts = FACTS.get(model_type) if isinstance(model_type, str) else None
    return facts is not None and facts.plain_head
