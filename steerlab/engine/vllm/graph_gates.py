"""Gates decided inside vLLM's compiled graph, in the forward that reads them.

A prompt gate on generated tokens is decided after the forward that read the prompt, and
the worker folds its decision into the alphas it writes (``graph.py``). Two gates must be
decided in the forward itself, as the eager hooks decide them:

- a per-token condition (``read="token"``) gates each position by its own score;
- a prompt condition gating a steer on the prompt's own tokens (the whole prompt in one
  forward: the engine refuses it with chunked prefill) decides from that forward's sum.

So each site holds, as data the worker writes before the forward, up to ``TOKEN`` per-token
conditions and ``PROMPT`` prompt conditions (a direction, its score kind, threshold and
comparison, and for a prompt condition mean or last). Before the site's steers it scores
them, the same rules as every engine (``core.reads.score_as``, ``prompt_read``): a
per-token score for each token, a prompt score for each row reading its prompt in this
forward (from the sums of ``graph_reads.GraphReads.before``) given to that row's tokens.
Each gives a column of fired tokens; the columns of the sites so far are what a steer's
gate reads: per token, the gate it has at the site (0: none), as a mask over the columns
and whether any or all of them must fire. Nested ``any_of`` / ``all_of`` are not held.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import nn

from steerlab.core.ops import unit
from steerlab.core.reads import AllOf, Condition, Gate, prompt_read, score_as
from steerlab.core.sites import Site
from steerlab.engine.vllm.batch import ForwardBatch, SiteSteer
from steerlab.engine.vllm.reads import WorkerReads

TOKEN = 2  # per-token conditions read at one site in one forward
PROMPT = 4  # prompt conditions decided at one site in one forward
GATES = 8  # gates acting at one site in one forward
COLUMNS = TOKEN + PROMPT  # a site's columns of fired tokens


class GraphGates(nn.Module):
    """The conditions a compiled model decides in the forward, and the gates reading them."""

    direction: torch.Tensor  # [sites, COLUMNS, d_model]: unit directions, float32
    numbers: torch.Tensor  # [sites, COLUMNS, 4]: cosine?, threshold, above?, last?
    query: torch.Tensor  # [max tokens]: the prompt read (``GraphReads``) a token is in, -1
    gate: torch.Tensor  # [sites, max tokens]: each token's gate at each site (0: none)
    masks: torch.Tensor  # [sites, GATES, sites * COLUMNS] bool: the columns a gate reads
    every: torch.Tensor  # [sites, GATES] bool: all of them must fire (else any)

    def __init__(self, sites: list[str], max_tokens: int, d_model: int,
                 device: torch.device) -> None:  # fmt: skip
        super().__init__()
        ordered = sorted(sites, key=lambda name: Site.parse(name).forward_order)
        self.sites = {name: k for k, name in enumerate(sites)}
        self.order = {name: k for k, name in enumerate(ordered)}  # columns: forward order
        n = len(sites)
        self.register_buffer("direction", torch.zeros(n, COLUMNS, d_model, device=device))
        self.register_buffer("numbers", torch.zeros(n, COLUMNS, 4, device=device))
        self.register_buffer("query", torch.full((max_tokens,), -1, device=device))
        self.register_buffer("gate", torch.zeros(n, max_tokens, dtype=torch.long, device=device))
        self.register_buffer("masks", torch.zeros(n, GATES, n * COLUMNS, dtype=torch.bool,
                                                  device=device))  # fmt: skip
        self.register_buffer("every", torch.zeros(n, GATES, dtype=torch.bool, device=device))
        self._trace: dict[str, Any] = {}  # while a forward runs
        self.columns: dict[tuple[str, Condition], int] = {}  # this forward's conditions
        self.placed: dict[int, int] = {}  # slot -> gates placed there this forward

    # --- inside the forward (traced) ------------------------------------------------------

    def open(self, site: str, act: torch.Tensor, rows: torch.Tensor,
             count: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Where the steers at ``site`` may act, ``[tokens]`` bool, from the conditions read
        here and before: ``act [tokens, d]`` before the steers, ``rows [2Q, d]`` the sums
        and last tokens of the prompts read here, ``count [Q]`` their tokens."""
        slot, tokens = self.sites[site], act.shape[0]
        units, num = self.direction[slot], self.numbers[slot]  # [COLUMNS, d], [COLUMNS, 4]
        cosine, threshold, above = num[:, 0] != 0, num[:, 1], num[:, 2] != 0
        per_token = score_as(act, units[:TOKEN], cosine[:TOKEN])  # [tokens, TOKEN]
        q = count.shape[0]
        by_row = torch.where(  # [Q, PROMPT]: each prompt read's score, mean or last
            num[TOKEN:, 3] != 0,
            score_as(prompt_read(rows[:q], count, rows[q:], True), units[TOKEN:], cosine[TOKEN:]),
            score_as(prompt_read(rows[:q], count, rows[q:], False), units[TOKEN:], cosine[TOKEN:]),
        ).masked_fill((count == 0)[:, None], float("nan"))
        query = self.query[:tokens]
        on_prompt = torch.where((query >= 0)[:, None], by_row[query.clamp(min=0)], float("nan"))
        scores = torch.cat([per_token, on_prompt], 1)  # [tokens, COLUMNS]
        fired = torch.where(above, scores > threshold, scores < threshold)  # NaN never fires
        if self.order[site] == 0:  # a forward starts: nothing kept from an earlier one
            self._trace["fired"] = []
        so_far = self._trace["fired"]
        if len(so_far) != self.order[site]:  # a gate's columns would be another site's
            raise RuntimeError(f"steerlab's graph sites ran out of forward order at {site}")
        so_far.append(fired)
        if self.order[site] == len(self.order) - 1:
            self._trace.pop("fired")  # the last site: nothing later reads them
        columns = torch.cat(so_far, 1)  # [tokens, (sites so far) * COLUMNS]
        gate = self.gate[slot, :tokens]
        mask = self.masks[slot][gate][:, : columns.shape[1]]  # [tokens, columns]
        any_fired = (columns & mask).any(-1)
        all_fired = ~(~columns & mask).any(-1)
        decided = torch.where(self.every[slot][gate], all_fired, any_fired)
        return (gate == 0) | decided

    # --- in the worker, before the forward ------------------------------------------------

    def clear(self) -> None:
        """No gate and no condition for the next forward."""
        for slot in self.placed:
            self.gate[slot].zero_()
        self.placed.clear()
        self.columns.clear()
        self.query.fill_(-1)

    def read_prompt(self, span: tuple[int, int], q: int) -> None:
        """Tokens ``[a, b)`` are the prompt read ``q`` of ``GraphReads``."""
        self.query[span[0] : span[1]] = q

    def place(self, site: str, steer: SiteSteer, where: torch.Tensor, gate: Gate) -> None:
        """Gate ``steer`` at ``site`` on the tokens ``where [tokens]`` by ``gate``, inside
        the forward."""
        if any(not isinstance(part, Condition) for part in getattr(gate, "conditions", ())):
            raise ValueError("a nested any_of / all_of decided inside the forward runs eagerly "
                             "only: load with vllm_args={'enforce_eager': True}")  # fmt: skip
        slot = self.sites[site]
        g = self.placed.get(slot, 0) + 1  # a site's gates are numbered from 1
        if g == GATES:
            raise ValueError(f"more than {GATES - 1} gates at {site} decided in one forward; "
                             "load with vllm_args={'enforce_eager': True}")  # fmt: skip
        self.masks[slot, g] = False
        for leaf in gate.leaves():
            self.masks[slot, g, self._column(leaf)] = True
        self.every[slot, g] = isinstance(gate, AllOf)
        self.gate[slot, : where.shape[0]][where] = g
        self.placed[slot] = g

    def _column(self, c: Condition) -> int:
        """``c``'s column (written the first time this forward names it)."""
        key = (c.site, c)
        if key not in self.columns:
            start = 0 if c.per_token else TOKEN
            taken = [k for (site, other), k in self.columns.items()
                     if site == c.site and other.per_token == c.per_token]  # fmt: skip
            k = start + len(taken)
            if len(taken) == (TOKEN if c.per_token else PROMPT):
                raise ValueError(f"more {'per-token' if c.per_token else 'prompt'} conditions "
                                 f"at {c.site} than the compiled model decides in one forward; "
                                 "load with vllm_args={'enforce_eager': True}")  # fmt: skip
            slot = self.sites[c.site]
            self.direction[slot, k] = unit(c.direction.to(self.direction.device), torch.float32)
            self.numbers[slot, k] = torch.tensor([c.score == "cosine", c.threshold,
                                                  c.compare == "above", c.read == "last"])  # fmt: skip
            self.columns[key] = self.order[c.site] * COLUMNS + k
        return self.columns[key]


def gate_function(gates: GraphGates, reads: WorkerReads, queries: list[Any],
                  batch: ForwardBatch, errors: dict[str, str]) -> Callable[[str, SiteSteer], torch.Tensor]:  # fmt: skip
    """The worker's gate for ``graph.GraphBuffers.write``: where a gated steer may act in
    this forward, ``[tokens]`` bool. A per-token gate, and a prompt gate on the prompt's
    own tokens, are placed in the graph (``GraphGates.place``: those tokens come back
    True here and the graph decides); a prompt gate elsewhere is its row's decision so
    far (``WorkerReads.mask``), which must exist. ``queries``: this forward's prompt reads
    (``GraphReads.queries``); a prompt gate decided in the forward needs its row's whole
    prompt read there, else the row fails, as eagerly."""
    real = len(batch.owner)
    prompt_len = np.full(real, np.iinfo(np.int64).max)
    whole: dict[str, bool] = {}
    for _, row, (a, b) in reads.reading(batch):
        prompt_len[a:b] = row.prompt_len
    for query in queries:
        first = query.reads.plan.reads_from[0]
        whole[query.reads.name] = int(query.keep.sum()) == query.reads.prompt_len - first

    def gate(site: str, steer: SiteSteer) -> torch.Tensor:
        assert steer.gate is not None
        tokens = steer.alphas.shape[0]
        here = torch.zeros(tokens, dtype=torch.bool)
        on_prompt = torch.from_numpy(batch.pos < prompt_len)
        here[:real] = True if steer.gate.per_token else on_prompt
        here &= steer.touched
        if not steer.gate.per_token:
            for _, row, (a, b) in reads.reading(batch):
                if bool(here[a:b].any()) and not whole.get(row.name, False):
                    errors.setdefault(row.name, f"the condition gating the steer at {site} "
                                      "must read the whole prompt in the forward that steers "
                                      "it, and this forward did not hold it all")  # fmt: skip
                    here[a:b] = False
        rest = replace(steer, touched=steer.touched & ~here)
        folded = here.clone()
        if not steer.gate.per_token and bool(rest.touched.any()):
            folded |= reads.mask(site, rest, batch, tokens, errors)
        if bool(here.any()):
            gates.place(site, steer, here, steer.gate)
        return folded

    return gate
