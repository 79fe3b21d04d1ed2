"""An independent reference: plain transformers and torch hooks, written without steerlab.

Greedy decoding one row at a time, recomputing the whole sequence at every step (no KV
cache), with steering hooks on HuggingFace's own GPT-2 and Llama modules. The steering
arithmetic is written out here rather than taken from ``steerlab.core``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class RefSteer:
    site: str  # blocks.L.hook_resid_pre / _mid / _post / _attn_out / _mlp_out, or hook_embed
    vector: torch.Tensor
    alpha: float
    positions: Any = "all"  # "all" | "prompt" | "generated" | int | "first:k+last:k"
    op: str = "add"  # "add" | "ablate" | "clamp" | "cap" | "feature_clamp" | "rotate" | "loreft"
    value: float = 0.0  # the clamp target
    low: float = -float("inf")  # the cap's range
    high: float = float("inf")
    sae: RefSAE | None = None  # feature_clamp: the SAE, and ``index`` the feature
    index: int = 0
    toward: torch.Tensor | None = None  # rotate: the plane's second direction
    angle: float = 0.0  # rotate: the target angle, degrees
    adaptive: bool = False  # rotate: only where the projection on the direction is positive
    reft: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # loreft: R, W, b


@dataclass(frozen=True)
class RefSAE:
    """An SAE's tensors, as SAELens names them, for the feature clamp below."""

    W_enc: torch.Tensor  # [d_in, d_sae]
    b_enc: torch.Tensor  # [d_sae]
    b_dec: torch.Tensor  # [d_in]
    W_dec: torch.Tensor  # [d_sae, d_in]
    architecture: str = "standard"  # "standard" | "jumprelu" | "topk"
    threshold: torch.Tensor | None = None
    k: int = 0


def _features(sae: RefSAE, x: torch.Tensor) -> torch.Tensor:
    """Every feature's activation, computed the SAELens way in full (b_dec applied)."""
    pre = (x.float() - sae.b_dec) @ sae.W_enc + sae.b_enc
    if sae.architecture == "standard":
        return torch.relu(pre)
    if sae.architecture == "jumprelu":
        return torch.where(pre > sae.threshold, torch.relu(pre), torch.zeros_like(pre))
    top = pre.topk(sae.k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, top.indices, torch.relu(top.values))


def _edit(act: torch.Tensor, steer: RefSteer, n_prompt: int) -> torch.Tensor:
    """act [1, seq, d]: the steered activation at every position the steer touches."""
    pos = torch.arange(act.shape[1])
    if steer.positions == "all":
        mask = torch.ones_like(pos, dtype=torch.bool)
    elif steer.positions == "prompt":
        mask = pos < n_prompt
    elif steer.positions == "generated":
        mask = pos >= n_prompt
    elif isinstance(steer.positions, str):  # pyreft's "f3+l3": first and last prompt tokens
        first = last = 0
        for part in steer.positions.split("+"):
            side, k = part.split(":")
            first, last = (int(k), last) if side == "first" else (first, int(k))
        mask = (pos < n_prompt) & ((pos < first) | (pos >= n_prompt - last))
    else:
        mask = pos >= steer.positions
    if steer.op == "loreft":  # h + alpha * R^T (W h + b - R h), as the ReFT paper writes it
        assert steer.reft is not None
        R, W, b = (t.double() for t in steer.reft)
        h = act.double()
        new = (h + steer.alpha * (h @ W.T + b - h @ R.T) @ R).to(act.dtype)
        return torch.where(mask[None, :, None], new, act)
    v = steer.vector.to(act.dtype)
    if steer.op == "feature_clamp":  # set the feature, keep the reconstruction error
        assert steer.sae is not None
        f = _features(steer.sae, act)[..., steer.index]  # [1, seq]
        w = steer.sae.W_dec[steer.index].to(act.dtype)
        new = act + steer.alpha * (steer.value - f).to(act.dtype)[..., None] * w
        return torch.where(mask[None, :, None], new, act)
    if steer.op == "rotate":
        new = _rotated(act, steer)
        return torch.where(mask[None, :, None], new, act)
    if steer.op == "add":
        new = act + steer.alpha * v
    elif steer.op == "cap":  # clip the projection on the unit direction into [low, high]
        unit = v.double() / v.double().norm()
        proj = act.double() @ unit
        clipped = torch.minimum(
            torch.maximum(proj, torch.tensor(steer.low)), torch.tensor(steer.high)
        )
        new = (act.double() + steer.alpha * (clipped - proj)[..., None] * unit).to(act.dtype)
    else:
        unit = v / v.norm()
        proj = act @ unit  # [1, seq]
        target = torch.zeros_like(proj) if steer.op == "ablate" else steer.value - proj
        if steer.op == "ablate":
            new = act - steer.alpha * proj[..., None] * unit
        else:
            new = act + steer.alpha * target[..., None] * unit
    return torch.where(mask[None, :, None], new, act)


def _rotated(act: torch.Tensor, steer: RefSteer) -> torch.Tensor:
    """Angular steering as the issue writes it, in float64: Gram-Schmidt for the plane,
    the in-plane angle from the direction, alpha of the way to the target along the
    shorter arc, the in-plane length kept."""
    assert steer.toward is not None
    b1 = steer.vector.double() / steer.vector.double().norm()
    t = steer.toward.double()
    b2 = t - (t @ b1) * b1
    b2 = b2 / b2.norm()
    h = act.double()
    x, y = h @ b1, h @ b2
    r = torch.sqrt(x * x + y * y)
    phi = torch.atan2(y, x)
    target = steer.angle * torch.pi / 180
    d = target - phi
    d = torch.where(
        d > torch.pi, d - 2 * torch.pi, torch.where(d <= -torch.pi, d + 2 * torch.pi, d)
    )
    new_phi = phi + steer.alpha * d
    new = (
        h
        + (r * torch.cos(new_phi) - x)[..., None] * b1
        + (r * torch.sin(new_phi) - y)[..., None] * b2
    )
    if steer.adaptive:
        new = torch.where((x > 0)[..., None], new, h)
    return new.to(act.dtype)


def _first(out: Any) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out[0]


def _swap(out: Any, new: torch.Tensor) -> Any:
    return new if isinstance(out, torch.Tensor) else (new, *out[1:])


def _install(model: Any, steers: list[RefSteer], n_prompt: int) -> list[Any]:
    family = model.config.model_type
    blocks = model.transformer.h if family == "gpt2" else model.model.layers
    attn_name = "attn" if family == "gpt2" else "self_attn"
    handles = []
    for s in steers:
        if s.site == "hook_embed":
            embed = model.get_input_embeddings()
            handles.append(
                embed.register_forward_hook(lambda _m, _a, out, s=s: _edit(out, s, n_prompt))
            )
            continue
        _, layer, kind = s.site.split(".")
        block = blocks[int(layer)]
        if kind == "hook_resid_pre":

            def pre(_m, args, kwargs, s=s):
                if args:
                    return (_edit(args[0], s, n_prompt), *args[1:]), kwargs
                return args, {
                    **kwargs,
                    "hidden_states": _edit(kwargs["hidden_states"], s, n_prompt),
                }

            handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        elif kind == "hook_resid_post":
            handles.append(
                block.register_forward_hook(
                    lambda _m, _a, out, s=s: _swap(out, _edit(_first(out), s, n_prompt))
                )
            )
        elif kind in ("hook_attn_out", "hook_mlp_out"):
            module = getattr(block, attn_name if kind == "hook_attn_out" else "mlp")
            handles.append(
                module.register_forward_hook(
                    lambda _m, _a, out, s=s: _swap(out, _edit(_first(out), s, n_prompt))
                )
            )
        else:  # resid_mid = block input + attention output: rewrite the attention output
            seen: list[torch.Tensor] = []

            def remember(_m, args, kwargs, seen=seen):
                seen[:] = [args[0] if args else kwargs["hidden_states"]]

            def mid(_m, _a, out, s=s, seen=seen):
                attn = _first(out)
                return _swap(out, _edit(seen[0] + attn, s, n_prompt) - seen[0])

            handles.append(block.register_forward_pre_hook(remember, with_kwargs=True))
            handles.append(getattr(block, attn_name).register_forward_hook(mid))
    return handles


@dataclass(frozen=True)
class RefPenalties:
    """vLLM's logit adjustments, built from HF's logits processors and OpenAI's formula.

    In vLLM's order: HF's ``MinNewTokensLengthLogitsProcessor`` (``eos`` banned before
    ``min_tokens`` new tokens), ``SequenceBiasLogitsProcessor`` with one-token sequences,
    ``RepetitionPenaltyLogitsProcessor`` over prompt and output (as vLLM counts them), then
    ``logit[t] -= frequency * count(t) + presence`` for every token t of the output.
    """

    repetition: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0
    bias: tuple[tuple[int, float], ...] = ()
    min_tokens: int = 0
    eos: tuple[int, ...] = ()

    def __call__(self, logits: torch.Tensor, prompt: list[int], output: list[int]) -> torch.Tensor:
        """logits [vocab] for the next token after ``prompt + output``, adjusted."""
        from transformers import (
            MinNewTokensLengthLogitsProcessor,
            RepetitionPenaltyLogitsProcessor,
            SequenceBiasLogitsProcessor,
        )

        ids = torch.tensor([prompt + output])
        scores = logits.float()[None].clone()  # [1, vocab]
        if self.min_tokens:
            ban = MinNewTokensLengthLogitsProcessor(len(prompt), self.min_tokens, list(self.eos))
            scores = ban(ids, scores)
        if self.bias:
            scores = SequenceBiasLogitsProcessor([[[t], b] for t, b in self.bias])(ids, scores)
        if self.repetition != 1.0:
            scores = RepetitionPenaltyLogitsProcessor(self.repetition)(ids, scores)
        for token in set(output):
            scores[0, token] -= self.frequency * output.count(token) + self.presence
        return scores[0]


@torch.inference_mode()
def greedy(
    model: Any,
    prompt: list[int],
    steers: list[RefSteer],
    max_new_tokens: int,
    eos: set[int],
    penalties: RefPenalties | None = None,
) -> list[int]:
    """Greedy tokens for one row, hooks on for every forward, EOS not included."""
    ids, out = list(prompt), []
    handles = _install(model, steers, len(prompt))
    try:
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            if penalties is not None:
                logits = penalties(logits, list(prompt), out)
            token = int(logits.argmax())
            if token in eos:
                break
            out.append(token)
            ids.append(token)
    finally:
        for h in handles:
            h.remove()
    return out


def peaky_folder(path: Any, family: str, seed: int) -> Any:
    """Test models, not reference arithmetic (so ``steerlab.testing`` may build them): a tiny
    random ``family`` model (4 layers, d_model 128) and the char tokenizer saved
    in ``path``; weights scaled up for peakier logits, so greedy ties are rare."""
    from steerlab.testing import char_tokenizer, tiny_model

    model = tiny_model(family, n_layers=4, d_model=128, seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(4.0)
    model.save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path


@torch.inference_mode()
def logprobs(model: Any, ids: list[int], steers: list[RefSteer]) -> torch.Tensor:
    """[len(ids), vocab] log-probabilities of one row in one forward, hooks on throughout."""
    handles = _install(model, steers, len(ids))
    try:
        return model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    finally:
        for h in handles:
            h.remove()


@dataclass(frozen=True)
class RefCast:
    """CAST as IBM's ``activation-steering`` computes it: the condition reads the input of
    block ``condition_layer`` on the first forward (the prompt), averaged over the prompt's
    tokens (``mode="mean"``) or its last token; ``P = c cᵀ / (c·c)`` and the score is
    ``cos(h, tanh(P h))``. Once fired, ``alpha·v`` is added to the input of block
    ``behaviour_layer`` on the tokens after the prompt (their later steps)."""

    condition_layer: int
    condition: torch.Tensor
    threshold: float
    compare: str  # "above": fires when the score > threshold; "below": when <
    behaviour_layer: int
    vector: torch.Tensor
    alpha: float
    mode: str = "mean"


@torch.inference_mode()
def cast_greedy(model: Any, prompt: list[int], cast: RefCast, max_new_tokens: int,
                eos: set[int]) -> tuple[list[int], bool, float]:  # fmt: skip
    """Greedy tokens for one row at batch 1 (as IBM's library runs), and the decision and
    score it was made on. The whole sequence is recomputed at every step."""
    family = model.config.model_type
    blocks = model.transformer.h if family == "gpt2" else model.model.layers
    state: dict[str, Any] = {}
    n_prompt = len(prompt)

    def hidden(args: tuple, kwargs: dict) -> torch.Tensor:
        return args[0] if args else kwargs["hidden_states"]

    def condition(_m: Any, args: tuple, kwargs: dict) -> None:
        if "fired" in state:  # decided once, on the first forward
            return
        h = hidden(args, kwargs)[0].float()  # [seq, d]
        h = h.mean(0) if cast.mode == "mean" else h[-1]
        c = cast.condition.float()
        projected = torch.tanh((c @ h) / (c @ c) * c)
        score = float(torch.nn.functional.cosine_similarity(h, projected, dim=0))
        state["score"] = score
        state["fired"] = score > cast.threshold if cast.compare == "above" else (
            score < cast.threshold)  # fmt: skip

    def behaviour(_m: Any, args: tuple, kwargs: dict) -> Any:
        h = hidden(args, kwargs)
        if not state.get("fired") or h.shape[1] <= n_prompt:
            return None
        h = h.clone()
        h[:, n_prompt:] += cast.alpha * cast.vector.to(h.dtype)
        if args:
            return (h, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": h}

    handles = [
        blocks[cast.condition_layer].register_forward_pre_hook(condition, with_kwargs=True),
        blocks[cast.behaviour_layer].register_forward_pre_hook(behaviour, with_kwargs=True),
    ]
    ids, out = list(prompt), []
    try:
        for _ in range(max_new_tokens):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            if token in eos:
                break
            out.append(token)
            ids.append(token)
    finally:
        for h in handles:
            h.remove()
    return out, bool(state["fired"]), state["score"]


@torch.inference_mode()
def projections(model: Any, ids: list[int], layer: int, vector: torch.Tensor) -> torch.Tensor:
    """``h·v/|v|`` at the output of block ``layer`` (resid_post) for every token of ``ids``,
    read from HF's own hidden states: ``[len(ids)]``."""
    out = model(torch.tensor([ids]), output_hidden_states=True)
    h = out.hidden_states[layer + 1][0].float()
    if layer + 1 == len(out.hidden_states) - 1 and model.config.model_type == "gpt2":
        raise ValueError("GPT-2's last hidden state is after ln_f: read an earlier layer")
    return h @ (vector.float() / vector.float().norm())
