"""The decode loop: prefill once, then one token per step through the KV cache.

Steering is not in here: hooks attached around the loop see every forward pass,
and the loop only keeps ``TokenLayout`` up to date for them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from steerlab.backends.base import Backend
from steerlab.generation.prompts import Batch, token_positions
from steerlab.generation.result import Generation, Step
from steerlab.generation.sampling import sample_next
from steerlab.intervene import Recorder, TokenLayout


@dataclass(frozen=True)
class DecodeConfig:
    """How to decode; checked on construction, so bad values fail before any compute."""

    max_new_tokens: int = 40
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int | None = None
    stop_at_eos: bool = True
    stop: tuple[str, ...] = ()
    use_cache: bool = True

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_new_tokens, bool)
            or not isinstance(self.max_new_tokens, int)
            or (self.max_new_tokens < 1)
        ):
            raise ValueError(f"max_new_tokens must be an int >= 1; got {self.max_new_tokens!r}.")
        t = self.temperature
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0; got {t!r}.")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p!r}.")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be None or an int >= 1; got {self.top_k!r}.")


class _Builder:
    """Accumulates new tokens per row and turns them into a ``Generation``."""

    def __init__(self, tokenizer: Any, batch: Batch, meta: dict[str, Any], stop: list[str]):
        self.tokenizer = tokenizer
        self.meta = meta
        self.stop = stop
        rows = batch.input_ids.shape[0]
        self.prompt_tokens = [
            ids[mask.bool()].tolist() for ids, mask in zip(batch.input_ids, batch.attention_mask)
        ]
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.logprobs: list[list[float]] = [[] for _ in range(rows)]
        self.reasons = ["length"] * rows
        self.done = [False] * rows
        self.recorder: Recorder | None = None

    def text(self, row: int) -> str:
        text = self.tokenizer.decode(self.tokens[row], skip_special_tokens=True)
        if self.reasons[row] == "stop":
            cut = min((text.find(s) for s in self.stop if s in text), default=len(text))
            text = text[:cut]
        return text

    def texts(self) -> list[str]:
        return [self.text(r) for r in range(len(self.tokens))]

    def add(self, tokens: list[int], logprobs: list[float], eos: set[int], stop_at_eos: bool):
        for row, (token, logprob) in enumerate(zip(tokens, logprobs)):
            if self.done[row]:
                continue
            if stop_at_eos and token in eos:
                self.done[row], self.reasons[row] = True, "eos"
                continue
            self.tokens[row].append(token)
            self.logprobs[row].append(logprob)
            if self.stop and any(s in self.text_raw(row) for s in self.stop):
                self.done[row], self.reasons[row] = True, "stop"

    def text_raw(self, row: int) -> str:
        return self.tokenizer.decode(self.tokens[row], skip_special_tokens=True)

    def result(self) -> Generation:
        activations = self.recorder.stacked() if self.recorder else None
        return Generation(
            text=self.texts(),
            tokens=[list(t) for t in self.tokens],
            prompt_tokens=self.prompt_tokens,
            finish_reasons=list(self.reasons),
            activations=activations,
            logprobs=[list(lp) for lp in self.logprobs],
            **self.meta,
        )


class PromptStreams:
    """One seeded random stream per prompt, shared by that prompt's rows (its alphas).

    A prompt's stream depends only on the seed, the prompt's text and which repeat of that
    text it is, so a row samples the same tokens whatever else shares its batch, repeats of
    one prompt get different samples, and a baseline row and a steered row of one prompt
    draw the same numbers.
    """

    def __init__(self, seed: int, prompts: list[Any], prompt_index: list[int]) -> None:
        seen: dict[str, int] = {}
        self.generators = []
        for prompt in prompts:
            text = repr(prompt)
            repeat = seen[text] = seen.get(text, -1) + 1
            key = hashlib.sha256(f"{seed}|{repeat}|{text}".encode()).digest()
            self.generators.append(torch.Generator().manual_seed(int.from_bytes(key[:7], "big")))
        self.rows = torch.tensor(prompt_index)

    def draw(self) -> torch.Tensor:  # [batch], uniform in [0, 1)
        per_prompt = torch.cat([torch.rand(1, generator=g) for g in self.generators])
        return per_prompt[self.rows]


def decode(
    backend: Backend,
    batch: Batch,
    layout: TokenLayout,
    builder: _Builder,
    config: DecodeConfig,
    *,
    prompts: list[Any],
    prompt_index: list[int],  # [batch]: rows of one prompt share one random stream
    eos_ids: set[int],
    pad_id: int,
) -> Iterator[Step]:
    """Yield one ``Step`` per new token; hooks must already be attached.

    Forward passes run under ``torch.inference_mode``, but never across a ``yield``: the
    caller's code between steps keeps autograd.
    """
    device = backend.input_device
    ids = batch.input_ids.to(device)  # [batch, prompt]
    mask = batch.attention_mask.to(device)  # [batch, prompt]
    use_cache = config.use_cache
    cache = backend.new_cache(ids.shape[0]) if use_cache else None
    assert config.seed is not None, "the plan fixes a seed before decoding"
    streams = PromptStreams(config.seed, prompts, prompt_index)
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=device)

    layout.update(token_positions(mask))
    with torch.inference_mode():
        logits = backend.forward(ids, mask, cache, last_only=True)[:, -1]  # [batch, vocab]
    for step in range(config.max_new_tokens):
        uniform = streams.draw()  # [batch]
        token = sample_next(
            logits,
            uniform,
            temperature=config.temperature,
            top_k=config.top_k,
            top_p=config.top_p,
        ).to(device)  # [batch]
        logprob = logits.float().log_softmax(-1).gather(-1, token[:, None].to(logits.device))
        token = token.masked_fill(finished, pad_id)
        builder.add(token.tolist(), logprob.squeeze(-1).tolist(), eos_ids, config.stop_at_eos)
        yield Step(step, token.tolist(), list(builder.done), builder)
        finished = torch.tensor(builder.done, device=device)
        if bool(finished.all()) or step == config.max_new_tokens - 1:
            return
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        if use_cache:
            feed = token[:, None]  # [batch, 1]
            layout.update(token_positions(mask)[:, -1:])
        else:  # recompute the whole sequence: the reference the cache is tested against
            ids = torch.cat([ids, token[:, None]], dim=1)
            feed = ids
            layout.update(token_positions(mask))
        with torch.inference_mode():
            logits = backend.forward(feed, mask, cache, last_only=True)[:, -1]
