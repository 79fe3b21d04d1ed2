"""Scoring prompts with each shared start fed once: lm-eval's multiple choice at its speed.

A scoring call (every row scores its prompt and samples at most one token, as lm-eval's
loglikelihood requests do) runs in two stages:

1. Rows with the same steers whose prompts share most of their tokens form a group; each
   group's shared start (a lone row: its whole prompt) is fed once, all groups in one
   forward, continuing from the longest prompt the engine scored before (``PromptStore``).
2. Each row of a group of several feeds the rest of its prompt, all rows in one forward,
   from its group's cache.

A score is a gather of the chosen token's log-probability; the ``top`` alternatives are one
``topk`` over the call, only when asked for. Every stage's prompt is stored for later calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from steerlab.backends.base import Backend
from steerlab.backends.cache import KVCache
from steerlab.core.request import Request, TokenScore
from steerlab.core.sampling import check_finite
from steerlab.engine.batch import Batch
from steerlab.engine.guard import Call
from steerlab.engine.local.prompt_store import (
    PromptStore,
    RowKey,
    Stored,
    common_length,
    row_key,
    stored,
)
from steerlab.engine.plan import Plan

Scores = list[TokenScore | None]


def fits(requests: Sequence[Request], plan: Plan, backend: Backend) -> bool:
    """Whether a call takes this path: every row scores its prompt, none generates past one
    token or carries flags of generated tokens, and the backend's cache can be cut by row.
    A plan that reads (a condition or a monitor) does not: both read the whole prompt of
    each row, which a shared start is fed without."""
    ops = backend.cache_ops
    return (hasattr(ops, "take") and hasattr(ops, "stack") and not plan.reads and all(
        r.sampling.prompt_logprobs is not None and r.sampling.max_new_tokens <= 1
        and not r.generated and r.prompt for r in requests))  # fmt: skip


@dataclass
class Group:
    rows: list[int]  # call rows, sharing ``tokens[:length]``
    tokens: tuple[int, ...]
    length: int  # tokens fed in stage 1 (a lone row: all of its prompt)
    base: Stored | None = None
    start: int = 0  # stored positions continued (stage 1 feeds tokens[start:length])


def groups_of(requests: Sequence[Request], keys: Sequence[RowKey]) -> list[Group]:
    """Rows with equal keys, sorted by prompt, grouped while they share at least half of
    each prompt (and two tokens)."""
    order = sorted(range(len(requests)), key=lambda i: (keys[i], requests[i].prompt))
    out: list[Group] = []
    shared: tuple[int, ...] = ()
    for i in order:
        prompt = requests[i].prompt
        n = common_length(shared, prompt) if out and keys[out[-1].rows[0]] == keys[i] else 0
        if n >= max(2, len(prompt) // 2):
            out[-1].rows.append(i)
            shared = shared[:n]
            out[-1].tokens = shared
        else:
            out.append(Group([i], prompt, len(prompt)))
            shared = prompt
    for g in out:
        if len(g.rows) > 1:  # every row feeds at least its last token in stage 2
            g.length = min(len(g.tokens), *(len(requests[i].prompt) - 1 for i in g.rows))
    return out


def prefill_scored(backend: Backend, requests: Sequence[Request], call: Call, pad_id: int,
                   store: PromptStore, use_store: bool) -> tuple[torch.Tensor, list[Scores]]:  # fmt: skip
    """Every row's prompt scores and its next-token logits ``[rows, vocab]``."""
    keys = [row_key(r) for r in requests]
    top = max(r.sampling.prompt_logprobs or 0 for r in requests)
    groups = groups_of(requests, keys)
    if use_store:
        for g in groups:
            hit = store.best(keys[g.rows[0]], g.tokens[: g.length], top)
            if hit is not None:
                g.base, g.start = hit[0], hit[1] - 1  # refeed the last shared token
    batch, logits = _stage_one(backend, requests, groups, call, pad_id)
    first = _scored(logits, [g.tokens[g.start + 1 : g.length] for g in groups], top,
                    [requests[g.rows[0]] for g in groups])  # fmt: skip
    if use_store:
        _keep(backend, store, groups, keys, batch, first, top)
    several = [g for g in groups if len(g.rows) > 1]
    second: list[Scores] = []
    last: list[torch.Tensor] = []  # per row of ``several``'s groups, in order
    if several:
        tail, second = _stage_two(backend, requests, groups, several, batch, call, pad_id, top)
        last = list(tail)
    scores: list[Scores] = [[] for _ in requests]
    final: list[torch.Tensor | None] = [None] * len(requests)
    at = 0
    for gi, g in enumerate(groups):
        head: Scores = [None, *(g.base.scores[1 : g.start + 1] if g.base else ()), *first[gi]]
        if len(g.rows) == 1:
            scores[g.rows[0]], final[g.rows[0]] = head, logits[gi, -1]
            continue
        boundary = logits[gi, -1].float().log_softmax(-1)  # scores each row's token `length`
        for row in g.rows:
            token = requests[row].prompt[g.length]
            scores[row] = [*head, _one(boundary, token, top), *second[at]]
            final[row] = last[at]
            at += 1
    out = [_trim(s, r.sampling.prompt_logprobs or 0) for s, r in zip(scores, requests)]
    return torch.stack([f for f in final if f is not None]), out


def _stage_one(backend: Backend, requests: Sequence[Request], groups: list[Group], call: Call,
               pad_id: int) -> tuple[Batch, torch.Tensor]:  # fmt: skip
    """Each group's shared start from its stored base, all groups in one forward."""
    feed = [replace(requests[g.rows[0]], prompt=g.tokens[g.start : g.length]) for g in groups]
    base = _bases(backend, groups, pad_id)
    batch = Batch(backend, feed, base, pad_id, use_cache=True)
    batch.rows = [g.rows[0] for g in groups]  # call rows, for the steers' alphas
    logits = batch.forward(call, last_only=False)  # [groups, new, vocab]
    return batch, logits


def _bases(backend: Backend, groups: list[Group], pad_id: int) -> KVCache | None:
    """The stored positions each group continues, left-padded into one cache."""
    if not any(g.start for g in groups):
        return None
    ops, length = backend.cache_ops, max(g.start for g in groups)
    parts = [ops.take(g.base.data, 0, torch.arange(g.start)) if g.base and g.start else None
             for g in groups]  # fmt: skip
    tokens = torch.full((len(groups), length), pad_id, dtype=torch.long)
    mask = torch.zeros(len(groups), length, dtype=torch.long)
    for i, g in enumerate(groups):
        if g.start:
            tokens[i, length - g.start :] = torch.tensor(g.tokens[: g.start])
            mask[i, length - g.start :] = 1
    data = ops.stack(parts, length)  # type: ignore[attr-defined]
    return KVCache(data, ops, tokens, mask, torch.zeros_like(mask, dtype=torch.bool))


def _stage_two(backend: Backend, requests: Sequence[Request], groups: list[Group],
               several: list[Group], batch: Batch, call: Call, pad_id: int,
               top: int) -> tuple[torch.Tensor, list[Scores]]:  # fmt: skip
    """The rest of each grouped row's prompt from its group's cache, all rows in one forward."""
    where = {id(g): i for i, g in enumerate(groups)}
    index = [where[id(g)] for g in several for _ in g.rows]
    rows = [row for g in several for row in g.rows]
    cache = batch.cache().select(index)  # one row per grouped row, from its group
    feed = [replace(requests[r], prompt=requests[r].prompt[g.length :])
            for g in several for r in g.rows]  # fmt: skip
    second = Batch(backend, feed, cache, pad_id, use_cache=True)
    second.rows = rows
    logits = second.forward(call, last_only=False)  # [rows, new, vocab]
    scores = _scored(logits, [requests[r].prompt[g.length + 1 :]
                              for g in several for r in g.rows], top,
                     [requests[r] for r in rows])  # fmt: skip
    return logits[:, -1], scores


def _scored(logits: torch.Tensor, targets: Sequence[Sequence[int]], top: int,
            requests: Sequence[Request]) -> list[Scores]:  # fmt: skip
    """Per row, the scores of ``targets[i]``: the tokens after each fed one but the last, the
    fed tokens right-aligned in ``logits`` [rows, new, vocab]. A logprob is the chosen logit
    less the position's logsumexp: one gather, and the alternatives only when ``top`` > 0 (for
    ``top`` 1, the max the logsumexp takes)."""
    rows, new = logits.shape[:2]
    width = max((len(t) for t in targets), default=0)
    if width == 0:
        return [[] for _ in targets]
    window = logits[:, new - 1 - width : new - 1].float()  # [rows, width, vocab]
    # logsumexp by hand, so that lm-eval's top-1 (its greedy check) is the max it needs anyway
    best = window.max(-1, keepdim=True) if top == 1 else None
    peak = best.values if best is not None else window.amax(-1, keepdim=True)
    norm = (window - peak).exp_().sum(-1, keepdim=True).log_() + peak  # [rows, width, 1]
    ids = torch.zeros(rows, width, dtype=torch.long)
    for i, t in enumerate(targets):
        if t:
            ids[i, width - len(t) :] = torch.tensor(t)
    chosen_t = (window.gather(-1, ids.to(window.device)[..., None]) - norm)[..., 0]
    _finite(chosen_t, [len(t) for t in targets], requests)
    chosen = chosen_t.tolist()
    tops: list[list[tuple[tuple[int, float], ...]]] = [[()] * width for _ in range(rows)]
    if top > 0:
        values, which = best if best is not None else window.topk(min(top, window.shape[-1]), -1)
        tops = [[tuple(zip(i, v)) for i, v in zip(ri, rv)]
                for ri, rv in zip(which.tolist(), (values - norm).tolist())]  # fmt: skip
    return [[TokenScore(tok, chosen[i][width - len(t) + j], tops[i][width - len(t) + j])
             for j, tok in enumerate(t)] for i, t in enumerate(targets)]  # fmt: skip


def _finite(chosen: torch.Tensor, counts: list[int], requests: Sequence[Request]) -> None:
    """THE per-step check (``check_finite``) on the scores a row reports: a NaN or inf logit
    makes its position's logsumexp, and so its score, NaN or infinite."""
    real = torch.arange(chosen.shape[1]) >= chosen.shape[1] - torch.tensor(counts)[:, None]
    check_finite(chosen.masked_fill(~real.to(chosen.device), 0), 0, requests)


def _one(logprobs: torch.Tensor, token: int, top: int) -> TokenScore:
    alternatives: tuple[tuple[int, float], ...] = ()
    if top > 0:
        values, ids = logprobs.topk(min(top, logprobs.shape[-1]))
        alternatives = tuple(zip(ids.tolist(), values.tolist()))
    return TokenScore(token, float(logprobs[token]), alternatives)


def _trim(scores: Scores, top: int) -> Scores:
    return [s if s is None or len(s.top) <= top else TokenScore(s.token, s.logprob, s.top[:top])
            for s in scores]  # fmt: skip


def _keep(backend: Backend, store: PromptStore, groups: list[Group], keys: list[RowKey],
          batch: Batch, first: list[Scores], top: int) -> None:  # fmt: skip
    """Store each group's start (its cache's real positions, its tokens' scores)."""
    per_token = 2 * backend.n_layers * backend.d_model * _itemsize(backend)
    for gi, g in enumerate(groups):
        nbytes = g.length * per_token  # a first estimate: no cache is taken that cannot fit
        if g.length < 2 or not store.fits(nbytes) or 2 * g.start >= g.length:
            continue  # a start mostly stored already is not stored twice
        keep = batch.mask[gi].nonzero()[:, 0]
        data = backend.cache_ops.take(batch.data, gi, keep)  # type: ignore[attr-defined]
        scores = (None, *(g.base.scores[1 : g.start + 1] if g.base else ()), *first[gi])
        entry = stored(tuple(g.tokens[: g.length]), data, scores, top)
        if store.fits(entry.nbytes):  # measured: the cache's tensors, and every score's objects
            store.add(keys[g.rows[0]], entry)


def _itemsize(backend: Backend) -> int:
    first = next((p for m in backend.modules() for p in m.parameters()), None)
    return first.element_size() if first is not None else 4


class ScoredRows:
    """The decode loop's batch after ``prefill_scored``: rows that sample one token at most,
    so nothing is fed again."""

    def __init__(self, requests: Sequence[Request]) -> None:
        self.rows = list(range(len(requests)))
        self._prompts = [list(r.prompt) for r in requests]

    def forward(self, call: Call, *, last_only: bool = True) -> torch.Tensor:
        raise RuntimeError("A scoring call samples one token at most; nothing is fed again.")

    def append(self, tokens: torch.Tensor, live: torch.Tensor) -> None:
        return None

    def keep(self, index: list[int]) -> None:
        self.rows = [self.rows[i] for i in index]

    def context(self) -> list[list[int]]:
        return [list(p) for p in self._prompts]
