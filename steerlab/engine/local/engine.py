"""``LocalEngine``: the in-process engine, the decode loop plus hooks on one backend."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from steerlab.backends.base import Backend
from steerlab.backends.cache import KVCache
from steerlab.core.request import Completion, Request
from steerlab.core.scalars import flag
from steerlab.core.sites import Site, resolve, site_names
from steerlab.core.tagging import count_hooks, remove_hooks
from steerlab.core.window import check_window
from steerlab.engine.batch import Batch
from steerlab.engine.guard import Call, CallInFlightError, calling
from steerlab.engine.local import prefix
from steerlab.engine.local.capture import Recorder
from steerlab.engine.local.loop import decode
from steerlab.engine.local.path import Path, choose
from steerlab.engine.local.prompt_store import PromptStore, model_state
from steerlab.engine.local.scored import ScoredRows, prefill_scored
from steerlab.engine.local.steering import attach_steer, check_row_steers
from steerlab.engine.plan import Plan
from steerlab.engine.progress import Progress, last
from steerlab.engine.protocol import Capabilities
from steerlab.engine.reads import CallReads
from steerlab.engine.state import RowStates

if TYPE_CHECKING:
    from steerlab.engine.compiled import CompiledStep
    from steerlab.engine.compiled.batch import StaticBatch

log = logging.getLogger(__name__)


class LocalEngine:
    """Decodes requests in this process, steering through hooks on ``backend``.

    Its decode step is a strategy: eager by default; after ``compile()`` a compiled step
    (``engine/compiled/``) takes every call that fits it, and ``explain`` says which path a
    call takes and why.

    >>> from steerlab.core.request import Sampling
    >>> engine = LocalEngine(lm.backend, lm.tokenizer, pad_id=0)
    >>> ids = tuple(lm.tokenizer.encode("Once upon a time"))
    >>> [done] = engine.run([Request(ids, sampling=Sampling(max_new_tokens=5))])
    >>> done.text, done.finish_reason
    (', there was a little', 'length')
    """

    capabilities = Capabilities(custom_ops=True, cache_reuse=True, capture=True, forward=True,
                                compile=True)  # fmt: skip

    def __init__(self, backend: Backend, tokenizer: Any, *, pad_id: int,
                 eos_ids: set[int] | None = None) -> None:  # fmt: skip
        self.backend, self.tokenizer, self.pad_id = backend, tokenizer, pad_id
        self.kind = backend.kind
        self.n_layers, self.d_model, self.n_ctx = backend.n_layers, backend.d_model, backend.n_ctx
        self.n_vocab = backend.n_vocab
        self._eos = eos_ids
        self.share_prefix = True  # rows of one prompt feed it once (``engine/prefix.py``)
        # scored prompts kept for later scoring calls (``local/prompt_store.py``); None: off
        self.prompt_store: PromptStore | None = PromptStore()
        self.compiled: CompiledStep | None = None

    def compile(self, *, mode: str | None = None, backend: str = "inductor") -> None:
        """Decode through a compiled step from now on, wherever a call fits it."""
        from steerlab.engine.compiled import CompiledStep

        if self.compiled is None:
            self.compiled = CompiledStep(self, mode=mode, backend=backend)

    def explain(self, requests: Sequence[Request], *, capture: Sequence[str] = (),
                cache: KVCache | None = None, keep_cache: bool = False,
                use_cache: bool = True, compact: bool = True) -> str:  # fmt: skip
        """One line: which path these requests take (``local/path.py``), and why; a call
        that ``stream`` refuses is refused here, by the same checks."""
        return self._path(requests, cache, keep_cache, capture, use_cache, compact).line

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

    def sweep_hooks(self) -> int:
        """Remove hooks no call owns; returns how many. A call in flight (another thread's,
        or a paused stream) owns the hooks on its model, so then nothing is touched. The
        model is held only while there are hooks to remove, so a sweep after every batch
        never refuses another thread's call."""
        if not self.hook_count():
            return 0
        try:
            with calling(self.models(), "a sweep for hooks left behind"):
                return self.hook_count()  # leaving the call removes them
        except CallInFlightError:
            return 0

    def check(self, requests: Sequence[Request], capture: Sequence[str] = (), cached: int = 0,
              generating: bool = True) -> list[Site]:  # fmt: skip
        """Everything about ``requests`` that can fail, before any compute."""
        if not requests:
            raise ValueError("No requests: give at least one.")
        for r in requests:  # a forward (prefill, logits) feeds its prompt and samples nothing
            new = r.sampling.max_new_tokens if generating else 0
            check_window(self.n_ctx, len(r.prompt) + cached, new)
            r.sampling.check_vocab(self.n_vocab)
        check_row_steers(self.backend, [r.steers for r in requests])
        sites = self.sites()
        return [resolve(name, sites) for name in capture]

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
        path = self._path(requests, cache, keep_cache, capture, use_cache, compact)
        if path.kind == "eager" and self.compiled is not None:
            log.debug("steerlab: %s runs eagerly: %s", description, path.why)
        return self._stream(list(requests), path, wait, description)

    def _path(self, requests: Sequence[Request], cache: KVCache | None, keep_cache: bool,
              capture: Sequence[str], use_cache: bool, compact: bool) -> Path:  # fmt: skip
        """Every check of a ``stream`` call's options, before any compute, then its path."""
        keep_cache, use_cache = flag(keep_cache, "keep_cache"), flag(use_cache, "use_cache")
        compact = flag(compact, "compact")
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache (from keep_cache=True); got {cache!r:.60}.")
        sites = self.check(requests, site_names(capture, "capture"),
                           cache.length if cache is not None else 0)  # fmt: skip
        if cache is not None and cache.batch_size != len(requests):
            raise ValueError(
                f"The cache has {cache.batch_size} rows; got {len(requests)} requests."
            )
        if cache is not None and not use_cache:
            raise ValueError("Continuing a cache needs use_cache=True.")
        if any(not r.prompt for r in requests) and cache is None:
            raise ValueError("A request with no prompt tokens needs a cache to continue.")
        if cache is not None and any(r.sampling.prompt_logprobs is not None for r in requests):
            raise ValueError("Scoring a prompt (prompt_logprobs) reads the logits of every "
                             "prompt token, so it cannot continue a cache: drop cache=.")  # fmt: skip
        return choose(self, requests, sites=sites, cache=cache, keep_cache=keep_cache,
                      use_cache=use_cache, compact=compact)  # fmt: skip

    def _stream(self, requests: list[Request], path: Path, wait: float,
                description: str) -> Iterator[Progress]:  # fmt: skip
        plan = path.plan if path.plan is not None else Plan.of(requests)
        states = RowStates(self.tokenizer, requests)
        reads = CallReads(plan)
        states.reads = reads if reads else None
        recorder = Recorder(path.sites) if path.sites else None
        with calling(self.models(), description, wait=wait) as call:
            self._attach(plan, recorder, call, reads)
            given, cache, feed = path.cache, path.cache, requests
            if path.shared is not None:  # each distinct prompt once, then every row goes on
                cache = self._shared_prefix(requests, path.shared, call)
                reads.spread(path.shared)
                feed = prefix.last_tokens(requests)
            batch: Batch | StaticBatch | ScoredRows
            first = None
            if path.kind == "scored":  # each shared start fed once, this call's and earlier
                store = self.prompt_store if self.prompt_store is not None else PromptStore(0)
                use = store.sync(model_state(self.models()))
                first = prefill_scored(self.backend, requests, call, self.pad_id, store, use)
                batch = ScoredRows(requests)
            elif path.kind == "compiled":  # eager prefill, then one compiled graph per step
                assert self.compiled is not None
                batch = self.compiled.batch(requests, plan, reads)
            else:
                batch = Batch(self.backend, feed, cache, self.pad_id, path.use_cache)
            steps = decode(batch, states, call, eos_ids=self.eos_ids(), pad_id=self.pad_id,
                           compact=path.compact, keep_cache=path.keep_cache,
                           first=first)  # fmt: skip
            kept = _cache_of(batch, cache, path.keep_cache) if isinstance(batch, Batch) else _none
            lengths = [0] * len(requests)
            try:
                for index in steps:
                    progress = Progress.after(index, states, lengths, self.pad_id, cache=kept,
                                              recorder=recorder)  # fmt: skip
                    lengths = progress.lengths
                    yield progress
            finally:
                if given is not None:  # however the call ended, the cache holds what was fed
                    assert isinstance(batch, Batch)
                    _settle(batch, given)

    def _shared_prefix(self, requests: list[Request], k: int, call: Call) -> KVCache:
        """Feed each group's prompt (minus its last token) once; the cache, repeated k times."""
        batch = Batch(self.backend, prefix.prefixes(requests, k), None, self.pad_id, True)
        batch.rows = list(range(0, len(requests), k))  # call rows, for the steers' alphas
        batch.prompt_len = batch.prompt_len + 1  # a span counts the whole prompt's length
        batch.forward(call)
        return batch.cache().repeat(k)

    def _attach(self, plan: Plan, recorder: Recorder | None, call: Call,
                reads: CallReads | None = None) -> None:  # fmt: skip
        """Hooks in the order they must run at one site: conditions read what the steers are
        given, steers act, then monitors and the recorder read what the next layer sees."""
        reads = reads if reads is not None else CallReads(plan)
        reads.attach_conditions(self.backend, call)
        for steer in plan.live():
            attach_steer(self.backend, steer, call, reads)
        reads.attach_monitors(self.backend, call)
        if recorder is not None:
            recorder.attach(self.backend, call)

    def prefill(self, requests: Sequence[Request], *, cache: KVCache | None = None,
                wait: float = 0.0) -> KVCache:  # fmt: skip
        """Feed the requests' prompts (after ``cache``, if given) and return the cache; no
        token is sampled. The cache ends at the prompts' last token."""
        self.check(requests, cached=cache.length if cache is not None else 0, generating=False)
        if cache is not None and cache.batch_size != len(requests):
            raise ValueError(
                f"The cache has {cache.batch_size} rows; got {len(requests)} requests."
            )
        if not all(r.prompt for r in requests):
            raise ValueError("prefill needs at least one token per request.")
        with calling(self.models(), "prefill", wait=wait) as call:
            self._attach(Plan.of(requests), None, call)
            batch = Batch(self.backend, requests, cache, self.pad_id, use_cache=True)
            batch.forward(call)
        return _cache_of(batch, cache, keep=True)()  # type: ignore[return-value]

    def run(self, requests: Sequence[Request], *, wait: float = 0.0,
            compact: bool = True) -> list[Completion]:  # fmt: skip
        """Decode every request; one ``Completion`` per request, in order."""
        steps = self.stream(requests, wait=wait, description="run", compact=compact)
        return last(steps).states.completions()

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
        last: Sequence[int] | None = None,
        wait: float = 0.0,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """One forward pass over left-padded prompts: ``(logits, activations, ids, mask)``.

        With ``last``, the logits of each row's last ``last[i]`` positions only, packed row
        by row ``[sum(last), vocab]``: the LM head multiplies nothing else where the backend
        can skip it (padding included)."""
        sites = self.check(requests, capture, generating=False)
        recorder = Recorder(sites) if sites else None
        with calling(self.models(), "forward", wait=wait) as call:
            self._attach(Plan.of(requests), recorder, call)
            batch = Batch(self.backend, requests, None, self.pad_id, use_cache=False)
            logits = batch.forward(call, last_only=last_only, keep=_last_columns(batch, last))
        activations = recorder.stacked() if recorder else {}
        return logits, activations, batch.tokens, batch.mask


def _none() -> None:
    return None


def _last_columns(batch: Batch, last: Sequence[int] | None) -> torch.Tensor | None:
    """Per row of a left-padded batch, its last ``last[i]`` columns (None: every column)."""
    if last is None:
        return None
    columns = torch.arange(batch.tokens.shape[1])
    return columns[None, :] >= batch.tokens.shape[1] - torch.tensor(list(last))[:, None]


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
