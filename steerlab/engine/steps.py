"""From engine progress to the ``Step`` objects ``stream`` yields, with ``on_token`` callbacks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from steerlab.core.results import Generation, MonitorTrace, Step, read_fields

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
    """The rows' condition decisions and scores, and the monitors' traces."""
    if getattr(states, "reads", None) is None:
        return None, None, {}
    return read_fields([states.reads_of(r, k) for r, k in enumerate(kept)])
