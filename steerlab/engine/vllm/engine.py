"""``VLLMEngine``: steerlab's requests decoded by vLLM, steered inside its workers.

Each row is one vLLM request in vLLM's continuous batch, its steers carried as data. The
engine checks everything before the first request is sent and sends each new vector once;
every worker hooks the sites a call needs when vLLM first schedules its requests there
(``SteerWorker.steerlab_attach``), and the call (``decoding.VLLMStream``) checks what the
hooks did and takes them off at its end. A steered row whose hooks fell short, or failed,
fails the call: never a silent no-op.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from steerlab.backends.cache import KVCache
from steerlab.core.identity import config_sha256
from steerlab.core.ops import SteerError, op_to_data, own_copy
from steerlab.core.positions import position_mask
from steerlab.core.prompts import PromptError
from steerlab.core.request import Completion, Request
from steerlab.core.scalars import flag
from steerlab.core.sites import all_sites
from steerlab.core.window import check_window
from steerlab.engine.guard import CallInFlightError
from steerlab.engine.plan import Plan
from steerlab.engine.progress import Progress, last
from steerlab.engine.protocol import Capabilities
from steerlab.engine.vllm.decoding import SteerHookError, VLLMStream
from steerlab.engine.vllm.graph import KINDS, touches_reason

__all__ = ["SteerHookError", "VLLMEngine"]  # SteerHookError: where callers look for it


class VLLMEngine:
    """Decodes requests with a ``vllm.LLM`` whose workers carry ``SteerWorker``.

    Build it with ``steerlab.load(..., backend="vllm")``.

    >>> lm = sl.load("steerlab-tiny", backend="vllm")  # needs vLLM  # doctest: +SKIP
    >>> lm.engine.run([Request((0, 17, 4), sampling=Sampling(max_new_tokens=5))])  # needs vLLM  # doctest: +SKIP
    """

    kind = "vllm"
    capabilities = Capabilities(join=True)

    def __init__(self, llm: Any, tokenizer: Any, *, eos_ids: set[int], pad_id: int,
                 revision: str | None = None) -> None:  # fmt: skip
        self.llm, self.tokenizer, self.pad_id = llm, tokenizer, pad_id
        config = llm.llm_engine.model_config
        text = config.hf_config.get_text_config()
        self.n_layers: int = text.num_hidden_layers
        self.d_model: int = text.hidden_size
        self.n_ctx: int | None = config.max_model_len
        self.n_vocab: int = config.get_vocab_size()
        self.dtype = config.dtype  # the weights' torch dtype, as vLLM loaded them
        # How many alternatives a score may list (vLLM's -1: all of them).
        self.max_logprobs: int = self.n_vocab if config.max_logprobs < 0 else config.max_logprobs
        self.revision = revision or ""
        self.overflows = 0  # steered rows that overflowed (their KV blocks were scrubbed)
        self.graph = False  # steering built into a compiled model (load_vllm sets it)
        self.why_eager = ""  # why it runs eagerly, or compiled (load_vllm sets it)
        self.graph_sites: frozenset[str] = frozenset()  # the sites built into the graph
        self.graph_kinds: frozenset[str] = frozenset(KINDS)  # what they compute
        self.config_sha256 = config_sha256(config.hf_config)  # the config vLLM loaded
        vllm_config = llm.llm_engine.vllm_config
        self.pipeline_stages: int = vllm_config.parallel_config.pipeline_parallel_size
        # whether vLLM may feed a prompt in several forwards (chunked prefill, or a cap on
        # long prefills): then no decision made over a whole prompt can precede its prompt
        scheduler = vllm_config.scheduler_config
        self.chunks_prompts: bool = bool(scheduler.enable_chunked_prefill
                                         or scheduler.long_prefill_token_threshold > 0)  # fmt: skip
        self._eos = set(eos_ids)
        self._sent: set[str] = set()  # vector keys every worker holds
        # sites whose hooks have steered on this engine, since a call last failed a check
        self.proven: set[str] = set()
        # Past this many, the workers drop their vectors at the end of a call (a server sent
        # many distinct inline vectors, say); the next call sends again what it needs.
        self.max_vectors = 4096
        self._lock = threading.Lock()  # one steerlab call at a time
        self._in_flight: str | None = None
        # vLLM's client talks to its engine over sockets that one thread may use at a time:
        # every use goes through this, including a hook count from a server's thread.
        self.client_lock = threading.RLock()

    def sites(self) -> list[str]:
        return all_sites(self.n_layers)

    @property
    def cache_namespace(self) -> str:
        """What steered rows' prefix-cache salts are namespaced by: the revision, and a new
        namespace after each overflow. The workers zero an overflowing row's NaN in its KV
        blocks (``SteerWorker._steerlab_scrub``), but vLLM may still list those blocks in
        its prefix cache under that steer's salt: a later request with the same steer must
        compute its own, never read zeros (it overflows again, as on a fresh engine)."""
        return self.revision + (f"#overflow{self.overflows}" if self.overflows else "")

    def overflowed(self, error: Exception) -> Exception:
        """Count a steered row's overflow (see ``cache_namespace``); returns ``error``."""
        self.overflows += 1
        return error

    def eos_ids(self) -> set[int]:
        return set(self._eos)

    def rpc(self, method: str, *args: Any) -> list[Any]:
        """``SteerWorker.<method>(*args)`` on every worker, one result each."""
        with self.client_lock:
            return self.llm.collective_rpc(method, args=args)

    def hook_count(self) -> int:
        """Steerlab hooks on the model in every worker: 0 whenever no call is running."""
        return sum(self.rpc("steerlab_hook_count"))

    def remove_hooks(self, wait: float = 60.0) -> int:
        """Remove hooks left behind; waits up to ``wait`` s for a running call to end first
        (its hooks are its own), then raises ``CallInFlightError``."""
        with self.exclusive("remove_hooks", wait):
            return sum(self.rpc("steerlab_end"))

    def sweep_hooks(self) -> int:
        """Remove hooks no call owns; nothing while a call is in flight (its hooks are its
        own). The engine is held only while there are hooks to remove."""
        if not self.hook_count():
            return 0
        try:
            return self.remove_hooks(wait=0.0)
        except CallInFlightError:
            return 0

    def close(self) -> None:
        """Shut vLLM's engine processes down (``lm.engine.close()``); the model is unusable after."""
        with self.client_lock:
            self.llm.llm_engine.engine_core.shutdown()

    def check(self, requests: Sequence[Request], capture: Sequence[str] = ()) -> None:
        """Everything about ``requests`` that can fail, before any request is sent."""
        if not requests:
            raise ValueError("No requests: give at least one.")
        valid = self.sites()
        checked: set[tuple] = set()  # the steers' parts checked (the objects are held here)
        for r in requests:
            if not r.prompt:
                raise PromptError("The vLLM engine needs at least one prompt token per request.")
            top = max(r.sampling.logprobs or 0, r.sampling.prompt_logprobs or 0)
            if min(top, self.n_vocab) > self.max_logprobs:
                raise ValueError(
                    f"{top} most likely tokens asked for, but this vLLM engine lists at most "
                    f"{self.max_logprobs} (its max_logprobs): load with vllm_args="
                    f"{{'max_logprobs': {min(top, self.n_vocab)}}}."
                )
            # vLLM samples a token even for a row that only scores its prompt (one dropped)
            scoring_only = r.sampling.max_new_tokens == 0
            check_window(self.n_ctx, len(r.prompt), max(r.sampling.max_new_tokens, 1),
                         hint=" (vLLM's max_model_len; load with a larger one"
                         + ("; vLLM samples one token even where only the prompt is scored)"
                            if scoring_only else ")"))  # fmt: skip
            r.sampling.check_vocab(self.n_vocab)
            for steer in r.steers:
                # rows that differ by alpha share their steer's parts: checked once a call
                parts = (steer.site, id(steer.vector), id(steer.op), id(steer.when),
                         repr(steer.positions))  # fmt: skip
                if parts not in checked:
                    steer.check(valid, self.d_model)
                    op_to_data(steer.op)  # a custom callable cannot travel to vLLM's workers
                    checked.add(parts)
        why = reads_reason(requests, self.pipeline_stages, self.chunks_prompts)
        if why is not None:
            raise SteerError(f"The vLLM engine cannot run this: {why}.")

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
        self._check_call(cache, keep_cache, capture, use_cache)
        self.check(requests)
        return VLLMStream(self, list(requests), wait, description)

    def _check_call(self, cache: KVCache | None, keep_cache: bool, capture: Sequence[str],
                    use_cache: bool) -> None:  # fmt: skip
        """The checks of a ``stream`` call's options, before any compute (``explain`` runs
        them too; what ``check`` refuses in the rows, ``explain`` says)."""
        keep_cache, _ = flag(keep_cache, "keep_cache"), flag(use_cache, "use_cache")
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

    def run(self, requests: Sequence[Request], *, wait: float = 0.0) -> list[Completion]:
        """Decode every request; one ``Completion`` per request, in order."""
        final = last(self.stream(requests, wait=wait, description="run"))
        return final.states.completions()

    def forward(self, requests: Sequence[Request], **_: Any) -> Any:
        raise NotImplementedError(
            "The vLLM engine samples tokens; it does not return full logits or activations. "
            "Use backend='hf' or 'bridge' for lm.logits and lm.run_with_cache."
        )

    def compile(self, **_: Any) -> None:
        raise NotImplementedError(
            "vLLM compiles at load, not afterwards: sl.load(..., backend='vllm') builds "
            "steerlab's steering into vLLM's compiled graph (unless loaded with "
            "vllm_args={'enforce_eager': True}); lm.compile() is the in-process engine's."
        )

    def explain(self, requests: Sequence[Request], *, capture: Sequence[str] = (),
                cache: KVCache | None = None, keep_cache: bool = False,
                use_cache: bool = True) -> str:  # fmt: skip
        """One line: how vLLM runs these requests; a call ``stream`` refuses is refused."""
        self._check_call(cache, keep_cache, capture, use_cache)
        why = reads_reason(requests, self.pipeline_stages, self.chunks_prompts)
        if why is not None:
            return f"refused: {why}"
        mode = f" ({self.why_eager})" if self.why_eager else ""
        if self.graph:
            built, kinds = len(self.graph_sites), sorted(self.graph_kinds)
            held = "" if self.graph_kinds == set(KINDS) else f" (computing only {kinds})"
            text = (f"vllm compiled{mode}: vLLM runs its compiled model, with steering built "
                    f"in at {built} site{'s' * (built != 1)}{held}, whose steers read each "
                    "forward's rows from static buffers" if built else
                    f"vllm compiled{mode}: vLLM runs plain vLLM's compiled graph (no steering "
                    "built in: load with graph=[sites] to build some)")  # fmt: skip
            if any(r.reads for r in requests):
                text += ("; conditions and monitors are read inside the graph and handed over "
                         "after each forward (a decision gates the tokens generated after "
                         "it), with no prefix-cache reads for these rows")  # fmt: skip
            uncompiled = uncompiled_reason(requests, self.graph_sites, self.graph_kinds)
            if uncompiled is not None:
                text += (f"; the forwards that need it run uncompiled (vLLM's skip_compiled, "
                         f"the eager path, slower): {uncompiled}")  # fmt: skip
            return text
        text = f"vllm eager{mode}: the vLLM engine decodes every call eagerly in its workers"
        if any(r.reads for r in requests):
            text += ("; conditions are decided and monitors read there, at prefill and each "
                     "step, with no prefix-cache reads for these rows")  # fmt: skip
        return text

    def prefill(self, requests: Sequence[Request], **_: Any) -> KVCache:
        raise NotImplementedError(
            "The vLLM engine keeps its KV cache inside vLLM; use backend='hf' for prefill."
        )

    @contextmanager
    def exclusive(self, description: str, wait: float) -> Iterator[None]:
        """Hold the engine for one call (a paused stream holds it too), waiting up to
        ``wait`` s for another to end, else ``CallInFlightError``."""
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

    def send_vectors(self, requests: Sequence[Request], plan: Plan | None = None) -> None:
        """Every worker gets each new vector (and operation tensor, such as a feature clamp's
        encoder, and each condition's and monitor's direction) once, as safetensors bytes
        keyed by its content hash. ``plan``: ``Plan.of(requests)``, where made already (its
        steers are the distinct steers of every row)."""
        from safetensors.torch import save

        tensors = (plan or Plan.of(requests)).tensors()
        # a LoReFT's vector is a view of its R: each is sent as a tensor of its own
        new = {key: own_copy(t) for key, t in tensors.items() if key not in self._sent}
        if new:
            self.rpc("steerlab_put_vectors", save(new))
            self._sent |= set(new)

    def trim_vectors(self, everything: bool = False) -> None:
        """Between calls: drop every vector the workers hold once there are too many, or
        (``everything``) after a worker failed a call: the engine can no longer tell which
        vectors the workers hold (one that lost a vector would fail every later call that
        steers with it), so the next call sends what it needs again."""
        if everything or len(self._sent) > self.max_vectors:
            self.rpc("steerlab_drop_vectors")
            self._sent.clear()


def uncompiled_reason(requests: Sequence[Request], built: frozenset[str],
                      kinds: frozenset[str] = frozenset(KINDS)) -> str | None:  # fmt: skip
    """Why some forwards of ``requests`` will run uncompiled on a compiled model whose
    graph holds the sites ``built`` and the ``kinds``, or None: the worker's per-forward rule
    (``graph.eager_reason``) read off each row's steers over its prompt and the tokens it
    may generate, and the sites its conditions and monitors read, as ``explain`` reports
    it. A batch that outgrows the buffers (``graph.GraphFull``) depends on what vLLM
    schedules together, so it is not foreseen here."""
    plan = Plan.of(requests)
    for i in range(plan.rows):
        n = len(requests[i].prompt)
        at = np.arange(n + max(requests[i].sampling.max_new_tokens, 1))
        masks = [(s, position_mask(s.positions, at, at >= n, n))
                 for s, alpha in plan.of_row(i) if alpha != 0]  # fmt: skip
        touches = ((s.site, s.op, s.gate, m, bool(m[:n].any())) for s, m in masks)
        why = touches_reason(touches, built, plan.read_sites(i), kinds)
        if why is not None:
            return why
    return None


def reads_reason(requests: Sequence[Request], stages: int, chunks_prompts: bool) -> str | None:
    """What of ``requests``' conditions vLLM's workers cannot do exactly, or None.

    A worker decides a condition from the activations it holds, so the condition and the
    steer it gates must be on one pipeline stage: with several stages, conditions are
    refused. A prompt condition is summed across the chunks of a chunked prefill, which is
    exact for a steer on generated tokens. A conditioned steer that touches the prompt needs
    the decision before it acts on it, so it needs every prompt fed in one forward: vLLM
    promises that only with chunked prefill off (it may otherwise split any prompt, short
    ones too, when a step's token budget is shared).
    """
    if all(s.when is None for r in requests for s in r.steers):
        return None  # nothing gated
    plan = Plan.of(requests)
    gated = [(requests[r], s) for r in range(plan.rows) for s, _ in plan.of_row(r)
             if s.gate is not None]  # fmt: skip
    if gated and stages > 1:
        return (f"a conditioned steer (when=) on {stages} pipeline stages: a worker decides "
                "from the activations it holds, and a condition's site and its steer's may sit "
                "on different stages; use tensor parallelism, or an in-process backend")  # fmt: skip
    if not chunks_prompts:
        return None
    for r, s in gated:
        n = len(r.prompt)
        at = np.arange(n)
        if s.gate.per_token or not position_mask(s.positions, at, at >= n, n).any():  # type: ignore[union-attr]
            continue
        return (f"a steer at {s.site} on prompt tokens, gated by a whole-prompt condition: "
                "vLLM may feed a prompt in chunks (chunked prefill, on here), so the decision "
                "could come after the steer had to act. Use positions='generated', or load "
                "with vllm_args={'enable_chunked_prefill': False} (and no "
                "long_prefill_token_threshold)")  # fmt: skip
    return None
