"""``GateState``: what the conditions of some rows have read, and what they decided.

One object holds the condition state of rows for every engine: the local engines keep
one per call (a row per call row), a vLLM worker one for its requests (a row each, given
with ``seat`` for the request's life). Its life is ``reset`` / ``update`` / ``decided``,
with the two kinds of gate ``core.reads`` defines:

- a prompt gate (``read="mean"`` or ``"last"``) is decided once from its conditions'
  sums over each row's prompt: ``update`` adds every position from the row's
  ``reads_from`` on, each once (a chunk fed twice, as a preempted vLLM request is, adds
  nothing new), and, where the prompt's length is known, none past it. ``decided`` scores
  them with ``core.reads.prompt_score``; a row is done once every part has read its whole
  prompt (always, where the length is not known: the local engines feed a prompt in one
  prefill);
- a per-token gate (``read="token"``) is a function of the forward running now: ``update``
  keeps that forward's scores, and ``where`` reads them.

State is indexed by row, never by a batch's position, so compaction and a shared prefix
(``spread``) leave it where it belongs. Padding has position -1 and is never read.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from steerlab.core.reads import Condition, Gate, prompt_score


class GateState:
    """The prompt sums, per-token scores and decisions of ``gates`` over some rows."""

    def __init__(self, gates: Sequence[Gate], leaves: Sequence[Condition],
                 reads_from: Sequence[int], prompt_len: Sequence[int] | None = None) -> None:  # fmt: skip
        """``gates`` distinct, ``leaves`` their distinct conditions (``Plan.gates`` and
        ``Plan.leaves``); per row, the first position read, and the prompt's length where
        it is known."""
        self.gates, self.leaves = list(gates), list(leaves)
        self.n = len(reads_from)
        self.reads_from = torch.tensor(list(reads_from), dtype=torch.long)  # [rows]
        self.prompt_len = None if prompt_len is None else torch.tensor(list(prompt_len))
        self.reset()

    def __bool__(self) -> bool:
        return bool(self.gates)

    def reset(self) -> None:
        """Forget everything read and decided."""
        self.sums: dict[Condition, torch.Tensor] = {}  # [rows, d] float32
        self.counts: dict[Condition, torch.Tensor] = {}  # [rows]
        self.lasts: dict[Condition, torch.Tensor] = {}  # [rows, d] float32
        self.next_pos: dict[Condition, torch.Tensor] = {}  # [rows] the first not yet read
        self.token: dict[Condition, torch.Tensor] = {}  # this forward's per-token scores
        self._decided: dict[Gate, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def new_forward(self) -> None:
        self.token.clear()

    # --- a pool of rows (a vLLM worker's requests, each given a row for its life) --------

    def seat(self, row: int, reads_from: int, prompt_len: int) -> None:
        """Give row ``row`` to a new request: nothing read or decided, reading its prompt of
        ``prompt_len`` tokens from ``reads_from`` on. Rows past ``n`` are made (empty)."""
        assert self.prompt_len is not None, "a pool knows each prompt's length"
        if row >= self.n:
            more = max(row + 1, 2 * self.n) - self.n
            self.reads_from = torch.cat([self.reads_from, self.reads_from.new_zeros(more)])
            self.prompt_len = torch.cat([self.prompt_len, self.prompt_len.new_zeros(more)])
            for kept in (self.sums, self.counts, self.lasts, self.next_pos):
                for c, t in kept.items():
                    kept[c] = torch.cat([t, t.new_zeros(more, *t.shape[1:])])
            self.n += more
        self.reads_from[row], self.prompt_len[row] = reads_from, prompt_len
        for c in self.sums:
            self.sums[c][row], self.counts[c][row], self.lasts[c][row] = 0.0, 0.0, 0.0
            self.next_pos[c][row] = reads_from
        self._decided.clear()

    def drop(self, keep: Collection[Condition]) -> None:
        """Forget what every condition but those in ``keep`` has read (no row reads them)."""
        for kept in (self.sums, self.counts, self.lasts, self.next_pos, self.token):
            for c in [c for c in kept if c not in keep]:
                del kept[c]
        self._decided.clear()

    # --- update --------------------------------------------------------------------------

    def update(self, c: Condition, act: torch.Tensor, rows: torch.Tensor,
               pos: torch.Tensor) -> torch.Tensor | None:  # fmt: skip
        """Read ``act [..., d]``, whose positions are ``pos [...]`` on rows ``rows [...]``
        (the same leading shape), into ``c``: its scores for this forward (per token), or
        its prompt sums. Returns, for a prompt condition, ``[rows]`` bool: the rows whose
        positions read here did not follow on from what they had read (part of a prompt
        was never fed, so its mean would be wrong); None for a per-token one."""
        d = act.shape[-1]
        if c.per_token:
            self.token[c] = c.scores(act.reshape(-1, d)).reshape(act.shape[:-1])
            return None
        keep = self.kept(c, rows.reshape(-1), pos.reshape(-1), d, act.device)
        home = keep.device  # where ``c``'s state lives (``kept``)
        rows, pos = rows.reshape(-1).to(home), pos.reshape(-1).to(home)
        flat = act.reshape(-1, d).to(home)
        wide = flat.to(torch.float32) * keep[:, None]
        sums = torch.zeros(self.n, d, device=home).index_add_(0, rows, wide)
        high = self._highest(rows, pos, keep)
        last = keep & (pos == high[rows])
        lasts = torch.zeros(self.n, d, device=home)
        lasts[rows[last]] = flat[last].to(torch.float32)
        return self.add(c, rows, pos, keep, sums, lasts)

    def kept(self, c: Condition, rows: torch.Tensor, pos: torch.Tensor, d: int,
             device: torch.device) -> torch.Tensor:  # fmt: skip
        """Which of the positions ``pos [n]`` on rows ``rows [n]`` prompt condition ``c``
        reads (``[n]`` bool): each position once, from the row's ``reads_from`` on, none
        past its prompt where its length is known. ``d``: the activation's width. What
        ``c`` reads is kept on the ``device`` it is first read on (reads from another device
        are moved there), and so is what this returns."""
        if c not in self.sums:
            self.sums[c] = torch.zeros(self.n, d, device=device)
            self.counts[c] = torch.zeros(self.n, device=device)
            self.lasts[c] = torch.zeros(self.n, d, device=device)
            self.next_pos[c] = self.reads_from.to(device)
        home = self.next_pos[c].device
        rows, pos = rows.to(home), pos.to(home)
        keep = pos >= self.next_pos[c][rows]
        if self.prompt_len is not None:
            keep &= pos < self.prompt_len.to(home)[rows]
        return keep

    def add(self, c: Condition, rows: torch.Tensor, pos: torch.Tensor, keep: torch.Tensor,
            sums: torch.Tensor, lasts: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Add what ``c`` read at the ``keep`` positions (``kept``): per row, ``sums
        [rows, d]`` of their activations and ``lasts [rows, d]``, the activation at the
        highest one (float32; anything on a row that kept none). Returns ``[rows]`` bool:
        the rows whose positions did not follow on from what they had read. The eager
        engines sum the activations themselves (``update``); vLLM's compiled graph sums
        them inside the graph and hands the sums over (``engine/vllm/graph_reads.py``)."""
        device = self.next_pos[c].device  # ``kept`` made it
        rows, pos, keep = rows.to(device), pos.to(device), keep.to(device)
        self.sums[c] += sums.to(device)
        lasts = lasts.to(device)
        self.counts[c].index_add_(0, rows, keep.to(torch.float32))
        low = torch.full((self.n,), torch.iinfo(torch.long).max, device=device)
        low = low.scatter_reduce(0, rows[keep], pos[keep], "amin")
        high = self._highest(rows, pos, keep)
        read = high >= 0
        self.lasts[c] = torch.where(read[:, None], lasts, self.lasts[c])
        many = torch.zeros(self.n, device=device, dtype=torch.long).index_add_(0, rows, keep.long())
        # what was read skipped positions: it starts past the next one, or has holes
        gap = read & ((low != self.next_pos[c]) | (many != high - low + 1))
        self.next_pos[c] = torch.where(read, high + 1, self.next_pos[c])
        self._decided.clear()
        return gap

    def _highest(self, rows: torch.Tensor, pos: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Per row, the highest kept position (-1: none)."""
        high = torch.full((self.n,), -1, device=pos.device, dtype=torch.long)
        return high.scatter_reduce(0, rows[keep], pos[keep], "amax")

    def spread(self, k: int) -> None:
        """After a shared prefix fed only the first row of each run of ``k``: every row of a
        run takes its first row's reads (the rows' own last tokens follow)."""
        leaders = torch.arange(self.n) // k * k
        for c in self.sums:
            at = leaders.to(self.sums[c].device)
            self.sums[c], self.counts[c] = self.sums[c][at], self.counts[c][at]
            self.lasts[c], self.next_pos[c] = self.lasts[c][at], self.next_pos[c][at]
        self._decided.clear()

    # --- decided -------------------------------------------------------------------------

    def decided(self, gate: Gate) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(fired, score, done)``, each ``[rows]``, of a prompt gate from what its
        conditions have read: ``done`` where every part has read the row's whole prompt
        (a row that has read nothing scores NaN and never fires)."""
        if gate not in self._decided:
            scores, done = {}, torch.ones(self.n, dtype=torch.bool)
            for c in gate.leaves():
                if c not in self.sums:
                    scores[c] = torch.full((self.n,), float("nan"))
                    read_to = self.reads_from
                else:
                    scores[c] = prompt_score(c, self.sums[c], self.counts[c], self.lasts[c])
                    read_to = self.next_pos[c].cpu()
                if self.prompt_len is not None:
                    done &= read_to >= self.prompt_len
            fired, score = gate.decide(scores)
            self._decided[gate] = (fired, score, done)
        return self._decided[gate]

    def where(self, gate: Gate, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Where ``gate`` lets its steer act in the forward running now, ``pos``'s shape,
        for the call rows ``rows`` (``pos``'s first dimension): per position for a
        per-token gate, per row for a prompt gate (never before a row's ``reads_from``)."""
        if gate.per_token:  # a function of this forward's activations alone
            return gate.decide(self.token)[0].reshape(pos.shape)
        first = self.reads_from.to(pos.device)[rows][:, None]  # [batch, 1]
        fired, _, _ = self.decided(gate)
        return fired.to(rows.device)[rows][:, None] & (pos >= first)
