"""From engine progress to the ``Step`` objects ``stream`` yields, with ``on_token`` callbacks."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from steerlab.core.reads import nan_padded
from steerlab.core.results import Generation, MonitorTrace, Step

if TYPE_CHECKING:
    from steerlab.core.rows import Rows
    from steerlab.engine.progress import Progress

OnToken = Callable[[Step], object]


def steps(progress: Iterator[Progress], rows: Rows, seed: int,
          on_token: OnToken | None = None) -> Iterator[Step]:  # fmt: skip
    """A ``Step`` per engine step; ``on_token(step)`` runs after each, before it is yielded.

    An exception in ``on_token`` ends the stream: the engine's call is closed first, so its
    hooks come off, and the exception propagates to the caller.
    """
    try:
        for p in progress:
            step = _step(p, rows, seed)
            if on_token is not None:
                on_token(step)
            yield step
    finally:
        close = getattr(progress, "close", None)
        if close is not None:
            close()


def _step(p: Progress, rows: Rows, seed: int) -> Step:
    def result(lengths: list[int] | None) -> Generation:
        states, n = p.states, lengths or p.lengths
        kept = [states.kept(r, n[r], why) for r, why in enumerate(p.reasons)]  # stop cut off
        fired, scores, monitors = _reads(states, kept)
        return Generation(
            text=[states.text(r, n[r], why) for r, why in enumerate(p.reasons)],
            tokens=[t[: kept[r]] for r, t in enumerate(states.tokens)],
            prompt_tokens=[list(ids) for ids in rows.encoded],
            finish_reasons=list(p.reasons),
            logprobs=[lp[: kept[r]] for r, lp in enumerate(states.logprobs)],
            activations=p.recorder.stacked() if p.recorder else None,
            cache=p.cache(),
            prompt_index=rows.prompt_index,
            alphas=rows.alphas,
            prompts=rows.prompts,
            seed=seed,
            fired=fired,
            condition_scores=scores,
            monitors=monitors,
        )

    return Step(p.index, p.token_ids, p.done, result, p.states, p.lengths, p.before, p.reasons)


def _reads(states: Any, kept: list[int]) -> tuple[Any, Any, dict[str, MonitorTrace]]:
    """The rows' condition decisions and scores, and the monitors' traces as tensors."""
    if getattr(states, "reads", None) is None:
        return None, None, {}
    rows = [states.reads_of(r, k) for r, k in enumerate(kept)]
    fired = scores = None
    if any(f is not None for f, _, _ in rows):
        fired = torch.tensor([bool(f) for f, _, _ in rows])
        scores = torch.tensor([math.nan if s is None else s for _, s, _ in rows])
    traces: dict[str, MonitorTrace] = {}
    names = list(dict.fromkeys(name for _, _, readouts in rows for name in readouts))
    for name in names:
        got = [readouts.get(name) for _, _, readouts in rows]
        site = next(g.site for g in got if g is not None)
        traces[name] = MonitorTrace(
            name, site,
            nan_padded([g.prompt if g else () for g in got], left=True),
            nan_padded([g.generated if g else () for g in got]),
        )  # fmt: skip
    return fired, scores, traces
