"""What a generation returns: one row per prompt x alpha, new tokens only."""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from steerlab.core.monitors import nan_padded


@dataclass(frozen=True)
class Generation:
    """The result of ``lm.generate``.

    Attributes:
        text: completion of each row (new tokens only, special tokens dropped).
        tokens: new token ids of each row, without padding; a row that ended at a stop
            string keeps the tokens wholly before it (``RowStates.kept``).
        prompt_tokens: the token ids actually fed for each row's prompt.
        finish_reasons: ``"eos"``, ``"stop"`` (a stop string) or ``"length"``.
        prompt_index: which input prompt each row came from.
        alphas: the alpha of each steer on each row (empty tuple when unsteered).
        logprobs: log-probability of each token in ``tokens`` under the (steered) model.
        seed: the sampling seed (drawn fresh when none was given), to repeat the run.
        activations: site -> [row, pos, d_model] over prompt and new tokens, when captured.
        cache: the KV cache at the end of the text, with ``keep_cache=True`` or ``cache=``.
        fired: [rows] bool, whether each row's condition fired (a row's first steer with a
            prompt condition, ``read="mean"`` or ``"last"``; False on rows without one); None
            when no steer has one. A ``read="token"`` gate decides per position, not per
            row, and is not reported here.
        condition_scores: [rows] float, the score each decision was made on (NaN on rows
            without a prompt condition); None when no steer has one.
        monitors: name -> ``MonitorTrace``, with ``monitor=``.
    """

    text: list[str]
    tokens: list[list[int]]
    prompt_tokens: list[list[int]]
    finish_reasons: list[str]
    prompt_index: list[int]
    alphas: list[tuple[float, ...]]
    logprobs: list[list[float]]
    prompts: list[Any] = field(repr=False)
    seed: int = 0
    activations: dict[str, torch.Tensor] | None = field(default=None, repr=False)
    cache: Any = field(default=None, repr=False)
    fired: torch.Tensor | None = field(default=None, repr=False)
    condition_scores: torch.Tensor | None = field(default=None, repr=False)
    monitors: dict[str, MonitorTrace] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.text)

    def __repr__(self) -> str:
        lines = [f"Generation({len(self)} rows)"]
        for i, text in enumerate(self.text):
            alpha = f" alpha={list(self.alphas[i])}" if self.alphas[i] else ""
            fired = ""
            if self.fired is not None and not math.isnan(float(self.condition_scores[i])):  # type: ignore[index]
                fired = " fired" if bool(self.fired[i]) else " not fired"
            lines.append(f"  [{i}]{alpha}{fired} ({self.finish_reasons[i]}) {text[:80]!r}")
        if self.monitors:
            lines.append(f"  monitors: {', '.join(self.monitors)}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            "<tr>"
            f"<td>{i}</td><td>{html.escape(str(self.prompts[self.prompt_index[i]])[:60])}</td>"
            f"<td>{', '.join(f'{a:g}' for a in self.alphas[i])}</td>"
            f"<td style='text-align:left'>{html.escape(t)}</td><td>{self.finish_reasons[i]}</td>"
            "</tr>"
            for i, t in enumerate(self.text)
        )
        return (
            "<table><thead><tr><th>row</th><th>prompt</th><th>alpha</th>"
            f"<th>completion</th><th>finish</th></tr></thead><tbody>{rows}</tbody></table>"
        )


@dataclass(frozen=True)
class MonitorTrace:
    """What one monitor read over a generation: ``h·v/|v|`` at ``site``.

    Attributes:
        name: the monitor's name.
        site: where it read, after any steer there.
        prompt: [rows, prompt tokens], NaN where a left-padded row has no token.
        generated: [rows, new tokens]: at the position whose forward chose each new token
            (the last prompt token for the first), NaN after a row ended.
    """

    name: str
    site: str
    prompt: torch.Tensor
    generated: torch.Tensor

    def __repr__(self) -> str:
        rows, new = self.generated.shape
        return f"MonitorTrace({self.name!r} at {self.site}: {rows} rows, {new} new tokens)"


RowReads = tuple[bool | None, float | None, Mapping[str, Any]]  # fired, score, readouts


def read_fields(rows: Sequence[RowReads]) -> tuple[Any, Any, dict[str, MonitorTrace]]:
    """``Generation``'s ``fired``, ``condition_scores`` and ``monitors`` from each row's
    decision, score and readouts (``core.request.Readout`` by monitor name), for every
    engine and the client alike.

    >>> read_fields([(True, 0.5, {}), (None, None, {})])[:2]
    (tensor([ True, False]), tensor([0.5000,    nan]))
    """
    fired = scores = None
    if any(f is not None for f, _, _ in rows):
        fired = torch.tensor([bool(f) for f, _, _ in rows])
        scores = torch.tensor([math.nan if s is None else s for _, s, _ in rows])
    traces: dict[str, MonitorTrace] = {}
    for name in dict.fromkeys(name for _, _, readouts in rows for name in readouts):
        got = [readouts.get(name) for _, _, readouts in rows]
        site = next(g.site for g in got if g is not None)
        traces[name] = MonitorTrace(
            name, site,
            nan_padded([g.prompt if g else () for g in got], left=True),
            nan_padded([g.generated if g else () for g in got]),
        )  # fmt: skip
    return fired, scores, traces


class Step:
    """One decode step of ``lm.stream``: the token each row just produced.

    A step is a snapshot: its ``text`` is each row's completion as it stood after this
    step, even once the stream has moved on; ``new_text`` is what this step added.
    """

    def __init__(self, index: int, token_ids: list[int], done: list[bool],
                 make_result: Callable[[list[int] | None], Generation], states: Any,
                 lengths: list[int], before: list[int], reasons: list[str]) -> None:  # fmt: skip
        self.index = index
        self.token_ids = token_ids  # the new token of each row (the pad id for rows already done)
        self.done = done
        self._make_result, self._states = make_result, states
        self._lengths, self._before, self._reasons = lengths, before, reasons

    @property
    def text(self) -> list[str]:
        """Each row's completion after this step."""
        return [self._states.text(r, n, why) for r, (n, why)
                in enumerate(zip(self._lengths, self._reasons))]  # fmt: skip

    @property
    def new_text(self) -> list[str]:
        """The text each row added at this step ("" for rows already done)."""
        out = []
        for r, (n, before, why) in enumerate(zip(self._lengths, self._before, self._reasons)):
            now, then = self._states.text(r, n, why), self._states.text(r, before, "length")
            out.append(now[len(then) :] if now.startswith(then) else now)
        return out

    def result(self) -> Generation:
        """The generation as it stood after this step."""
        return self._make_result(self._lengths)

    def __repr__(self) -> str:
        return f"Step(index={self.index}, token_ids={self.token_ids}, done={self.done})"
