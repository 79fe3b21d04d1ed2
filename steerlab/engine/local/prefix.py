"""One prompt, many rows: feed the shared prompt once, then continue each row from it.

A sweep over alphas lays out every prompt once per alpha, and each copy would be fed
through the model again. When the rows of a prompt come together (prompt-major, as
``lay_out`` makes them) and their steers act on the prompt identically, the prompt's keys
and values are the same for every copy: the prompt minus its last token is fed once per
distinct prompt, the cache is repeated row by row, and each row goes on from its own
last prompt token. That is exact wherever it applies, since no row's steering differs on
the shared tokens:

- a steer with ``positions="generated"`` (prompt tokens are not generated),
- a steer from token ``k`` on, with ``k`` at or past the last prompt token,
- any steer whose alpha is the same on every row of the group.

Rows that do not qualify run the ordinary way. Capturing activations or monitors turns it
off (the prompt's activations belong to every row), and so does a conditioned steer that
touches the prefix (its decision needs the whole prompt first). A conditioned steer on
generated tokens shares: each row's condition takes its run's prefix sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from steerlab.core.positions import position_mask
from steerlab.core.request import Request
from steerlab.engine.plan import Plan, PlanSteer


def group_size(requests: Sequence[Request], plan: Plan | None = None) -> int | None:
    """``k`` when the requests (compiled into ``plan``, by default here) come in runs of
    ``k >= 2`` rows that can share a prefix."""
    plan = plan if plan is not None else Plan.of(requests)
    if any(plan.monitors):
        return None  # a monitor reads every prompt token of every row
    first = requests[0]
    k = next((i for i, r in enumerate(requests) if not _same_prompt(r, first)), len(requests))
    if k < 2 or len(requests) % k:
        return None
    for start in range(0, len(requests), k):
        group = requests[start : start + k]
        if len(group[0].prompt) < 2 or not all(_same_prompt(r, group[0]) for r in group):
            return None
        rows = range(start, start + k)
        shared = [_on_prefix(requests[r], plan.of_row(r)) for r in rows]
        if any(s != shared[0] for s in shared):
            return None
        if any(_gated_on_prefix(requests[r], plan.of_row(r)) for r in rows):
            return None
    return k


def prefixes(requests: Sequence[Request], k: int) -> list[Request]:
    """One request per group: its prompt minus the last token."""
    return [_cut(r, 0, -1) for r in requests[::k]]


def last_tokens(requests: Sequence[Request]) -> list[Request]:
    """Every row continuing from its last prompt token."""
    return [_cut(r, -1, None) for r in requests]


def _cut(request: Request, start: int, stop: int | None) -> Request:
    flags = request.generated[start:stop] if request.generated else ()
    return replace(request, prompt=request.prompt[start:stop], generated=flags)


def _same_prompt(a: Request, b: Request) -> bool:
    return a.prompt == b.prompt and a.generated == b.generated


def _on_prefix(request: Request, steers: list[tuple[PlanSteer, float]]) -> list[str]:
    """The row's steers (``Plan.of_row``) that act on its prompt minus the last token, as
    marks (``Steer.mark``: with their alphas), in order."""
    n = len(request.prompt) - 1
    flags = request.generated[:n] if request.generated else (False,) * n
    return [s.mark(alpha) for s, alpha in steers
            if alpha != 0 and _touches(s, n, flags)]  # fmt: skip


def _gated_on_prefix(request: Request, steers: list[tuple[PlanSteer, float]]) -> bool:
    """A gated steer that touches the prefix: its row's decision needs the whole prompt,
    which the shared prefix is fed without."""
    n = len(request.prompt) - 1
    flags = request.generated[:n] if request.generated else (False,) * n
    return any(s.gate is not None and _touches(s, n, flags) for s, _ in steers)


def _touches(steer: PlanSteer, n: int, generated: Sequence[bool]) -> bool:
    """Whether the steer touches any of the first ``n`` tokens (the core's position rule)."""
    pos = torch.arange(n)
    flags = torch.tensor(generated, dtype=torch.bool)
    return bool(position_mask(steer.positions, pos, flags, n + 1).any())  # the prompt: n + 1
