"""Inside a vLLM worker: which request each token of a forward belongs to, and its steers.

vLLM flattens a step's requests into one token axis. Before each forward the worker reads
the model runner's batch (request ids in order, and ``query_start_loc``, the cumulative
token counts) and the ``positions`` the model is called with, and lays every distinct
steer of the step out as a per-token alpha, zero where a token is not steered. Sites then
apply each steer exactly as ``steerlab.engine.local.steering`` does in-process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from steerlab.core.ops import Add, Bound, Operation, bind, operand
from steerlab.core.positions import position_mask
from steerlab.core.reads import Gate
from steerlab.core.steer import SteerData, SteerKey
from steerlab.engine.plan import Plan, plan_from_data

DATA_KEY = "steerlab"  # the key of a request's plan in SamplingParams.extra_args


def parse_plan(extra_args: dict[str, Any] | None,
               tensors: Mapping[str, torch.Tensor] | None = None,
               read: MutableMapping[str, tuple[dict, SteerData]] | None = None) -> Plan | None:  # fmt: skip
    """The one-row plan a request carries in its ``extra_args`` (``Plan.to_data``, read by
    ``engine.plan.plan_from_data``; its tensors looked up in ``tensors`` by key; ``read``:
    the steers read before), or None for a request with no steer and no monitor."""
    data = (extra_args or {}).get(DATA_KEY)
    return plan_from_data(data, tensors, read) if data else None


@dataclass
class SiteSteer:
    """One op at one site over a forward's tokens.

    Usually one steer. Add steers whose requests have no other steer at the site are fused
    into one (``index`` picks each token's vector from ``vector_keys``): each token still
    gets ``act + alpha * v`` with its own v, the arithmetic of the unfused op.
    """

    vector_keys: tuple[str, ...]
    op: Operation
    alphas: torch.Tensor  # [tokens], 0 where not steered
    touched: torch.Tensor  # [tokens] bool
    rows: list[tuple[str, int]]  # (row id, tokens it steers in this forward)
    index: torch.Tensor | None = None  # [tokens] into vector_keys, for a fused Add
    gate: Gate | None = None  # steers only where this gate fires (never fused)
    # the worker's operands for this layout, made at its first forward and reused while
    # the layout holds (a steady decode): (tokens, device, dtype) -> what it made
    ready: dict[tuple, Any] = field(default_factory=dict, repr=False, compare=False)


class Tally:
    """Tokens steered, by row: each forward adds its steers' ``rows`` lists by reference (a
    steady decode adds the same lists again), and the sums by row are made when read, so a
    forward pays per steer, not per row."""

    def __init__(self) -> None:
        self._sums: dict[str, int] = {}
        self._added: dict[int, list] = {}  # id -> [rows list (kept: its id stays its own), times]

    def add(self, rows: list[tuple[str, int]]) -> None:
        entry = self._added.get(id(rows))
        if entry is None:
            self._added[id(rows)] = [rows, 1]
        else:
            entry[1] += 1

    def sums(self) -> dict[str, int]:
        """Tokens steered by row so far (a row may be popped from it)."""
        for rows, times in self._added.values():
            for row, n in rows:
                self._sums[row] = self._sums.get(row, 0) + n * times
        self._added.clear()
        return self._sums

    def clear(self) -> None:
        self._sums.clear()
        self._added.clear()


@dataclass
class ForwardBatch:
    """Every steer of one forward, by site name, in the order each site applies them."""

    by_site: dict[str, list[SiteSteer]] = field(default_factory=dict)
    rows: list[str] = field(default_factory=list)  # steered rows in this forward
    # Where each real token comes from, for what reads it (conditions and monitors): its
    # request (an index into ``req_ids``), absolute position and whether it is a prompt
    # token; empty where nothing reads.
    req_ids: list[str] = field(default_factory=list)
    owner: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    pos: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    in_prompt: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    prompt_len: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # Shared by the batches of one steady decode that reads (``again``): which requests
    # feed how many tokens, what readers work out once for all of them
    # (``reads.WorkerReads.reading``). Every other batch has a layout of its own.
    layout: object = field(default_factory=object, repr=False, compare=False)

    def again(self, positions: torch.Tensor) -> ForwardBatch:
        """The next forward of a steady decode that reads: the same requests feeding as
        many tokens each, now at ``positions``, with this batch's steers and layout. A new
        batch, as its positions are new; what depends only on the layout is kept by it
        (``GraphBuffers.write`` keeps its alphas while the gates' masks are the same)."""
        batch = ForwardBatch(self.by_site, self.rows, layout=self.layout)
        pos = positions[: len(self.owner)].to("cpu", torch.long).numpy()
        _read_by(batch, self.req_ids, self.owner, pos, self.prompt_len)
        return batch

    @property
    def feeds_prompt(self) -> bool:
        """Whether some token of this forward is a prompt's (what reads it and what a gate
        on the prompt may do depend on; a steady decode's forwards feed none)."""
        return bool(self.in_prompt.any())


def _touched(positions: Any, pos: np.ndarray, prompt_len: np.ndarray) -> np.ndarray:
    """Which tokens (absolute positions ``pos``, their rows' prompt lengths) a steer touches:
    the core's position rule, with a token generated exactly when it is past the prompt."""
    return position_mask(positions, pos, pos >= prompt_len, prompt_len)


@dataclass
class _Applier:
    """One ``SiteSteer`` of a composition, per request: alpha and which vector."""

    site: str
    vector_keys: tuple[str, ...]
    op: Operation
    where: Any  # the positions rule
    alpha: np.ndarray  # [requests] float32, 0 for requests it does not steer
    index: np.ndarray | None  # [requests] into vector_keys, for a fused Add
    gate: Gate | None = None


@dataclass
class Composition:
    """What depends only on which requests share a forward, not on how far each has got.

    vLLM keeps a batch's requests for many steps, so this is computed once per change of
    membership. At each site a request's steers apply in its own order; requests with the
    same order share ops, and single Add steers with the same positions rule fuse into one.
    """

    req_ids: tuple[str, ...]
    appliers: list[_Applier]
    row_ids: list[str | None]  # steerlab's row per request, None when unsteered
    # every steer touches all positions: the steers' layout holds while no token count
    # changes (no per-step rule to apply)
    fixed: bool
    reads: bool = False  # some request has a condition or a monitor

    @property
    def every_position(self) -> bool:
        """Whether the whole layout holds while no token count changes: the steers' does,
        and nothing reads (which needs each token's position)."""
        return self.fixed and not self.reads

    @classmethod
    def of(cls, req_ids: list[str], plans: dict[str, Plan | None]) -> Composition:
        n = len(req_ids)
        row_ids = [p.names[0] if (p := plans.get(rid)) is not None else None for rid in req_ids]
        chains: dict[str, dict[tuple[SteerKey, ...], list[tuple[int, tuple[float, ...]]]]] = {}
        for i, rid in enumerate(req_ids):
            plan = plans.get(rid)
            if plan is None:
                continue
            by_site: dict[str, list[tuple[SteerKey, float]]] = {}
            for steer, alpha in plan.of_row(0):
                by_site.setdefault(steer.site, []).append((steer.key, alpha))
            for site, steers in by_site.items():
                chain = tuple(key for key, _ in steers)
                chains.setdefault(site, {}).setdefault(chain, []).append(
                    (i, tuple(a for _, a in steers)))  # fmt: skip
        appliers = [a for site, by_chain in chains.items()
                     for a in _site(site, by_chain, n)]  # fmt: skip
        reads = any(p is not None and p.reads for p in (plans.get(r) for r in req_ids))
        fixed = all(a.where == "all" for a in appliers)
        return cls(tuple(req_ids), appliers, row_ids, fixed, reads)


def _vector_key(key: SteerKey) -> str:
    """A worker's steer key names its vector by content key (``parse_plan``)."""
    assert isinstance(key.vector, str), "a worker's steers carry vector keys"
    return key.vector


def _site(site: str, chains: dict[tuple[SteerKey, ...], list[tuple[int, tuple[float, ...]]]],
          n: int) -> list[_Applier]:  # fmt: skip
    """One site's ops: each distinct order of steers for its own requests, and single Add
    steers fused per positions rule. Different orders touch different tokens."""
    out: list[_Applier] = []
    fusable: dict[Any, list[tuple[SteerKey, list[tuple[int, float]]]]] = {}
    for chain, members in chains.items():
        if len(chain) == 1 and type(chain[0].op) is Add and chain[0].gate is None:
            fusable.setdefault(chain[0].positions, []).append(
                (chain[0], [(i, alphas[0]) for i, alphas in members]))  # fmt: skip
            continue
        for k, key in enumerate(chain):
            per_request = np.zeros(n, dtype=np.float32)
            for i, alphas in members:
                per_request[i] = alphas[k]
            out.append(_Applier(site, (_vector_key(key),), key.op, key.positions, per_request,
                                None, key.gate))  # fmt: skip
    for where, group in fusable.items():
        per_request = np.zeros(n, dtype=np.float32)
        index = np.zeros(n, dtype=np.int64)
        for v, (_, singles) in enumerate(group):
            for i, alpha in singles:
                per_request[i], index[i] = alpha, v
        keys = tuple(_vector_key(key) for key, _ in group)
        out.append(_Applier(site, keys, group[0][0].op, where, per_request,
                            index if len(keys) > 1 else None))  # fmt: skip
    return out


def lay_out_forward(
    req_ids: list[str],
    starts: list[int],  # [len(req_ids) + 1], cumulative token counts
    positions: torch.Tensor,  # [tokens] absolute position of each token (may be padded)
    plans: dict[str, Plan | None],
    prompt_lens: dict[str, int],
    composition: Composition | None = None,
) -> ForwardBatch:
    """Per-token alphas of every steer in this forward, vectorised over tokens."""
    comp = composition if composition is not None else Composition.of(req_ids, plans)
    n_tokens = positions.shape[0]
    batch = ForwardBatch(rows=[r for r in comp.row_ids if r is not None])
    if not comp.appliers and not comp.reads:
        return batch
    owner, pos, prompt_len = _tokens(req_ids, starts, positions, prompt_lens, comp)
    if comp.reads:
        _read_by(batch, req_ids, owner, pos, prompt_len)
    for a in comp.appliers:
        token_alpha = a.alpha[owner]
        if a.where != "all":
            token_alpha = token_alpha * _touched(a.where, pos, prompt_len)
        full = np.zeros(n_tokens, dtype=np.float32)
        full[: len(owner)] = token_alpha
        per_request = np.bincount(owner[token_alpha != 0], minlength=len(req_ids))
        rows = [(comp.row_ids[i], int(per_request[i])) for i in np.flatnonzero(a.alpha)]
        alpha_t = torch.from_numpy(full)
        index = None
        if a.index is not None:
            token_index = np.zeros(n_tokens, dtype=np.int64)
            token_index[: len(owner)] = a.index[owner]
            index = torch.from_numpy(token_index)
        batch.by_site.setdefault(a.site, []).append(
            SiteSteer(a.vector_keys, a.op, alpha_t, alpha_t != 0, rows, index, a.gate)  # type: ignore[arg-type]
        )
    return batch


def _tokens(req_ids: list[str], starts: list[int], positions: torch.Tensor,
            prompt_lens: dict[str, int],
            comp: Composition) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Each real token's request (an index into ``req_ids``), absolute position and its
    request's prompt length (none of the last two where no rule or read needs them)."""
    owner = np.repeat(np.arange(len(req_ids)), np.diff(np.asarray(starts)))  # [real tokens]
    if comp.every_position:
        return owner, np.zeros(0), np.zeros(0)
    pos = positions[: len(owner)].to("cpu", torch.long).numpy()
    return owner, pos, np.array([prompt_lens.get(rid, 0) for rid in req_ids])[owner]


def _read_by(batch: ForwardBatch, req_ids: list[str], owner: np.ndarray, pos: np.ndarray,
             prompt_len: np.ndarray) -> None:  # fmt: skip
    """Where each token comes from, for the forward's conditions and monitors."""
    # pos may view vLLM's positions buffer, which its next step rewrites
    batch.req_ids, batch.owner, batch.pos = list(req_ids), owner, pos.copy()
    batch.in_prompt, batch.prompt_len = pos < prompt_len, prompt_len


class Layouts:
    """``lay_out_forward`` with the composition kept while a batch's membership holds, and
    the steers' layout kept while neither it nor any token count changes and no steer has
    a per-position rule (a steady decode): a forward that reads gets only its tokens'
    positions afresh."""

    def __init__(self) -> None:
        self._composition: Composition | None = None
        self._last: tuple[tuple, ForwardBatch] | None = None

    def forward(self, req_ids: list[str], starts: list[int], positions: torch.Tensor,
                plans: dict[str, Plan | None],
                prompt_lens: Callable[[], dict[str, int]]) -> ForwardBatch:  # fmt: skip
        members = tuple(req_ids)
        comp = self._composition
        if comp is None or comp.req_ids != members:
            comp = self._composition = Composition.of(req_ids, plans)
            self._last = None
        key = (tuple(starts), positions.shape[0])
        if comp.fixed and self._last is not None and self._last[0] == key:
            last = self._last[1]
            return last.again(positions) if comp.reads else last
        lens = {} if comp.every_position else prompt_lens()
        batch = lay_out_forward(req_ids, starts, positions, plans, lens, comp)
        self._last = (key, batch) if comp.fixed else None
        return batch

    def clear(self) -> None:
        self._composition, self._last = None, None


@dataclass(frozen=True)
class Operands:
    """One ``SiteSteer``'s tensors as its op takes them, for a forward of ``tokens`` on
    one device in one dtype; made once per layout (``SiteSteer.ready``)."""

    op: Bound  # the op with its direction ([d_model], or [tokens, d_model] for a fused Add)
    alpha: torch.Tensor  # [tokens, 1]
    touched: torch.Tensor  # [tokens, 1] bool
    everywhere: bool  # every token is touched: the op's output is the answer as it is


Moved = dict[tuple[tuple[str, ...], torch.device, torch.dtype, Any], tuple[torch.Tensor, Bound]]


def operands(steer: SiteSteer, act: torch.Tensor, vectors: Mapping[str, torch.Tensor],
             moved: Moved) -> Operands:  # fmt: skip
    """``steer``'s operands for ``act`` (``[tokens, d_model]``): its vectors from
    ``vectors`` by key, moved to ``act``'s device and dtype once (kept in ``moved``, each
    with its op bound to it: a unit, a plane made once)."""
    key = (steer.vector_keys, act.device, act.dtype, steer.op)
    if key not in moved:
        missing = [k for k in steer.vector_keys if k not in vectors]
        if missing:
            raise KeyError(f"vector {missing[0]} was never sent to this worker")
        stacked = [vectors[k] for k in steer.vector_keys]
        made = operand(steer.op, stacked[0] if steer.index is None else torch.stack(stacked),
                       act.dtype, act.device)  # fmt: skip
        moved[key] = (made, bind(steer.op, made))
    tokens = act.shape[0]
    direction, op = moved[key]
    if steer.index is not None:  # a fused Add: each token's own vector
        op = bind(steer.op, direction[steer.index[:tokens].to(act.device)])
    touched = steer.touched[:tokens].to(act.device)
    alpha = steer.alphas[:tokens].to(act.device, act.dtype)[:, None]
    return Operands(op, alpha, touched[:, None], bool(touched.all()))
