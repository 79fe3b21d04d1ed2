"""One parity suite that every engine runs (eager, compiled here; vLLM in tests_vllm).

Each case steers steerlab-tiny through the engine under test and through ``reference.greedy``
(plain transformers with torch hooks, written without steerlab): every position rule, every
operation of ``core/ops/`` (Cap included), rows with different steers in one batch, and
the context window at its edge. A disagreement between engines fails here, on each of them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import pytest
import torch
from reference import RefPenalties, RefSAE, RefSteer, greedy

import steerlab as sl
from steerlab.core.errors import ContextError
from steerlab.engine import Request, Sampling, Steer

PROMPTS = ["Once upon a time", "The happy fox"]
NEW = 8


def direction(seed: int, d_model: int = 128) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(d_model, generator=generator)


@functools.cache
def toy_sae(architecture: str) -> sl.SAE:
    """The toy SAE (standard), or its weights read as a jumprelu or topk SAE."""
    sae = sl.load_sae("steerlab-tiny-sae")
    if architecture == "jumprelu":
        threshold = torch.full((sae.d_sae,), 0.4, dtype=sae.dtype)
        return replace(sae, architecture="jumprelu", threshold=threshold)
    if architecture == "topk":
        return replace(sae, architecture="topk", k=12)
    return sae


def ref_sae(sae: sl.SAE) -> RefSAE:
    return RefSAE(sae.W_enc, sae.b_enc, sae.b_dec, sae.W_dec, sae.architecture, sae.threshold,
                  sae.k or 0)  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One steer, as steerlab builds it and as the reference applies it."""

    site: str
    op: str
    alpha: float
    positions: Any = "all"
    value: float = 0.0
    low: float | None = None
    high: float | None = None
    seed: int = 0
    sae: str = ""  # a feature of the toy SAE read as this architecture; ``seed`` is its index
    angle: float = 0.0  # rotate: target angle (degrees), in the plane of the vector and
    adaptive: bool = False  # ``direction(seed + 100)``

    def vector(self) -> torch.Tensor:
        if self.op == "loreft":  # a LoReFT steer's vector is R's first row
            return self.reft()[0][0]
        return toy_sae(self.sae).W_dec[self.seed] if self.sae else direction(self.seed)

    def steerlab_op(self) -> Any:
        if self.op == "feature_clamp":
            return toy_sae(self.sae).clamp(self.seed, self.value).op
        if self.op == "cap":
            return sl.Cap(self.low, self.high)
        if self.op == "clamp":
            return sl.Clamp(self.value)
        if self.op == "rotate":
            return sl.Rotate(self.angle, self.toward(), adaptive=self.adaptive)
        if self.op == "loreft":
            return sl.LoReFT(self.site, *self.reft(), positions=self.positions)
        return {"add": sl.Add(), "ablate": sl.Ablate()}[self.op]

    def reft(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A rank-4 LoReFT's R (orthonormal rows), W and b, from the case's seed."""
        generator = torch.Generator().manual_seed(self.seed)
        R = torch.linalg.qr(torch.randn(128, 4, generator=generator))[0].T.contiguous()
        W = 0.3 * torch.randn(4, 128, generator=generator)
        return R, W, 8.0 * torch.randn(4, generator=generator)

    def toward(self) -> torch.Tensor:
        return direction(self.seed + 100)

    def row_steer(self) -> Steer:
        return Steer(self.site, self.vector(), self.alpha, self.positions,
                        self.steerlab_op())  # fmt: skip

    def ref(self) -> RefSteer:
        low = -float("inf") if self.low is None else self.low
        high = float("inf") if self.high is None else self.high
        sae = ref_sae(toy_sae(self.sae)) if self.op == "feature_clamp" else None
        toward = self.toward() if self.op == "rotate" else None
        reft = self.reft() if self.op == "loreft" else None
        return RefSteer(self.site, self.vector(), self.alpha, self.positions, self.op,
                        self.value, low, high, sae, self.seed, toward, self.angle,
                        self.adaptive, reft)  # fmt: skip


CASES = {
    "add-all": Case("blocks.1.hook_resid_pre", "add", 6.0, "all"),
    "add-prompt": Case("blocks.2.hook_resid_post", "add", 6.0, "prompt", seed=1),
    "add-generated": Case("blocks.1.hook_resid_mid", "add", 8.0, "generated", seed=2),
    "add-from-k": Case("blocks.0.hook_attn_out", "add", 8.0, 3, seed=3),
    "ablate-generated": Case("blocks.2.hook_mlp_out", "ablate", 1.0, "generated", seed=4),
    "clamp-all": Case("blocks.1.hook_resid_post", "clamp", 1.0, "all", value=6.0, seed=5),
    "cap-high": Case("blocks.2.hook_resid_pre", "cap", 1.0, "all", high=-2.0, seed=6),
    "cap-range-half": Case("blocks.1.hook_resid_pre", "cap", 0.5, 4, low=1.0, high=1.5, seed=7),
    "cap-embed": Case("hook_embed", "cap", 1.0, "generated", low=0.5, seed=8),
    "rotate-all": Case("blocks.2.hook_resid_pre", "rotate", 1.0, "all", angle=150.0, seed=9),
    "rotate-adaptive-half": Case(
        "blocks.1.hook_resid_post", "rotate", 0.5, "generated", angle=60.0, adaptive=True, seed=10
    ),  # fmt: skip
    # spans of the prompt (pyreft's "f3+l3"), for any operation
    "add-span": Case("blocks.1.hook_resid_pre", "add", 8.0, "first:2+last:2", seed=11),
    "cap-last": Case("blocks.2.hook_resid_post", "cap", 1.0, "last:3", high=-3.0, seed=12),
    # LoReFT at every site kind, on every kind of position rule
    "loreft-span": Case("blocks.2.hook_resid_post", "loreft", 1.0, "first:3+last:3", seed=13),
    "loreft-all": Case("blocks.1.hook_resid_mid", "loreft", 1.0, "all", seed=14),
    "loreft-generated-half": Case("blocks.0.hook_attn_out", "loreft", 0.5, "generated", seed=15),
    "loreft-last": Case("blocks.2.hook_mlp_out", "loreft", 1.0, "last:2", seed=16),
    "loreft-embed": Case("hook_embed", "loreft", 1.0, "first:1", seed=17),
    "loreft-from-k": Case("blocks.2.hook_resid_pre", "loreft", 1.0, 3, seed=18),
    # SAE features (the toy SAE reads blocks.2.hook_resid_pre; 499 tracks positive sentiment)
    "feature-add": Case("blocks.2.hook_resid_pre", "add", 8.0, "all", seed=499, sae="standard"),
    "feature-clamp-standard": Case(
        "blocks.2.hook_resid_pre", "feature_clamp", 1.0, "all", value=10.0, seed=499, sae="standard"
    ),  # fmt: skip
    "feature-clamp-standard-low": Case(
        "blocks.2.hook_resid_pre",
        "feature_clamp",
        1.0,
        "prompt",
        value=-4.0,
        seed=499,
        sae="standard",
    ),  # fmt: skip
    "feature-clamp-jumprelu": Case(
        "blocks.2.hook_resid_pre",
        "feature_clamp",
        1.0,
        "generated",
        value=8.0,
        seed=499,
        sae="jumprelu",
    ),  # fmt: skip
    "feature-clamp-topk": Case(
        "blocks.2.hook_resid_pre", "feature_clamp", 0.5, 2, value=12.0, seed=499, sae="topk"
    ),  # fmt: skip
}


def prompt_ids(lm: sl.SteerableModel, text: str) -> tuple[int, ...]:
    return tuple(lm.tokenizer(text)["input_ids"])


def sampling(new: int = NEW) -> Sampling:
    return Sampling(max_new_tokens=new, stop_at_eos=False)


def check_case(lm: sl.SteerableModel, hf: Any, name: str) -> None:
    """Both prompts with the case's steer, in one batch, each equal to the reference."""
    case = CASES[name]
    requests = [Request(prompt_ids(lm, p), (case.row_steer(),), sampling(), stream=p)
                for p in PROMPTS]  # fmt: skip
    got = [c.tokens for c in lm.engine.run(requests)]
    want = [greedy(hf, list(r.prompt), [case.ref()], NEW, set()) for r in requests]
    assert got == want, name
    assert lm.hook_count() == 0


def check_mixed_rows(lm: sl.SteerableModel, hf: Any) -> None:
    """Rows with different steers, ops and positions in one batch, each equal to the
    reference with its own steers (two steers at two sites on one row too)."""
    rows = [
        ("Once upon a time", ["add-all"]),
        ("The happy fox", ["cap-high", "add-generated"]),
        ("Once upon a time", []),
        ("A dark forest", ["clamp-all"]),
        ("The happy fox", ["ablate-generated", "add-from-k"]),
        ("A dark forest", ["loreft-span", "add-generated"]),
        ("The happy fox", ["add-span"]),
    ]
    requests = [Request(prompt_ids(lm, p), tuple(CASES[n].row_steer() for n in names),
                        sampling(), stream=f"{i}")  # fmt: skip
                for i, (p, names) in enumerate(rows)]  # fmt: skip
    got = [c.tokens for c in lm.engine.run(requests)]
    want = [greedy(hf, prompt_ids(lm, p), [CASES[n].ref() for n in names], NEW, set())
            for p, names in rows]  # fmt: skip
    assert got == want
    assert lm.hook_count() == 0


def check_feature_rows(lm: sl.SteerableModel, hf: Any) -> None:
    """Feature clamps of three architectures beside vector steers and an unsteered row, in
    one batch, each equal to the reference (the same feature clamped on two rows with two
    values too)."""
    rows = [
        ("Once upon a time", ["feature-clamp-standard"]),
        ("The happy fox", ["feature-clamp-topk", "add-all"]),
        ("A dark forest", []),
        ("The happy fox", ["feature-clamp-jumprelu"]),
        ("A dark forest", ["feature-clamp-standard-low"]),
    ]
    requests = [Request(prompt_ids(lm, p), tuple(CASES[n].row_steer() for n in names),
                        sampling(), stream=f"{i}")  # fmt: skip
                for i, (p, names) in enumerate(rows)]  # fmt: skip
    got = [c.tokens for c in lm.engine.run(requests)]
    want = [greedy(hf, prompt_ids(lm, p), [CASES[n].ref() for n in names], NEW, set())
            for p, names in rows]  # fmt: skip
    assert got == want
    assert lm.hook_count() == 0


def check_context_edge(lm: sl.SteerableModel, hf: Any) -> None:
    """A call that ends exactly at the context window runs; one token more is refused
    before any compute, with the core's ContextError."""
    n_ctx = lm.n_ctx
    assert n_ctx is not None
    ids = prompt_ids(lm, "Once upon a time")
    fill = n_ctx - len(ids)  # prompt + new tokens = the window exactly
    request = Request(ids, (CASES["add-all"].row_steer(),), sampling(fill), stream="edge")
    (got,) = lm.engine.run([request])
    assert got.tokens == greedy(hf, list(ids), [CASES["add-all"].ref()], fill, set())
    too_long = Request(ids, (), sampling(n_ctx - len(ids) + 1), stream="over")
    with pytest.raises(ContextError, match="context window"):
        lm.engine.run([too_long])
    assert lm.hook_count() == 0


# EOS comes 23 tokens into this prompt's greedy completion: min_tokens has something to do.
ENDS_EARLY = ("Once upon a time, there was a little cat called Finn. The sea was lovely and full "
              "of joy. The sail was bright, and Lily laughed.")  # fmt: skip
PENALTIES = [  # prompt, steer case or "", steerlab's settings
    ("Once upon a time", "", {"repetition_penalty": 1.5}),
    ("The happy fox", "", {"frequency_penalty": 1.0, "presence_penalty": 0.5}),
    ("A dark forest", "", {"presence_penalty": 2.0}),
    ("Once upon a time", "", {"frequency_penalty": -0.8, "repetition_penalty": 0.8}),
    ("Once upon a time", "", {"logit_bias": ((17, -100.0), (262, 4.0))}),
    (ENDS_EARLY, "", {"min_tokens": 28}),
    (ENDS_EARLY, "", {}),
    (
        "The happy fox",
        "add-all",
        {"repetition_penalty": 1.3, "presence_penalty": 1.0, "logit_bias": ((19, 3.0),)},
    ),
]


def penalty_requests(lm: sl.SteerableModel, new: int = 30) -> list[Request]:
    """``PENALTIES`` as one batch of requests (each row its own settings)."""
    return [Request(prompt_ids(lm, p), (CASES[case].row_steer(),) if case else (),
                    Sampling(max_new_tokens=new, **settings), stream=f"{i}")
            for i, (p, case, settings) in enumerate(PENALTIES)]  # fmt: skip


def check_penalties(lm: sl.SteerableModel, hf: Any, new: int = 30) -> None:
    """Rows with penalties, logit_bias and min_tokens (one steered too) in one batch, each
    equal to the reference that applies them with HF's logits processors; EOS ends rows."""
    eos = lm.eos_ids
    got = [c.tokens for c in lm.engine.run(penalty_requests(lm, new))]
    want = []
    for p, case, settings in PENALTIES:
        ref = RefPenalties(settings.get("repetition_penalty", 1.0),
                           settings.get("frequency_penalty", 0.0),
                           settings.get("presence_penalty", 0.0), settings.get("logit_bias", ()),
                           settings.get("min_tokens", 0), tuple(eos))  # fmt: skip
        steers = [CASES[case].ref()] if case else []
        want.append(greedy(hf, list(prompt_ids(lm, p)), steers, new, eos, ref))
    assert got == want
    assert len(got[5]) >= 28 > len(got[6])  # min_tokens held EOS back past where it came
    assert lm.hook_count() == 0
