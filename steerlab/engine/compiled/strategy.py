"""``CompiledStep``: the local engine's compiled decode step, for the calls that fit it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from steerlab.backends.cache import KVCache
from steerlab.core.request import Request, Sampling
from steerlab.engine.compiled.batch import StaticBatch
from steerlab.engine.compiled.families import Family, hf_model_of, step_class
from steerlab.engine.compiled.fit import call_reason, model_reason, steer_reason
from steerlab.engine.compiled.runner import StepRunner, bucket
from steerlab.engine.plan import Plan
from steerlab.engine.progress import last
from steerlab.engine.reads import CallReads

if TYPE_CHECKING:
    from steerlab.engine.local import LocalEngine

MIN_LENGTH = 64  # the smallest length bucket


class CompiledStep:
    """One compiled graph per bucket, as the decode step of a ``LocalEngine``.

    A call fits when its steers are operations of ``core/ops/`` (one per site and row),
    on an hf or bridge model of a family with a written-out step, without ``cache=``,
    ``keep_cache``, ``capture`` or ``use_cache=False``; anything else runs eagerly, and
    ``explain`` says why. Batch size and length are rounded up to powers of two, so one
    graph serves every alpha, vector, operation, position rule, prompt and batch within a
    bucket. The prefill runs eagerly (hooks and all), so a call's first token is exactly
    the eager engine's.

    Args:
        engine: the local engine it steps for (its backend, pad and EOS ids are shared).
        mode: ``torch.compile`` mode; None picks "reduce-overhead" (CUDA graphs) on CUDA.
        backend: ``torch.compile`` backend; "aot_eager" traces the same graph without
            generating code (quick to build, for tests).

    >>> fast = sl.load("steerlab-tiny", backend="hf").compile()
    >>> type(fast.engine.compiled).__name__
    'CompiledStep'
    """

    def __init__(self, engine: LocalEngine, *, mode: str | None = None,
                 backend: str = "inductor") -> None:  # fmt: skip
        self.engine = engine
        self.model = hf_model_of(engine.backend)
        self.device = engine.backend.input_device
        if mode is None and self.device.type == "cuda":
            mode = "reduce-overhead"
        self.mode, self.compiler = mode, backend
        self._family: Family | None = None
        self._runners: dict[tuple[int, int], StepRunner] = {}
        # Each bucket is one specialised graph; leave room for many (dynamo's default is 8).
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)

    def reason(self, requests: Sequence[Request], plan: Plan, *, cache: KVCache | None = None,
               keep_cache: bool = False, capture: Sequence[str] = (),
               use_cache: bool = True) -> str | None:  # fmt: skip
        """Why these requests (compiled into ``plan``) run eagerly, or None when they fit
        the compiled step."""
        return (
            call_reason(
                requests, cache=cache, keep_cache=keep_cache, capture=capture, use_cache=use_cache
            )  # fmt: skip
            or model_reason(self.engine.kind, self.model, _length(requests), self.engine.n_ctx)
            or steer_reason(plan)
        )

    def describe(self, requests: Sequence[Request]) -> str:
        """The compiled path's line for requests that fit it: their buckets and the mode."""
        rows, length = bucket(len(requests)), bucket(_length(requests), MIN_LENGTH)
        return f"batch bucket {rows}, length bucket {length}, mode {self.mode or 'default'}"

    def compile_times(self) -> dict[tuple[int, int], float]:
        """Seconds the first step of each (batch, length) bucket took, compilation included."""
        return {k: r.compile_seconds for k, r in self._runners.items() if r.compile_seconds}

    def batch(self, requests: Sequence[Request], plan: Plan,
              reads: CallReads | None = None) -> StaticBatch:  # fmt: skip
        """The decode loop's batch for ``requests`` (compiled into ``plan``), stepped by
        their bucket's graph; a conditioned steer's row decisions (``reads``, made in the
        eager prefill) go into the table as alpha 0 on the rows whose condition did not
        fire."""
        return StaticBatch(self.engine.backend, requests, self.engine.pad_id,
                           self._runner(requests), plan, reads)  # fmt: skip

    def _runner(self, requests: Sequence[Request]) -> StepRunner:
        key = (bucket(len(requests)), bucket(_length(requests), MIN_LENGTH))
        if key not in self._runners:
            if self._family is None:
                assert self.model is not None
                self._family = step_class(self.model.config.get_text_config())(self.model)
            dtype = self.model.get_input_embeddings().weight.dtype
            self._runners[key] = StepRunner(self._family, *key, self.engine.d_model, dtype,
                                            self.device, self.mode, self.compiler)  # fmt: skip
        return self._runners[key]

    def warm(self, batch: int = 1, length: int = MIN_LENGTH) -> float:
        """Compile the bucket for ``batch`` rows and ``length`` positions now; seconds taken."""
        prompt = (self.engine.pad_id,) * max(length - 2, 1)
        sampling = Sampling(max_new_tokens=2, stop_at_eos=False)
        requests = [Request(prompt, sampling=sampling, stream=str(i)) for i in range(batch)]
        last(self.engine.stream(requests, description="warm-up"))
        return self._runner(requests).compile_seconds or 0.0


def _length(requests: Sequence[Request]) -> int:
    """Cache positions a call needs: the widest prompt plus the most new tokens."""
    return max(len(r.prompt) for r in requests) + max(r.sampling.max_new_tokens for r in requests)
