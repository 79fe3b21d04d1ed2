"""``SteerableModel``: one steerable language model, whatever the backend."""

from __future__ import annotations

import html
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from steerlab.activations import Activations
from steerlab.backends.base import Backend
from steerlab.generation.loop import DecodeConfig, _Builder, decode
from steerlab.generation.prompts import Prompt, token_positions
from steerlab.generation.result import Generation, Step
from steerlab.hooks import HookSet, count_hooks, scoped_hooks
from steerlab.intervene import Recorder, TokenLayout, attach_steer
from steerlab.rows import Rows, SteerArg, lay_out
from steerlab.sites import resolve

_ATTACH_LOCK = threading.Lock()


@dataclass(frozen=True)
class _Plan:
    """A checked generation request: rows, the config, and what to collect."""

    rows: Rows
    builder: _Builder
    config: DecodeConfig


class SteerableModel:
    """A model plus tokenizer behind one API: ``generate``, ``stream``, ``run_with_cache``.

    Build one with ``steerlab.load`` or ``steerlab.wrap``.

    >>> lm = steerlab.load("steerlab-tiny")  # doctest: +SKIP
    >>> lm.generate("Once upon a time", max_new_tokens=5).text  # doctest: +SKIP
    """

    def __init__(
        self, backend: Backend, tokenizer: Any, name: str = "", revision: str | None = None
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.name = name
        self.revision = revision  # the hub revision it was loaded at, when one was asked for
        self._sites = backend.sites()

    @property
    def model(self) -> torch.nn.Module:
        return self.backend.model

    @property
    def n_layers(self) -> int:
        return self.backend.n_layers

    @property
    def d_model(self) -> int:
        return self.backend.d_model

    def sites(self) -> list[str]:
        """Canonical TransformerLens site names available on this model, in forward order."""
        return list(self._sites)

    def hook_count(self) -> int:
        """Steerlab hooks currently on the model: 0 whenever no call is running."""
        return count_hooks(self.backend.model)

    @property
    def eos_ids(self) -> set[int]:
        """Tokens that end a row: the tokenizer's EOS and the model's generation config's."""
        ids = {self.tokenizer.eos_token_id}
        config = getattr(self.backend.model, "generation_config", None)
        if config is None:  # a TransformerBridge keeps its HF model inside
            hf = getattr(self.backend.model, "original_model", None)
            config = getattr(hf, "generation_config", None)
        extra = getattr(config, "eos_token_id", None)
        ids |= set(extra) if isinstance(extra, (list, tuple)) else {extra}
        return {i for i in ids if i is not None}

    @property
    def pad_id(self) -> int:
        for candidate in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id, 0):
            if candidate is not None:
                return candidate
        return 0

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        steer: SteerArg = None,
        *,
        max_new_tokens: int = 40,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_at_eos: bool = True,
        stop: str | Sequence[str] | None = None,
        chat: bool = False,
        capture: Sequence[str] = (),
        use_cache: bool = True,
    ) -> Iterator[Step]:
        """Generate token by token, yielding a ``Step`` after each new token.

        Hooks are on only while the stream runs; closing the generator early removes them.
        Arguments are those of ``generate``; everything is checked before the first forward.
        """
        if seed is None:  # a fresh seed, recorded on the result so the run can be repeated
            seed = int(torch.seed() % 2**31)
        config = DecodeConfig(
            max_new_tokens, temperature, top_k, top_p, seed, stop_at_eos,
            (stop,) if isinstance(stop, str) else tuple(stop or ()), use_cache,
        )  # fmt: skip
        return self._run(self._plan(prompts, steer, config, chat, capture))

    @contextmanager
    def _steering(self, rows: Rows, layout: TokenLayout) -> Iterator[HookSet]:
        """Steers attached, in forward order, for the length of the block; always removed.

        Only one steerlab call may have hooks on a model at a time: a second one (another
        thread, or a call made while a stream is paused) would run through the first one's
        hooks, so it is refused before anything is attached.
        """
        with scoped_hooks() as hooks:
            with _ATTACH_LOCK:
                if count_hooks(self.backend.model):
                    raise RuntimeError(
                        "Another steerlab call has hooks on this model (an open stream, or a "
                        "panel generating). Finish or close() it first."
                    )
                for site, steer, row_alphas in sorted(
                    rows.steers, key=lambda s: s[0].forward_order
                ):
                    attach_steer(self.backend, site, steer, row_alphas, layout, hooks)
            yield hooks

    def _plan(
        self,
        prompts: Prompt | Sequence[Prompt],
        steer: SteerArg,
        config: DecodeConfig,
        chat: bool,
        capture: Sequence[str],
    ) -> _Plan:
        if capture and not config.use_cache:
            raise ValueError("capture needs use_cache=True.")
        captured = [resolve(name, self._sites) for name in capture]
        rows = lay_out(self, prompts, steer, chat=chat, new_tokens=config.max_new_tokens)
        meta = {"prompt_index": rows.prompt_index, "alphas": rows.alphas, "prompts": rows.prompts,
                "seed": config.seed}  # fmt: skip
        builder = _Builder(self.tokenizer, rows.batch, meta, list(config.stop))
        if captured:
            builder.recorder = Recorder(captured)
        return _Plan(rows, builder, config)

    def _run(self, plan: _Plan) -> Iterator[Step]:
        layout = TokenLayout(plan.rows.batch.prompt_lengths)
        with self._steering(plan.rows, layout) as hooks:
            if plan.builder.recorder is not None:
                plan.builder.recorder.attach(self.backend, hooks)
            yield from decode(
                self.backend, plan.rows.batch, layout, plan.builder, plan.config,
                prompts=plan.rows.prompts,
                prompt_index=plan.rows.prompt_index,
                eos_ids=self.eos_ids,
                pad_id=self.pad_id,
            )  # fmt: skip

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        steer: SteerArg = None,
        *,
        max_new_tokens: int = 40,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_at_eos: bool = True,
        stop: str | Sequence[str] | None = None,
        chat: bool = False,
        capture: Sequence[str] = (),
        use_cache: bool = True,
    ) -> Generation:
        """Generate completions, steered or not, one row per prompt x alpha.

        Args:
            prompts: a string, a list of messages (with ``chat=True``), or a list of either.
            steer: a ``Steer``, a list of them, or a steering vector times alpha.
            max_new_tokens: at most this many new tokens per row.
            temperature: 0 is greedy; otherwise logits are divided by it before sampling.
            top_k: keep only the k most likely tokens.
            top_p: keep the smallest set of tokens whose probability reaches top_p.
            seed: makes sampling reproducible; rows of the same prompt share random numbers.
            stop_at_eos: rows end at EOS; False gives fixed-length output.
            stop: strings that end a row; the text is cut before them.
            chat: apply the tokenizer's chat template (a string is the user turn).
            capture: sites whose activations to keep over prompt and new tokens.
            use_cache: decode through the KV cache (False recomputes the whole sequence).

        >>> lm.generate("Once upon a time", max_new_tokens=10).text  # doctest: +SKIP
        """
        steps = self.stream(
            prompts, steer, max_new_tokens=max_new_tokens, temperature=temperature,
            top_k=top_k, top_p=top_p, seed=seed, stop_at_eos=stop_at_eos, stop=stop,
            chat=chat, capture=capture, use_cache=use_cache,
        )  # fmt: skip
        (last,) = deque(steps, maxlen=1)  # max_new_tokens >= 1: there is a last step
        return last.result()

    def _forward(self, rows: Rows, recorder: Recorder | None, last_only: bool) -> torch.Tensor:
        layout = TokenLayout(rows.batch.prompt_lengths)
        layout.update(token_positions(rows.batch.attention_mask))
        device = self.backend.input_device
        with self._steering(rows, layout) as hooks, torch.inference_mode():
            if recorder is not None:
                recorder.attach(self.backend, hooks)
            return self.backend.forward(
                rows.batch.input_ids.to(device), rows.batch.attention_mask.to(device), None,
                last_only=last_only,
            )  # fmt: skip

    def logits(
        self,
        prompts: Prompt | Sequence[Prompt],
        steer: SteerArg = None,
        *,
        chat: bool = False,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Logits of one forward pass, one row per prompt x alpha, left-padded.

        Returns ``[rows, pos, vocab]`` (``[rows, 1, vocab]`` with ``last_only``), in the
        row order of ``generate``.

        >>> lm.logits(["Once"], steer, last_only=True)[:, -1].softmax(-1)  # doctest: +SKIP
        """
        return self._forward(
            lay_out(self, prompts, steer, chat=chat, new_tokens=0), None, last_only
        )

    def run_with_cache(
        self,
        prompts: Prompt | Sequence[Prompt],
        sites: Sequence[str] | None = None,
        *,
        steer: SteerArg = None,
        chat: bool = False,
    ) -> Activations:
        """One forward pass over left-padded prompts, keeping activations at ``sites``.

        Args:
            prompts: strings (or message lists with ``chat=True``).
            sites: canonical site names; all of ``lm.sites()`` when None.
            steer: optional steering during the pass; an alpha list gives one row per alpha.
            chat: apply the chat template.

        >>> acts = lm.run_with_cache(["Hello"], sites=["blocks.0.hook_resid_post"])  # doctest: +SKIP
        """
        names = self._sites if sites is None else list(sites)
        recorder = Recorder([resolve(name, self._sites) for name in names])
        rows = lay_out(self, prompts, steer, chat=chat, new_tokens=0)
        self._forward(rows, recorder, last_only=True)
        batch = rows.batch
        str_tokens = [
            [self.tokenizer.decode([t]) if m else "" for t, m in zip(ids.tolist(), mask.tolist())]
            for ids, mask in zip(batch.input_ids, batch.attention_mask)
        ]
        return Activations(recorder.stacked(), batch.input_ids, batch.attention_mask, str_tokens)

    def __repr__(self) -> str:
        return (
            f"SteerableModel({self.name or type(self.model).__name__!s}, backend={self.backend.kind!r}, "
            f"n_layers={self.n_layers}, d_model={self.d_model}, hooks={self.hook_count()})"
        )

    def _repr_html_(self) -> str:
        return (
            f"<b>SteerableModel</b> <code>{html.escape(self.name)}</code> &middot; backend "
            f"<code>{self.backend.kind}</code> &middot; {self.n_layers} layers &middot; "
            f"d_model {self.d_model} &middot; {len(self._sites)} sites &middot; "
            f"steerlab hooks on model: {self.hook_count()}"
        )
