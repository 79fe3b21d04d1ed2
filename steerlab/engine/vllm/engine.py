"""``VLLMEngine``: steerlab's requests decoded by vLLM, steered inside its workers.

Each row is one vLLM request in vLLM's continuous batch, its steers carried as data. The
engine checks everything before the first request is sent; sends each new vector once;
hooks the sites a call needs on every worker for the length of the call; and, as rows
start and finish, asks the workers how many tokens each steered row's hooks changed. A
steered row whose hooks fell short, or failed, fails the call: never a silent no-op.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from steerlab.engine.cache import KVCache
from steerlab.engine.guard import CallInFlightError
from steerlab.engine.local import Progress
from steerlab.engine.request import Completion, Request, RowSteer
from steerlab.engine.vllm.params import expected_tokens, live_steers, to_vllm
from steerlab.generation.prompts import PromptError
from steerlab.generation.state import RowStates
from steerlab.sites import all_sites, resolve
from steerlab.steering.ops import SteerError, op_to_data

_CALL_IDS = itertools.count(1)


class SteerHookError(RuntimeError):
    """A steered request whose hooks failed or never ran inside vLLM."""


class VLLMEngine:
    """Decodes requests with a ``vllm.LLM`` whose workers carry ``SteerWorker``.

    Build it with ``steerlab.load(..., backend="vllm")``.

    >>> lm = sl.load("steerlab-tiny", backend="vllm")  # doctest: +SKIP
    >>> lm.engine.run([Request((0, 17, 4), sampling=Sampling(max_new_tokens=5))])  # doctest: +SKIP
    """

    kind = "vllm"

    def __init__(self, llm: Any, tokenizer: Any, *, eos_ids: set[int], pad_id: int,
                 revision: str | None = None) -> None:  # fmt: skip
        self.llm, self.tokenizer, self.pad_id = llm, tokenizer, pad_id
        config = llm.llm_engine.model_config
        text = config.hf_config.get_text_config()
        self.n_layers: int = text.num_hidden_layers
        self.d_model: int = text.hidden_size
        self.n_ctx: int | None = config.max_model_len
        self.revision = revision or ""
        self._eos = set(eos_ids)
        self._sent: set[str] = set()  # vector keys every worker holds
        self._lock = threading.Lock()
        self._in_flight: str | None = None

    def sites(self) -> list[str]:
        return all_sites(self.n_layers)

    def eos_ids(self) -> set[int]:
        return set(self._eos)

    def hook_count(self) -> int:
        """Steerlab hooks on the model in every worker: 0 whenever no call is running."""
        return sum(self.llm.collective_rpc("steerlab_hook_count"))

    def remove_hooks(self) -> int:
        return sum(self.llm.collective_rpc("steerlab_end"))

    def close(self) -> None:
        """Shut vLLM's engine processes down (``lm.engine.close()``); the model is unusable after."""
        self.llm.llm_engine.engine_core.shutdown()

    def check(self, requests: Sequence[Request], capture: Sequence[str] = ()) -> None:
        """Everything about ``requests`` that can fail, before any request is sent."""
        if not requests:
            raise ValueError("No requests: give at least one.")
        valid = self.sites()
        for r in requests:
            if not r.prompt:
                raise PromptError("The vLLM engine needs at least one prompt token per request.")
            if self.n_ctx is not None and len(r.prompt) + r.sampling.max_new_tokens > self.n_ctx:
                raise PromptError(
                    f"A prompt of {len(r.prompt)} tokens plus max_new_tokens="
                    f"{r.sampling.max_new_tokens} is beyond this engine's max_model_len of "
                    f"{self.n_ctx}; load with a larger max_model_len."
                )
            for steer in r.steers:
                _check_steer(steer, valid, self.d_model)

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
    ) -> Iterator[Progress]:
        """Decode ``requests`` in vLLM's continuous batch, yielding ``Progress`` as tokens come.

        ``use_cache`` has no effect (vLLM always decodes through its paged KV cache).
        """
        if cache is not None or keep_cache:
            raise ValueError(
                "The vLLM engine keeps its KV cache inside vLLM (paged, shared through prefix "
                "caching), so it cannot hand out or continue a steerlab KVCache: drop cache= "
                "and keep_cache=, or use backend='hf' for multi-turn cache work."
            )
        if capture:
            raise ValueError(
                "The vLLM engine does not return activations (they stay in its worker "
                "processes): use backend='hf' or 'bridge' for capture= and run_with_cache."
            )
        self.check(requests)
        return self._stream(list(requests), wait, description)

    def run(self, requests: Sequence[Request], *, wait: float = 0.0) -> list[Completion]:
        """Decode every request; one ``Completion`` per request, in order."""
        (last,) = deque(self.stream(requests, wait=wait, description="run"), maxlen=1)
        return last.states.completions()

    def forward(self, requests: Sequence[Request], **_: Any) -> Any:
        raise NotImplementedError(
            "The vLLM engine samples tokens; it does not return full logits or activations. "
            "Use backend='hf' or 'bridge' for lm.logits and lm.run_with_cache."
        )

    def prefill(self, requests: Sequence[Request], **_: Any) -> KVCache:
        raise NotImplementedError(
            "The vLLM engine keeps its KV cache inside vLLM; use backend='hf' for prefill."
        )

    @contextmanager
    def _call(self, description: str, wait: float) -> Iterator[None]:
        got = self._lock.acquire(timeout=wait) if wait > 0 else self._lock.acquire(False)
        if not got:
            raise CallInFlightError(
                f"Another steerlab call is running on this vLLM engine: {self._in_flight}. A "
                "paused stream counts: finish it or close() it, then try again."
            )
        self._in_flight = description
        try:
            yield
        finally:
            self._in_flight = None
            self._lock.release()

    def _stream(self, requests: list[Request], wait: float,
                description: str) -> Iterator[Progress]:  # fmt: skip
        with self._call(description, wait):
            call = next(_CALL_IDS)
            rows = [f"steerlab-{call}-{i}" for i in range(len(requests))]
            sites = sorted({s.site for r in requests for s in live_steers(r)})
            self._send_vectors(requests)
            if sites:
                self.llm.collective_rpc("steerlab_begin", args=(sites,))
            decoding = _Decoding(self, requests, rows)
            try:
                yield from decoding.run()
            finally:
                decoding.abort_all()
                if sites:
                    self.llm.collective_rpc("steerlab_end")

    def _send_vectors(self, requests: list[Request]) -> None:
        from safetensors.torch import save

        new: dict[str, torch.Tensor] = {}
        for r in requests:
            for s in live_steers(r):
                if s.vector_key not in self._sent:
                    new[s.vector_key] = s.vector.detach().cpu().contiguous()
        if new:
            self.llm.collective_rpc("steerlab_put_vectors", args=(save(new),))
            self._sent |= set(new)


def _check_steer(steer: RowSteer, valid: list[str], d_model: int) -> None:
    resolve(steer.site, valid)
    if steer.vector.shape[0] != d_model:
        raise SteerError(
            f"Vector for {steer.site} has size {steer.vector.shape[0]}, but this model has "
            f"d_model={d_model}."
        )
    op_to_data(steer.op)  # a custom callable cannot travel to vLLM's workers


class _Decoding:
    """One call's requests inside vLLM: add, step, record, verify, abort."""

    def __init__(self, engine: VLLMEngine, requests: list[Request], rows: list[str]) -> None:
        self.engine, self.requests, self.rows = engine, requests, rows
        self.index = {row: i for i, row in enumerate(rows)}
        self.states = RowStates(engine.tokenizer, requests)
        self.live: set[str] = set()  # rows vLLM still decodes
        self.cached = [0] * len(rows)  # prompt tokens served from the prefix cache
        self.steered = [bool(live_steers(r)) for r in requests]

    def run(self) -> Iterator[Progress]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        llm = self.engine.llm.llm_engine
        eos = self.engine.eos_ids()
        for request, row in zip(self.requests, self.rows):
            vr = to_vllm(request, row, revision=self.engine.revision, eos_ids=eos)
            params = SamplingParams(**vr.sampling, output_kind=RequestOutputKind.DELTA)
            llm.add_request(row, vr.prompt, params)
            self.live.add(row)
        step, lengths = 0, [0] * len(self.rows)
        while self.live:
            outputs = llm.step()
            started, finished = self._record(outputs, eos)
            self._verify(started, finished)
            self._abort([r for r in self.live if self.states.done[self.index[r]]])
            before, lengths = lengths, [len(t) for t in self.states.tokens]
            if lengths == before and not finished:
                continue
            token_ids = [t[-1] if n > b else self.engine.pad_id
                         for t, n, b in zip(self.states.tokens, lengths, before)]  # fmt: skip
            reasons = [why if d else "length" for why, d in
                       zip(self.states.reasons, self.states.done)]  # fmt: skip
            yield Progress(step, token_ids, list(self.states.done), lengths, before, reasons,
                           self.states, lambda: None, None)  # fmt: skip
            step += 1
            self._abort([r for r in self.live if self.states.done[self.index[r]]])  # cancelled

    def _record(self, outputs: list[Any], eos: set[int]) -> tuple[list[int], list[int]]:
        """Feed new tokens to the row states; returns rows started and rows finished."""
        started, finished = [], []
        for out in outputs:
            i = self.index.get(out.request_id)
            if i is None or self.rows[i] not in self.live:
                continue
            completion = out.outputs[0]
            if not self.states.tokens[i] and not self.states.done[i] and completion.token_ids:
                started.append(i)
                self.cached[i] = out.num_cached_tokens or 0
            for j, token in enumerate(completion.token_ids):
                if self.states.done[i]:
                    break
                logprobs = completion.logprobs[j] if completion.logprobs else {}
                entry = logprobs.get(token)
                self.states.add(i, int(token), float(entry.logprob) if entry else float("nan"),
                                eos)  # fmt: skip
            if out.finished:
                self.live.discard(self.rows[i])
                self.states.done[i] = True
            if self.states.done[i]:
                finished.append(i)
        return started, finished

    def _verify(self, started: list[int], finished: list[int]) -> None:
        """Ask the workers what the hooks did for steered rows that started or finished."""
        ask = sorted({i for i in started + finished if self.steered[i]})
        if not ask:
            return
        rows = [self.rows[i] for i in ask]
        forget = [self.rows[i] for i in finished if self.steered[i]]
        reports = self.engine.llm.collective_rpc("steerlab_report", args=(rows, forget))
        for i, row in zip(ask, rows):
            fired = sum(report[row][0] for report in reports)
            errors = [report[row][1] for report in reports if report[row][1]]
            if errors:
                raise SteerHookError(f"Steering failed inside vLLM for row {i}: {errors[0]}")
            generated = len(self.states.tokens[i]) + (self.states.reasons[i] == "eos")
            if i not in finished:  # just started: only the prompt has been fed
                generated = 1
            expected = expected_tokens(self.requests[i], self.cached[i], generated)
            if fired < expected:
                raise SteerHookError(
                    f"Row {i} is steered, but vLLM's hooks steered {fired} tokens where at "
                    f"least {expected} were due: the hooks did not run (was the model "
                    "compiled before they were added?). Nothing was returned for it."
                )

    def _abort(self, rows: list[str]) -> None:
        if rows:
            self.engine.llm.llm_engine.abort_request(rows)
            self.live -= set(rows)

    def abort_all(self) -> None:
        self._abort(sorted(self.live))
