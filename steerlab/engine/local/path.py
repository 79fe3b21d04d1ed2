"""Which way one call of the in-process engine runs, and why: chosen in one place.

Four paths, each with a named reason that ``lm.explain`` prints:

- ``scored``: every row scores its prompt and samples at most one token; each shared
  start is fed once, across calls too (``local/scored.py``, the prompt store);
- ``compiled``: after ``lm.compile()``, a call that fits the compiled step
  (``engine/compiled/fit.py``) decodes through one static graph per step;
- ``eager``, one left-padded batch with hooks, and within it the ``shared prefix`` form:
  rows in runs of ``k`` with one prompt feed it once, then every row goes on from it
  (``local/prefix.py``).

``choose`` compiles the call's plan (``engine/plan.py``) once and is the only caller of the
three tests (``scored.fits``, the compiled step's ``reason``, ``prefix.group_size``), each
of which reads the plan's properties, so a call's path and its explanation cannot
disagree; the path carries the plan to the engine, which runs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from steerlab.backends.cache import KVCache
from steerlab.core.request import Request
from steerlab.core.sites import Site
from steerlab.engine.local import prefix
from steerlab.engine.local.scored import fits
from steerlab.engine.plan import Plan

if TYPE_CHECKING:
    from steerlab.engine.local.engine import LocalEngine

NOT_COMPILED = "the model is not compiled (lm.compile())"


@dataclass(frozen=True)
class Path:
    """One call's way through the engine: what feeds the model, what is kept, and why.

    Attributes:
        kind: ``"scored"``, ``"compiled"`` or ``"eager"``.
        why: the reason, in words (``line`` puts it after the kind).
        sites: the sites whose activations the call captures.
        cache: a cache the call continues (advanced in place).
        keep_cache: whether the call hands its cache back.
        use_cache: decode with a KV cache (False: every step feeds every column).
        compact: finished rows leave the batch once half of it has.
        shared: rows per run that share one prompt, fed once (eager only); None: no runs.
        plan: the call's plan, compiled once here.
    """

    kind: Literal["scored", "compiled", "eager"]
    why: str
    sites: tuple[Site, ...] = ()
    cache: KVCache | None = None
    keep_cache: bool = False
    use_cache: bool = True
    compact: bool = False
    shared: int | None = None
    plan: Plan | None = None

    @property
    def line(self) -> str:
        """``"kind: why"``, with the shared prefix when the eager batch feeds one.

        >>> Path("eager", NOT_COMPILED, shared=4).line
        'eager: the model is not compiled (lm.compile()); rows in runs of 4 share a prompt, fed once'
        """
        runs = f"; rows in runs of {self.shared} share a prompt, fed once" if self.shared else ""
        return f"{self.kind}: {self.why}{runs}"


def choose(engine: LocalEngine, requests: Sequence[Request], *, sites: Sequence[Site] = (),
           cache: KVCache | None = None, keep_cache: bool = False, use_cache: bool = True,
           compact: bool = True) -> Path:  # fmt: skip
    """The path ``requests`` take on ``engine`` with these options (checked already)."""
    sites, plan = tuple(sites), Plan.of(requests)
    if any(r.sampling.prompt_logprobs is not None for r in requests):
        if not sites and not keep_cache and use_cache and fits(requests, plan, engine.backend):
            return Path("scored", "every row scores its prompt and samples at most one token: "
                        "each shared start is fed once", plan=plan)  # fmt: skip
        return Path("eager", "scoring prompts with capture=, keep_cache, use_cache=False, a "
                    "condition, a monitor, or more than one new token", sites,
                    keep_cache=keep_cache, use_cache=use_cache,
                    compact=compact and not keep_cache and not sites, plan=plan)  # fmt: skip
    why = NOT_COMPILED
    if engine.compiled is not None:
        reason = engine.compiled.reason(requests, plan, cache=cache, keep_cache=keep_cache,
                                        capture=[s.name for s in sites], use_cache=use_cache)  # fmt: skip
        if reason is None:
            return Path("compiled", engine.compiled.describe(requests), plan=plan)
        why = reason
    keep = keep_cache or cache is not None
    shared = None
    if engine.share_prefix and cache is None and use_cache and not sites:
        shared = prefix.group_size(requests, plan)
    return Path("eager", why, sites, cache, keep, use_cache,
                compact and not keep and not sites, shared, plan)  # fmt: skip
