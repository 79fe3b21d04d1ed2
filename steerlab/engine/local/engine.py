"""``LocalEngine``: the in-process engine, the decode loop plus hooks on one backend."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from steerlab.backends.base import Backend
from steerlab.backends.cache import KVCache
from steerlab.core.request import Completion, Request
from steerlab.core.sites import Site, resolve
from steerlab.core.tagging import count_hooks, remove_hooks
from steerlab.engine.guard import Call, calling
from steerlab.engine.local import prefix
from steerlab.engine.local.capture import Recorder
from steerlab.engine.local.loop import Batch, decode
from steerlab.engine.local.steering import attach_steer, check_row_steers, group_steers
from steerlab.engine.state import RowStates


@dataclass
class Progress:
    """Where a call stands after one step: each row's tokens, as a snapshot."""

    index: int
    token_ids: list[int]  # [rows]: each row's new token (the pad id for rows already done)
    done: list[bool]
    lengths: list[int]  # new tokens per row after this step
    before: list[int]  # new tokens per row before it
    reasons: list[str]
    states: RowStates
    cache: Callable[[], KVCache | None]
    recorder: Recorder | None


class LocalEngine:
    """Decodes requests in this process, steering through hooks on ``backend``.

    >>> engine = LocalEngine(lm.backend, lm.tokenizer, pad_id=0)  # doctest: +SKIP
    >>> engine.run([Request((0, 17, 4), sampling=Sampling(max_new_tokens=5))])  # doctest: +SKIP
    """

    def __init__(self, backend: Backend, tokenizer: Any, *, pad_id: int,
                 eos_ids: set[int] | None = None) -> None:  # fmt: skip
        self.backend, self.tokenizer, self.pad_id = backend, tokenizer, pad_id
        self.kind = backend.kind
        self.n_layers, self.d_model, self.n_ctx = backend.n_layers, backend.d_model, backend.n_ctx
        self._eos = eos_ids
        self.share_prefix = True  # rows of one prompt feed it once (``engine/prefix.py``)

    def sites(self) -> list[str]:
        return self.backend.sites()

    def eos_ids(self) -> set[int]:
        """Tokens that end a row: the tokenizer's EOS and the model's generation config's."""
        if self._eos is not None:
            return set(self._eos)
        ids = {self.tokenizer.eos_token_id} | self.backend.generation_eos()
        return {i for i in ids if i is not None}

    def models(self) -> list[torch.nn.Module]:
        return list(self.backend.modules())

    def hook_count(self) -> int:
        return sum(count_hooks(m) for m in self.models())

    def remove_hooks(self) -> int:
        return sum(remove_hooks(m) for m in self.models())

    def check(self, requests: Sequence[Request], capture: Sequence[str] = ()) -> list[Site]:
        """Everything about ``requests`` that can fail, before any compute."""
        if not requests:
            raise ValueError("No requests: give at least one.")
        check_row_steers(self.backend, [r.steers for r in requests])
        return [resolve(name, self.sites()) for name in capture]

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
        """Decode ``requests`` as one batch, yielding ``Progress`` after every step.

        Checks run now; the model is touched from the first ``next``. A ``cache`` is
        continued and advanced in place (``fork`` it first to keep it). Finished rows leave
        the batch once half of it has (``compact``), unless the cache is kept or
        activations are captured.
        """
        sites = self.check(requests, capture)
        if cache is not None and cache.batch_size != len(requests):
            raise ValueError(
                f"The cache has {cache.batch_size} rows; got {len(requests)} requests."
            )
        if cache is not None and not use_cache:
            raise ValueError("Continuing a cache needs use_cache=True.")
        if any(not r.prompt for r in requests) and cache is None:
            raise ValueError("A request with no prompt tokens needs a cache to continue.")
        recorder = Recorder(sites) if sites else None
        keep = keep_cache or cache is not None
        compact = compact and not keep and recorder is None
        shared = None
        if self.share_prefix and cache is None and use_cache and recorder is None:
            shared = prefix.group_size(requests)
        return self._stream(list(requests), cache, keep, recorder, use_cache, wait,
                            description, compact, shared)  # fmt: skip

    def _stream(self, requests: list[Request], cache: KVCache | None, keep_cache: bool,
                recorder: Recorder | None, use_cache: bool, wait: float, description: str,
                compact: bool, shared: int | None = None) -> Iterator[Progress]:  # fmt: skip
        states = RowStates(self.tokenizer, requests)
        with calling(self.models(), description, wait=wait) as call:
            self._attach(requests, recorder, call)
            given, feed = cache, requests
            if shared is not None:  # each distinct prompt once, then every row goes on from it
                cache = self._shared_prefix(requests, shared, call)
                feed = prefix.last_tokens(requests)
            batch = Batch(self.backend, feed, cache, self.pad_id, use_cache)
            steps = decode(batch, states, call, eos_ids=self.eos_ids(), pad_id=self.pad_id,
                           compact=compact, keep_cache=keep_cache)  # fmt: skip
            lengths = [0] * len(requests)
            try:
                for index in steps:
                    before, lengths = lengths, [len(t) for t in states.tokens]
                    yield self._progress(index, states, lengths, before,
                                         _cache_of(batch, cache, keep_cache), recorder)  # fmt: skip
            finally:
                if given is not None:  # however the call ended, the cache holds what was fed
                    _settle(batch, given)

    def _progress(self, index: int, states: RowStates, lengths: list[int], before: list[int],
                  cache: Callable[[], KVCache | None],
                  recorder: Recorder | None) -> Progress:  # fmt: skip
        token_ids = [
            states.tokens[r][-1] if n > b else self.pad_id
            for r, (n, b) in enumerate(zip(lengths, before))
        ]
        reasons = [why if d else "length" for why, d in zip(states.reasons, states.done)]
        return Progress(index, token_ids, list(states.done), lengths, before, reasons, states,
                        cache, recorder)  # fmt: skip

    def _shared_prefix(self, requests: list[Request], k: int, call: Call) -> KVCache:
        """Feed each group's prompt (minus its last token) once; the cache, repeated k times."""
        batch = Batch(self.backend, prefix.prefixes(requests, k), None, self.pad_id, True)
        batch.rows = list(range(0, len(requests), k))  # call rows, for the steers' alphas
        batch.forward(call)
        return batch.cache().repeat(k)

    def _attach(self, requests: list[Request], recorder: Recorder | None, call: Call) -> None:
        for steer in group_steers([r.steers for r in requests]):
            attach_steer(self.backend, steer, call)
        if recorder is not None:
            recorder.attach(self.backend, call)

    def prefill(self, requests: Sequence[Request], *, cache: KVCache | None = None,
                wait: float = 0.0) -> KVCache:  # fmt: skip
        """Feed the requests' prompts (after ``cache``, if given) and return the cache; no
        token is sampled. The cache ends at the prompts' last token."""
        self.check(requests)
        if cache is not None and cache.batch_size != len(requests):
            raise ValueError(
                f"The cache has {cache.batch_size} rows; got {len(requests)} requests."
            )
        if not all(r.prompt for r in requests):
            raise ValueError("prefill needs at least one token per request.")
        with calling(self.models(), "prefill", wait=wait) as call:
            self._attach(list(requests), None, call)
            batch = Batch(self.backend, requests, cache, self.pad_id, use_cache=True)
            batch.forward(call)
        return _cache_of(batch, cache, keep=True)()  # type: ignore[return-value]

    def run(self, requests: Sequence[Request], *, wait: float = 0.0,
            compact: bool = True) -> list[Completion]:  # fmt: skip
        """Decode every request; one ``Completion`` per request, in order."""
        steps = self.stream(requests, wait=wait, description="run", compact=compact)
        (last,) = deque(steps, maxlen=1)
        return last.states.completions()

    def stream_completions(
        self, requests: Sequence[Request], *, wait: float = 0.0
    ) -> Iterator[tuple[int, list[Completion]]]:
        for progress in self.stream(requests, wait=wait, description="stream"):
            yield progress.index, progress.states.completions()

    def forward(
        self,
        requests: Sequence[Request],
        *,
        capture: Sequence[str] = (),
        last_only: bool = False,
        wait: float = 0.0,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """One forward pass over left-padded prompts: ``(logits, activations, ids, mask)``."""
        sites = self.check(requests, capture)
        recorder = Recorder(sites) if sites else None
        with calling(self.models(), "forward", wait=wait) as call:
            self._attach(list(requests), recorder, call)
            batch = Batch(self.backend, requests, None, self.pad_id, use_cache=False)
            logits = batch.forward(call, last_only=last_only)
        activations = recorder.stacked() if recorder else {}
        return logits, activations, batch.tokens, batch.mask


def _cache_of(batch: Batch, given: KVCache | None,
              keep: bool) -> Callable[[], KVCache | None]:  # fmt: skip
    def cache() -> KVCache | None:
        if not keep:
            return None
        built = batch.cache()
        if given is None:
            return built
        given.data, given.tokens, given.mask = built.data, built.tokens, built.mask
        given.generated = built.generated
        return given

    return cache


def _settle(batch: Batch, given: KVCache) -> None:
    """``given`` ends at the last column fed: a call cut short (an exception, a closed
    stream) leaves a cache that is valid up to the last finished token."""
    built = batch.cache()
    fed = batch.fed
    given.data = built.ops.crop(built.data, fed) if fed < built.length else built.data
    given.tokens, given.mask = built.tokens[:, :fed], built.mask[:, :fed]
    given.generated = built.generated[:, :fed]
