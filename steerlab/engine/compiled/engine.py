"""``CompiledEngine``: the local engine with a compiled decode step where a call fits it."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from steerlab.backends.cache import KVCache
from steerlab.core.request import Request, Sampling
from steerlab.engine.compiled.batch import StaticBatch
from steerlab.engine.compiled.families import FAMILIES, Family, hf_model_of
from steerlab.engine.compiled.fit import call_reason, model_reason, steer_reason
from steerlab.engine.compiled.runner import StepRunner, bucket
from steerlab.engine.guard import calling
from steerlab.engine.local import LocalEngine, Progress
from steerlab.engine.local.capture import Recorder
from steerlab.engine.local.loop import decode
from steerlab.engine.state import RowStates

log = logging.getLogger(__name__)
MIN_LENGTH = 64  # the smallest length bucket


class CompiledEngine(LocalEngine):
    """``LocalEngine`` whose decode steps run one compiled graph per bucket.

    A call fits when its steers are Add, Ablate or Clamp (one per site and row), on an hf
    or bridge model of a family with a written-out step, without ``cache=``,
    ``keep_cache``, ``capture`` or ``use_cache=False``; anything else runs eagerly, and
    ``explain`` says why. Batch size and length are rounded up to powers of two, so one
    graph serves every alpha, vector, position rule, prompt and batch within a bucket.

    Args:
        eager: the engine to wrap (its backend, tokenizer, pad and EOS ids are shared).
        mode: ``torch.compile`` mode; None picks "reduce-overhead" (CUDA graphs) on CUDA.
        backend: ``torch.compile`` backend; "aot_eager" traces the same graph without
            generating code (quick to build, for tests).

    >>> lm.engine = CompiledEngine(lm.engine)  # or lm.compile()  # doctest: +SKIP
    """

    def __init__(self, eager: LocalEngine, *, mode: str | None = None,
                 backend: str = "inductor") -> None:  # fmt: skip
        super().__init__(eager.backend, eager.tokenizer, pad_id=eager.pad_id, eos_ids=eager._eos)
        self.eager = eager
        self.model = hf_model_of(eager.backend)
        self.device = eager.backend.input_device
        if mode is None and self.device.type == "cuda":
            mode = "reduce-overhead"
        self.mode, self.compiler = mode, backend
        self._family: Family | None = None
        self._runners: dict[tuple[int, int], StepRunner] = {}
        # Each bucket is one specialised graph; leave room for many (dynamo's default is 8).
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)

    # --- what fits ----------------------------------------------------------------------

    def reason(self, requests: Sequence[Request], *, cache: KVCache | None = None,
               keep_cache: bool = False, capture: Sequence[str] = (),
               use_cache: bool = True) -> str | None:  # fmt: skip
        """Why these requests run eagerly, or None when they fit the compiled step."""
        return (
            call_reason(
                requests, cache=cache, keep_cache=keep_cache, capture=capture, use_cache=use_cache
            )  # fmt: skip
            or model_reason(self.kind, self.model, _length(requests), self.n_ctx)
            or steer_reason(requests)
        )

    def explain(self, requests: Sequence[Request], **options: Any) -> str:
        """One line: which path these requests take, and why when it is the eager one."""
        why = self.reason(requests, **options)
        if why is not None:
            return f"eager: {why}"
        rows, length = bucket(len(requests)), bucket(_length(requests), MIN_LENGTH)
        return (
            f"compiled: batch bucket {rows}, length bucket {length}, mode {self.mode or 'default'}"
        )

    def compile_times(self) -> dict[tuple[int, int], float]:
        """Seconds the first step of each (batch, length) bucket took, compilation included."""
        return {k: r.compile_seconds for k, r in self._runners.items() if r.compile_seconds}

    # --- calls --------------------------------------------------------------------------

    def stream(
        self,
        requests: Sequence[Request],
        *,
        cache: KVCache | None = None,
        keep_cache: bool = False,
        capture: Sequence[str] = (),
        use_cache: bool = True,
        wait: float = 0.0,
        description: str = "generate",
        compact: bool = True,
    ) -> Iterator[Progress]:
        """As ``LocalEngine.stream``; compiled where the call fits, eager otherwise.

        The compiled path keeps finished rows in their static batch (``compact`` applies to
        the eager path only).
        """
        self.check(requests, capture)
        why = self.reason(requests, cache=cache, keep_cache=keep_cache, capture=capture,
                          use_cache=use_cache)  # fmt: skip
        if why is not None:
            log.debug("steerlab: %s runs eagerly: %s", description, why)
            return super().stream(requests, cache=cache, keep_cache=keep_cache, capture=capture,
                                  use_cache=use_cache, wait=wait, description=description,
                                  compact=compact)  # fmt: skip
        return self._compiled(list(requests), wait, description)

    def _compiled(self, requests: list[Request], wait: float,
                  description: str) -> Iterator[Progress]:  # fmt: skip
        states = RowStates(self.tokenizer, requests)
        with calling(self.models(), description, wait=wait) as call:
            self._attach(requests, None, call)  # the eager prefill's hooks
            batch = StaticBatch(self.backend, requests, self.pad_id, self._runner(requests))
            steps = decode(batch, states, call, eos_ids=self.eos_ids(), pad_id=self.pad_id,  # type: ignore[arg-type]
                           compact=False, keep_cache=False)  # fmt: skip
            yield from _progress(steps, states, self.pad_id)

    def _runner(self, requests: Sequence[Request]) -> StepRunner:
        key = (bucket(len(requests)), bucket(_length(requests), MIN_LENGTH))
        if key not in self._runners:
            if self._family is None:
                assert self.model is not None
                self._family = FAMILIES[self.model.config.get_text_config().model_type](self.model)
            dtype = self.model.get_input_embeddings().weight.dtype
            self._runners[key] = StepRunner(self._family, *key, self.d_model, dtype,
                                            self.device, self.mode, self.compiler)  # fmt: skip
        return self._runners[key]

    def warm(self, batch: int = 1, length: int = MIN_LENGTH) -> float:
        """Compile the bucket for ``batch`` rows and ``length`` positions now; seconds taken."""
        prompt = (self.pad_id,) * max(length - 2, 1)
        sampling = Sampling(max_new_tokens=2, stop_at_eos=False)
        requests = [Request(prompt, sampling=sampling, stream=str(i)) for i in range(batch)]
        for _ in self._compiled(requests, 0.0, "warm-up"):
            pass
        return self._runner(requests).compile_seconds or 0.0


def _length(requests: Sequence[Request]) -> int:
    """Cache positions a call needs: the widest prompt plus the most new tokens."""
    return max(len(r.prompt) for r in requests) + max(r.sampling.max_new_tokens for r in requests)


def _progress(steps: Iterator[int], states: RowStates, pad_id: int,
              recorder: Recorder | None = None) -> Iterator[Progress]:  # fmt: skip
    lengths = [0] * len(states.requests)
    for index in steps:
        before, lengths = lengths, [len(t) for t in states.tokens]
        token_ids = [states.tokens[r][-1] if n > b else pad_id
                     for r, (n, b) in enumerate(zip(lengths, before))]  # fmt: skip
        reasons = [why if d else "length" for why, d in zip(states.reasons, states.done)]
        yield Progress(index, token_ids, list(states.done), lengths, before, reasons, states,
                       lambda: None, recorder)  # fmt: skip
