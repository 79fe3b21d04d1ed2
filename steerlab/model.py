"""``SteerableModel``: one steerable language model, whatever the backend or engine."""

from __future__ import annotations

import html
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from steerlab.backends.base import Backend, hf_config
from steerlab.backends.cache import KVCache
from steerlab.core.activations import Activations
from steerlab.core.doors import takes_options
from steerlab.core.identity import config_sha256 as model_config_sha256
from steerlab.core.prompts import Prompt
from steerlab.core.request import Request, Sampling
from steerlab.core.results import Generation, Step
from steerlab.core.rows import Rows, SteerArg, as_steers, checked_monitors, lay_out
from steerlab.core.scalars import flag
from steerlab.core.sites import resolve, site_names
from steerlab.engine.local import LocalEngine
from steerlab.engine.protocol import Engine
from steerlab.engine.steps import OnToken, steps

_PROVIDED: dict[str, Callable[..., Any]] = {}


def provide(name: str, factory: Callable[..., Any]) -> None:
    """Give the method ``lm.<name>(...)`` its implementation, from the layer that owns it.

    Called once by a capability package above the facade when it is imported (and
    ``import steerlab`` imports them all). The method itself stays on ``SteerableModel``,
    with its signature and docstring, where ``help(lm)``, completion and the type checker
    find it; only the body is looked up here. It is the clearest way to offer
    ``lm.<name>(...)`` while imports point down: importing the capability here, even
    inside the method, would point up and close a cycle; attaching methods to the class
    from outside would hide them from the class's source and from the type checker; and
    dropping the methods would break the public API.
    """
    _PROVIDED[name] = factory


def _provided(name: str) -> Callable[..., Any]:
    if name not in _PROVIDED:
        raise RuntimeError(f"lm.{name}() is provided by steerlab.{name}: import steerlab first.")
    return _PROVIDED[name]


class SteerableModel:
    """A model plus tokenizer behind one API: ``generate``, ``stream``, ``run_with_cache``.

    Build one with ``steerlab.load`` or ``steerlab.wrap``. Calls go to an engine (the
    in-process ``LocalEngine`` over ``backend``, unless another one is given).

    >>> lm = sl.load("steerlab-tiny")
    >>> lm.generate("Once upon a time", max_new_tokens=5).text
    [', there was a little']
    """

    def __init__(
        self,
        backend: Backend | None,
        tokenizer: Any,
        name: str = "",
        revision: str | None = None,
        *,
        engine: Engine | None = None,
        config_sha256: str | None = None,
    ) -> None:
        if backend is None and engine is None:
            raise ValueError("SteerableModel needs a backend, an engine, or both.")
        self.backend = backend  # None when the engine runs the model in other processes
        self.tokenizer = tokenizer
        self.name = name
        self.revision = revision  # the hub revision it was loaded at, when one was asked for
        # What the model is, beside its name (core.identity): recorded in the provenance of
        # vectors made on it, and compared with theirs. From the backend's HF config unless
        # given (a HookedTransformer keeps none; vLLM's engine knows the config it loaded).
        if config_sha256 is None:
            config = hf_config(backend.model) if backend is not None else None
            config_sha256 = model_config_sha256(config)
        self.config_sha256: str = config_sha256
        self.engine: Engine = engine or LocalEngine(backend, tokenizer, pad_id=self.pad_id)  # type: ignore[arg-type]
        self._sites = self.engine.sites()

    @property
    def model(self) -> torch.nn.Module:
        if self.backend is None:
            raise AttributeError(
                f"The {self.engine.kind} engine holds the model in its own worker processes, "
                "not in this one: lm.model is not available here."
            )
        return self.backend.model

    @property
    def n_layers(self) -> int:
        return self.engine.n_layers

    @property
    def d_model(self) -> int:
        return self.engine.d_model

    @property
    def n_ctx(self) -> int | None:
        return self.engine.n_ctx

    @property
    def n_vocab(self) -> int:
        """Logits per position (the ids ``logit_bias`` may name are below it)."""
        return self.engine.n_vocab

    def sites(self) -> list[str]:
        """Canonical TransformerLens site names available on this model, in forward order."""
        return list(self._sites)

    def hook_count(self) -> int:
        """Steerlab hooks currently on the model: 0 whenever no call is running."""
        return self.engine.hook_count()

    def remove_hooks(self) -> int:
        """Remove every steerlab hook from the model (an emergency exit); returns how many."""
        return self.engine.remove_hooks()

    @property
    def eos_ids(self) -> set[int]:
        """Tokens that end a row: the tokenizer's EOS and the model's generation config's."""
        return self.engine.eos_ids()

    @property
    def pad_id(self) -> int:
        for candidate in (self.tokenizer.pad_token_id, self.tokenizer.eos_token_id, 0):
            if candidate is not None:
                return candidate
        return 0

    def compile(self, *, mode: str | None = None, backend: str = "inductor") -> SteerableModel:
        """Decode through a static KV cache and one compiled step per bucket; returns ``self``.

        Steering stays data (moving alpha never recompiles). Calls the compiled step cannot
        take run eagerly; ``explain`` says which path a call takes. Compiling happens on
        the first call of each batch-size and length bucket.

        >>> fast = sl.load("steerlab-tiny", backend="hf").compile()  # compiles on first use
        >>> fast.explain("Once upon a time")
        'compiled: batch bucket 1, length bucket 64, mode default'
        """
        if not self.engine.capabilities.compile:
            raise TypeError(
                f"compile() needs the in-process engine; this model decodes on {self.engine.kind!r}."
            )
        self.engine.compile(mode=mode, backend=backend)
        return self

    def explain(
        self,
        request: Request | Sequence[Request] | Prompt | Sequence[Prompt],
        steer: SteerArg = None,
        *,
        chat: bool = False,
        capture: str | Sequence[str] = (),
        use_cache: bool = True,
        cache: KVCache | None = None,
        keep_cache: bool = False,
        monitor: Any = None,
        **options: Any,
    ) -> str:
        """Which path a call would take, and why: ``scored`` (rows that only score their
        prompts), ``compiled`` (after ``compile()``, a call that fits the compiled step) or
        ``eager`` (with the shared prefix when rows repeat one prompt); the one choice the
        engine acts on (``engine/local/path.py``).

        Takes engine ``Request`` rows, or the prompts, steer and options of a ``generate``
        call (its generation options, ``temperature`` ..., go into the rows). A call that
        ``generate`` refuses is refused here the same way, by the same checks.

        >>> fast = sl.load("steerlab-tiny", backend="hf").compile()
        >>> fast.explain("Once", capture=["blocks.0.hook_resid_post"])
        'eager: capturing activations (capture=)'
        """
        given: Any = request
        if isinstance(given, Request):
            requests: list[Request] = [given]
        elif isinstance(given, (list, tuple)) and given and isinstance(given[0], Request):
            requests = list(given)
        else:
            _, requests, _, call = self._call(given, steer, options, where="explain", chat=chat,
                                              capture=capture, use_cache=use_cache, cache=cache,
                                              keep_cache=keep_cache, monitor=monitor)  # fmt: skip
            return self.engine.explain(requests, **call)
        named = [*sorted(options), *["monitor"] * (monitor is not None),
                 *["chat"] * flag(chat, "chat")]  # fmt: skip
        if named:
            raise TypeError(f"explain() of Request rows takes the call options capture, "
                            f"use_cache, cache and keep_cache; {named[0]!r} belongs in the "
                            "rows themselves.")  # fmt: skip
        return self.engine.explain(requests, capture=site_names(capture, "capture"),
                                   use_cache=use_cache, cache=cache, keep_cache=keep_cache)  # fmt: skip

    def _call(self, prompts: Any, steer: SteerArg, options: dict[str, Any], *, where: str,
              chat: Any, capture: Any, use_cache: Any, cache: Any, keep_cache: Any,
              monitor: Any) -> tuple[Rows, list[Request], Sampling, dict[str, Any]]:  # fmt: skip
        """What ``stream``, ``generate`` and ``explain`` check before any compute, in one
        place: the rows, their requests, the sampling, and the engine's call options."""
        sampling = Sampling.of(options, where=where)
        chat, use_cache = flag(chat, "chat"), flag(use_cache, "use_cache")
        keep_cache, sites = flag(keep_cache, "keep_cache"), site_names(capture, "capture")
        if sites and not use_cache:
            raise ValueError("capture needs use_cache=True.")
        monitors = checked_monitors(self, monitor)
        rows = self._rows(prompts, steer, chat, sampling.max_new_tokens, cache)
        call = {"cache": cache, "keep_cache": keep_cache, "capture": sites, "use_cache": use_cache}
        return rows, rows.requests(sampling, monitors), sampling, call

    @takes_options
    def stream(
        self,
        prompts: Prompt | Sequence[Prompt] | None,
        steer: SteerArg = None,
        *,
        chat: bool = False,
        capture: str | Sequence[str] = (),
        use_cache: bool = True,
        cache: KVCache | None = None,
        keep_cache: bool = False,
        wait: float = 0.0,
        on_token: OnToken | None = None,
        monitor: Any = None,
        **options: Any,
    ) -> Iterator[Step]:
        """Generate token by token, yielding a ``Step`` after each new token.

        Hooks are on only while the stream runs; closing the generator early removes them.
        Arguments are those of ``generate``; everything is checked before the first forward.
        """
        rows, requests, sampling, call = self._call(
            prompts, steer, options, where="stream", chat=chat, capture=capture,
            use_cache=use_cache, cache=cache, keep_cache=keep_cache, monitor=monitor,
        )  # fmt: skip
        progress = self.engine.stream(requests, wait=wait, **call,
                                      description=f"stream of {len(rows.encoded)} rows")  # fmt: skip
        return steps(progress, rows, sampling.seed, on_token)

    def _rows(self, prompts: Any, steer: SteerArg, chat: bool, new: int,
              cache: KVCache | None) -> Rows:  # fmt: skip
        if cache is None:
            if prompts is None:
                raise ValueError("prompts is None: give a prompt, or a cache= to continue.")
            return lay_out(self, prompts, steer, chat=chat, new_tokens=new)
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache (from keep_cache=True); got {cache!r:.60}.")
        k = max([len(s.alpha) for s in as_steers(steer)] or [1])
        if prompts is None:
            prompts = [""] * max(cache.batch_size // k, 1)
        rows = lay_out(self, prompts, steer, chat=chat, new_tokens=new, continuing=cache.length)
        if len(rows.encoded) != cache.batch_size:
            raise ValueError(
                f"The cache has {cache.batch_size} rows but this call lays out "
                f"{len(rows.encoded)} (prompts x alphas)."
            )
        return rows

    @takes_options
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt] | None,
        steer: SteerArg = None,
        *,
        chat: bool = False,
        capture: str | Sequence[str] = (),
        use_cache: bool = True,
        cache: KVCache | None = None,
        keep_cache: bool = False,
        wait: float = 0.0,
        on_token: OnToken | None = None,
        monitor: Any = None,
        **options: Any,
    ) -> Generation:
        """Generate completions, steered or not, one row per prompt x alpha.

        Args:
            prompts: a string, a list of messages (with ``chat=True``), or a list of either;
                with ``cache=``, text to append to each cached row (None for none).
            steer: a ``Steer``, a list of them, or a steering vector times alpha.
            {options}
            chat: apply the tokenizer's chat template (a string is the user turn).
            capture: sites whose activations to keep over prompt and new tokens.
            use_cache: decode through the KV cache (False recomputes the whole sequence).
            cache: a ``KVCache`` to continue (advanced in place; ``fork()`` it to keep it).
                Positions, and what ``positions="prompt"/"generated"`` mean, continue.
            keep_cache: return the cache in ``Generation.cache``, ending at the text's end.
            wait: seconds to queue behind another call on this model (a paused stream, a
                panel, another thread); 0 refuses at once, naming the call in flight.
            on_token: called with each ``Step`` as it is made (token ids, text so far,
                logprobs, captured activations). An exception in it stops generation
                cleanly (no hooks left; a kept cache is valid to the last token fed) and
                propagates.
            monitor: projections to read at every token while generating: a dict of name
                -> ``vector.at(site)`` or ``(site, vector)``; ``out.monitors[name]`` holds
                them (``MonitorTrace``). Monitors never change a token.

        A steer with ``when=`` (``sl.Condition``) acts only on rows whose prompt fires it:
        ``out.fired`` and ``out.condition_scores`` say which did, and on what score.

        >>> lm.generate("Once upon a time", max_new_tokens=10).text
        [', there was a little cat called Finn. The']
        """
        steps = self.stream(prompts, steer, chat=chat, capture=capture, use_cache=use_cache,
                            cache=cache, keep_cache=keep_cache, wait=wait, on_token=on_token,
                            monitor=monitor, **options)  # fmt: skip
        (last,) = deque(steps, maxlen=1)  # max_new_tokens >= 1: there is a last step
        return last.result()

    def chat(self, system: str | None = None, steer: SteerArg = None, *,
             overflow: str = "error") -> Any:  # fmt: skip
        """A chat session: the system prompt is fed once, then each turn feeds what it adds.

        Args:
            system: the system prompt (None for none).
            steer: steers for every turn; ``chat.steer = ...`` changes them between turns.
            overflow: ``"error"`` refuses a turn past the context window before any
                compute; ``"drop_oldest"`` drops whole old exchanges (never the system
                prompt) until it fits.

        >>> chat = lm.chat(system="You are terse.")
        >>> chat.say("Hello!", max_new_tokens=8).text[0]  # the toy is no chat model: a story
        'Once upon a time, there was a'
        """
        return _provided("chat")(self, system, steer, overflow=overflow)

    def features(self, prompts: Prompt | Sequence[Prompt], sae: Any, *, k: int = 16,
                 dense: bool = False, steer: SteerArg = None,
                 chat: bool = False) -> Any:  # fmt: skip
        """What the SAE ``sae`` reads at ``sae.site`` over ``prompts``, as activations.

        Keeps the top ``k`` features per token; ``dense=True`` also keeps ``acts.values``
        ``[batch, pos, d_sae]`` (4 bytes a value in float32: for a 16k-feature SAE, 64 KiB a
        token). ``steer`` reads a steered model's features.

        >>> acts = lm.features("Once upon a time", sl.load_sae("steerlab-tiny-sae"))
        >>> acts.top(k=5).indices[0, -1]
        tensor([476, 106,  95, 346, 339])
        """
        return _provided("features")(self, prompts, sae, k=k, dense=flag(dense, "dense"),
                                     steer=steer, chat=chat)  # fmt: skip

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

        >>> steer = sl.Steer("blocks.2.hook_resid_pre", torch.ones(lm.d_model), alpha=[0, 4])
        >>> lm.logits(["Once"], steer, last_only=True).shape  # one row per alpha
        torch.Size([2, 1, 678])
        """
        rows = lay_out(self, prompts, steer, chat=chat, new_tokens=0)
        last_only = flag(last_only, "last_only")
        logits, _, _, _ = self.engine.forward(rows.requests(Sampling()), last_only=last_only)
        return logits

    def run_with_cache(
        self,
        prompts: Prompt | Sequence[Prompt],
        sites: str | Sequence[str] | None = None,
        *,
        steer: SteerArg = None,
        chat: bool = False,
    ) -> Activations:
        """One forward pass over left-padded prompts, keeping activations at ``sites``.

        Args:
            prompts: strings (or message lists with ``chat=True``).
            sites: canonical site names (one name alone is one site); all of
                ``lm.sites()`` when None.
            steer: optional steering during the pass; an alpha list gives one row per alpha.
            chat: apply the chat template.

        >>> acts = lm.run_with_cache(["Hello"], sites=["blocks.0.hook_resid_post"])
        >>> acts["blocks.0.hook_resid_post"].shape
        torch.Size([1, 4, 128])
        """
        names = self._sites if sites is None else site_names(sites)
        for name in names:
            resolve(name, self._sites)
        rows = lay_out(self, prompts, steer, chat=chat, new_tokens=0)
        _, tensors, ids, mask = self.engine.forward(
            rows.requests(Sampling()), capture=names, last_only=True
        )
        str_tokens = [
            [self.tokenizer.decode([t]) if m else "" for t, m in zip(row.tolist(), keep.tolist())]
            for row, keep in zip(ids, mask)
        ]
        return Activations(tensors, ids, mask, str_tokens)

    def __repr__(self) -> str:
        return (
            f"SteerableModel({self.name or type(self.model).__name__!s}, backend={self.engine.kind!r}, "
            f"n_layers={self.n_layers}, d_model={self.d_model}, hooks={self.hook_count()})"
        )

    def _repr_html_(self) -> str:
        return (
            f"<b>SteerableModel</b> <code>{html.escape(self.name)}</code> &middot; backend "
            f"<code>{self.engine.kind}</code> &middot; {self.n_layers} layers &middot; "
            f"d_model {self.d_model} &middot; {len(self._sites)} sites &middot; "
            f"steerlab hooks on model: {self.hook_count()}"
        )
