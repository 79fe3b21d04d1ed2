"""``SteerWorker``: what steerlab adds to each vLLM worker, through ``worker_extension_cls``.

vLLM mixes this class into its worker class; the engine calls its ``steerlab_*`` methods by
name with ``collective_rpc`` and plain data (no pickle, no callables). Vectors arrive once,
as safetensors bytes keyed by content hash; each request names its steers in
``SamplingParams.extra_args``. The worker hooks a call's sites itself, when vLLM first
schedules a request that steers or reads (``steerlab_attach``); the engine takes the hooks
off at the call's end. The hooks lay out each forward (``batch.lay_out_forward``), read its
conditions (``reads.WorkerReads``), apply its steers where their gates let them, record its
monitors, and count per request the tokens the steers visited. A hook that fails records
the error against its requests, and the engine fails them: nothing is logged and skipped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from torch import nn
from torch.utils.hooks import RemovableHandle

from steerlab.core.steer import SteerData
from steerlab.core.tagging import count_hooks, remove_hooks, tag
from steerlab.engine.plan import Plan
from steerlab.engine.vllm import graph, hooks
from steerlab.engine.vllm.batch import (
    ForwardBatch,
    Layouts,
    Moved,
    SiteSteer,
    Tally,
    operands,
    parse_plan,
)
from steerlab.engine.vllm.graph_reads import GraphFull
from steerlab.engine.vllm.reads import WorkerReads
from steerlab.engine.vllm.sites import layout_for

if graph.built() is not None:  # this worker's model is built with graph steering
    graph.wrap_loader()


STEP = "execute_model"  # the worker's method vLLM calls for each step (``steerlab_attach``)
READ_STEERS = 4096  # distinct steers a call keeps read (``_State.read``) before it starts over


@dataclass
class _State:
    vectors: dict[str, torch.Tensor] = field(default_factory=dict)
    moved: Moved = field(default_factory=dict)  # vectors on a device, bound (``batch.operands``)
    layouts: Layouts = field(default_factory=Layouts)
    handles: list[RemovableHandle] = field(default_factory=list)
    plans: dict[str, Plan | None] = field(default_factory=dict)  # by vLLM request id
    # this call's steers read from requests' data, by that data less alpha (``plan_from_data``)
    read: dict[str, tuple[dict, SteerData]] = field(default_factory=dict)
    fired: Tally = field(default_factory=Tally)  # by row: tokens steered
    errors: dict[str, str] = field(default_factory=dict)  # by row
    batch: ForwardBatch | None = None
    reads: WorkerReads = field(default_factory=WorkerReads)  # conditions and monitors
    uncompiled: dict[str, int] = field(default_factory=dict)  # a compiled model's: by reason
    sites: frozenset[str] = frozenset()  # the sites this call steers or reads
    bare: bool = False  # the model was scanned free of steerlab hooks, none added since
    # the last forward's requests, all read into ``plans``, and whether any carries a plan
    known: tuple[tuple[str, ...], bool] = ((), False)
    buffers: graph.GraphBuffers | None = None  # the model's graph buffers, once ``looked``
    looked: bool = False


def _full_cudagraphs(config: Any) -> bool:
    """Whether vLLM captures the whole model in CUDA graphs: full graphs, or (its GPU model
    runner's opt-in) breakable graphs of the eager model."""
    import vllm.envs as envs
    from vllm.platforms import current_platform

    breakable = envs.VLLM_USE_BREAKABLE_CUDAGRAPH and current_platform.support_static_graph_mode()
    return bool(config.compilation_config.cudagraph_mode.has_full_cudagraphs() or breakable)


class SteerWorker:
    """Named RPCs for steering inside vLLM workers (``worker_extension_cls``)."""

    model_runner: Any  # vLLM's worker provides it

    def _steerlab(self) -> _State:
        if not hasattr(self, "_steerlab_state"):
            self._steerlab_state = _State()
        return self._steerlab_state

    def _steerlab_model(self) -> nn.Module:
        return self.model_runner.get_model()

    def steerlab_describe(self) -> dict[str, Any]:
        """What the engine checks before it trusts hooks: eager mode, the model's family."""
        runner, buffers = self.model_runner, self._steerlab_graph()
        config = runner.vllm_config
        return {
            "model_type": runner.model_config.hf_config.model_type,
            "compilation_mode": int(config.compilation_config.mode),
            # a whole-model CUDA graph replays without the pre-hook that writes the buffers
            "full_cudagraphs": _full_cudagraphs(config),
            "enforce_eager": bool(runner.model_config.enforce_eager),
            "model_class": type(self._steerlab_model()).__name__,
            "graph": buffers is not None,
            "kinds": sorted(buffers.kinds) if buffers is not None else [],  # what it computes
            "vectors": len(self._steerlab().vectors),
            "plans": len(self._steerlab().plans),  # requests read and kept: 0 between calls
        }

    def steerlab_put_vectors(self, blob: bytes) -> list[str]:
        """Store vectors sent as safetensors bytes (tensor name = content hash)."""
        state = self._steerlab()
        vectors = load_safetensors(blob)
        state.vectors.update(vectors)
        return sorted(vectors)

    def steerlab_drop_vectors(self) -> int:
        """Forget every vector sent (between calls only); returns how many there were."""
        state = self._steerlab()
        count = len(state.vectors)
        state.vectors.clear()
        state.moved.clear()
        state.read.clear()  # the steers read hold their ops' tensors
        state.layouts.clear()  # and the operands made from them (``SiteSteer.ready``)
        return count

    def _steerlab_graph(self) -> graph.GraphBuffers | None:
        """The buffers a compiled model steers from (``graph.py``); None when eager."""
        state = self._steerlab()
        if not state.looked:  # looked up once: a module's attribute miss costs a raise
            state.buffers = getattr(self._steerlab_model(), "steerlab_graph", None)
            state.looked = True
        return state.buffers

    def steerlab_graphs(self) -> int:
        """Graphs dynamo has compiled in this worker (the same count after new steers)."""
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])

    def steerlab_uncompiled(self) -> dict[str, int]:
        """A compiled model's forwards that ran uncompiled (``graph.eager_reason``), by
        reason, since the worker started."""
        return dict(self._steerlab().uncompiled)

    def steerlab_attach(self, on: bool = True) -> bool:
        """Hook a call's sites when vLLM first schedules a request that steers or reads
        there (``_steerlab_schedule``), ahead of that step's forward: no RPC before a call.
        ``on`` False stops it: hooks never run, and the engine fails every steered row (the
        tests' compiled model). Returns whether it was on."""
        was = STEP in vars(self)  # vLLM's own, on the class, stays untouched
        if on and not was:
            step = getattr(type(self), STEP)

            def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
                self._steerlab_schedule(scheduler_output)
                return step(self, scheduler_output, *args, **kwargs)

            setattr(self, STEP, execute_model)
        elif was and not on:
            delattr(self, STEP)
        return was

    def _steerlab_schedule(self, scheduler_output: Any) -> None:
        """Read the plans of requests scheduled for the first time; hook the sites they steer
        or read not hooked yet (``steerlab_begin``). A plan unread is its row's error."""
        state = self._steerlab()
        sites: set[str] = set()
        for req in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
            params = getattr(req, "sampling_params", None)
            if req.req_id in state.plans or params is None:
                continue
            try:
                if len(state.read) > READ_STEERS:
                    state.read.clear()
                plan = parse_plan(getattr(params, "extra_args", None), state.vectors, state.read)
            except Exception as err:
                state.errors.setdefault(req.req_id, f"reading its steers: {err!r}")
                continue
            if plan is None:  # nothing kept: a call that steers nothing never ends here
                continue
            state.plans[req.req_id] = plan
            sites |= {steer.site for steer, _ in plan.of_row(0)} | plan.read_sites(0)
        if sites - state.sites:
            try:
                self.steerlab_begin(sorted(state.sites | sites))
            except Exception as err:  # every row that steers or reads fails
                for rid, plan in state.plans.items():
                    if plan is not None:
                        state.errors.setdefault(rid, f"hooking {sorted(sites)}: {err!r}")

    def steerlab_begin(self, sites: list[str]) -> int:
        """Hook ``sites`` (those this worker holds) for one call; returns the hooks added.
        A compiled model's sites built into its graph are hooked already; the others get
        hooks that act only in forwards that run uncompiled (a compiled forward never
        calls them, and never runs with a steer or a read there: ``graph.eager_reason``)."""
        state = self._steerlab()
        self.steerlab_end(scan=False)
        state.bare = False  # from here on a hook may be on before it is recorded
        model = self._steerlab_model()
        # The batch is laid out first: this pre-hook goes on before any site's hook.
        first = model.register_forward_pre_hook(
            tag(lambda _m, _a, kwargs: self._steerlab_lay_out(kwargs)), with_kwargs=True)  # fmt: skip
        state.sites = frozenset(sites)
        buffers = self._steerlab_graph()
        layout = layout_for(self.model_runner.model_config.hf_config.model_type)
        if buffers is None:
            at_sites = hooks.install(model, layout, sites, self._steerlab_apply)
        else:
            unbuilt = [site for site in sites if site not in buffers.sites]
            at_sites = hooks.install(model, layout, unbuilt, self._steerlab_unbuilt)
        last = model.register_forward_hook(tag(lambda _m, _a, out: self._steerlab_done(out)))
        state.handles = [first, *at_sites, last]
        return len(state.handles)

    def steerlab_end(self, scan: bool = True) -> int:
        """Remove every steerlab hook from the model; returns how many there were. Not
        ``scan``: only if some may be on, that is, if hooks were added since the model was
        last scanned free of them (a call's begin, after the last call's end scanned)."""
        state = self._steerlab()
        state.handles, state.batch, state.sites = [], None, frozenset()
        state.layouts.clear()
        buffers = self._steerlab_graph()
        if buffers is not None:
            buffers.eager = None
            buffers.write(None, state.vectors)  # a compiled model steers nothing between calls
        if state.bare and not scan:
            return 0
        removed = remove_hooks(self._steerlab_model())
        state.bare = True
        return removed

    def steerlab_hook_count(self) -> int:
        return count_hooks(self._steerlab_model())

    def steerlab_finish(self) -> int:
        """The end of a call: its hooks off, and everything kept about its rows dropped
        (plans, steers read, counts, errors, vectors moved to the device). Returns the hooks
        removed."""
        state = self._steerlab()
        state.plans.clear()
        state.known = ((), False)
        state.read.clear()  # its ops' and conditions' device copies with them
        state.fired.clear()
        state.errors.clear()
        state.moved.clear()
        state.reads.clear()
        return self.steerlab_end()

    def steerlab_report(self, rows: list[str], forget: list[str],
                        finish: bool = False) -> dict[str, Any]:  # fmt: skip
        """What the hooks did for ``rows`` on this worker: ``{"rank": [pipeline stage,
        tensor-parallel rank], "rows": {row: [tokens steered, error or None]}, "reads":
        {row: RowReads.report()}}``, the reads for the ``forget`` rows (those that
        finished), which are dropped afterwards. ``finish``: then end the call
        (``steerlab_finish``), its hooks off."""
        from vllm.distributed import get_pp_group, get_tp_group

        state = self._steerlab()
        fired = state.fired.sums()
        out = {row: [fired.get(row, 0), state.errors.get(row)] for row in rows}
        done = set(forget)
        asked = done & set(rows)
        reads = {r.name: r.report() for r in state.reads.rows.values() if r.name in asked}
        state.reads.forget(done)
        for row in done:
            fired.pop(row, None)
            state.errors.pop(row, None)
        if done:
            for rid, plan in list(state.plans.items()):
                if plan is not None and plan.names[0] in done:
                    del state.plans[rid]
            state.known = ((), False)
        rank = [get_pp_group().rank_in_group, get_tp_group().rank_in_group]
        if finish:
            self.steerlab_finish()
        return {"rank": rank, "rows": out, "reads": reads}

    def steerlab_pp_buffers(self) -> bool:
        """Allocate the buffers a later pipeline stage receives activations in.

        vLLM's CPU model runner skips this under ``enforce_eager`` and then fails every
        forward on a non-first pipeline stage (``assert self.intermediate_tensors is not
        None`` in ``sync_and_gather_intermediate_tensors``); the GPU runner allocates them in
        its warm-up run. Returns whether anything was allocated.

        Upstream: no vLLM issue for the CPU runner was found (searched 2026-11); the same
        assertion from other causes is vllm-project/vllm#49430 (a model without the buffer
        factory) and vllm-project/vllm-gaudi#728 (Gaudi). Drop this once vLLM's CPU runner
        allocates the buffers itself.
        """
        from vllm.distributed import get_pp_group

        runner = self.model_runner
        if get_pp_group().is_first_rank or runner.intermediate_tensors is not None:
            return False
        runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
            batch_size=runner.max_num_tokens, dtype=runner.model_config.dtype,
            device=runner.device,
        )  # fmt: skip
        return True

    # Hooks (not RPCs): they run inside the model's forward.

    def _steerlab_lay_out(self, kwargs: dict) -> None:
        state = self._steerlab()
        state.batch = None
        try:
            self._steerlab_plan_forward(kwargs)
        finally:
            self._steerlab_write()

    def _steerlab_write(self) -> None:
        """A compiled model's buffers: this forward's steers, or none (never the last's),
        each gated one where its row's decision so far lets it act; and what its
        conditions and monitors read (``graph_reads.py``). A forward the graph cannot
        hold runs uncompiled instead (``_steerlab_uncompiled``)."""
        state, buffers = self._steerlab(), self._steerlab_graph()
        if buffers is None:
            return
        if buffers.eager is not None:  # a module's setattr costs microseconds: only if set
            buffers.eager = None
        batch = state.batch

        def gate(site: str, steer: SiteSteer) -> torch.Tensor:
            assert batch is not None
            return state.reads.mask(site, steer, batch, steer.alphas.shape[0], state.errors)

        try:
            why = (
                None
                if batch is None
                else buffers.eager_reason(batch, self._steerlab_read_sites(batch))
            )
            if why is None:
                found: dict[str, str] = {}  # kept only if the forward runs compiled
                try:
                    buffers.write(batch, state.vectors, gate)
                    buffers.reads.prepare(batch, state.reads, found)
                except GraphFull as err:
                    why = str(err)
                else:
                    for row, error in found.items():
                        state.errors.setdefault(row, error)
            if why is not None:
                self._steerlab_uncompiled(why)
        except Exception as err:
            buffers.eager = None
            buffers.write(None, state.vectors)
            buffers.reads.prepare(None, state.reads, state.errors)
            for row in batch.rows if batch is not None else []:
                state.errors.setdefault(row, f"writing the compiled model's steers: {err!r}")
            state.batch = None

    def _steerlab_uncompiled(self, why: str) -> None:
        """Run this forward uncompiled: vLLM's ``skip_compiled`` calls the model's plain
        forward, whose graph hooks hand the call's sites to ``_steerlab_apply`` (the eager
        engine's path: every op, gate and read), with the buffers steering nothing."""
        from vllm.forward_context import get_forward_context

        state, buffers = self._steerlab(), self._steerlab_graph()
        assert buffers is not None
        buffers.write(None, state.vectors)
        buffers.reads.prepare(None, state.reads, state.errors)
        get_forward_context().skip_compiled = True
        buffers.eager = self._steerlab_at_call_site
        state.uncompiled[why] = state.uncompiled.get(why, 0) + 1

    def _steerlab_unbuilt(self, site: str, act: torch.Tensor) -> torch.Tensor | None:
        """A site the graph lacks, in a forward run uncompiled: the eager path (a compiled
        forward never calls it)."""
        buffers = self._steerlab_graph()
        return None if buffers is None or buffers.eager is None else self._steerlab_apply(site, act)

    def _steerlab_read_sites(self, batch: ForwardBatch) -> frozenset[str]:
        """The sites this forward's conditions and monitors read (each row's, from its plan)."""
        rows = self._steerlab().reads.rows
        return frozenset(site for rid in batch.req_ids if (reads := rows.get(rid)) is not None
                         for site in reads.sites)  # fmt: skip

    def _steerlab_at_call_site(self, site: str, act: torch.Tensor) -> torch.Tensor | None:
        """An uncompiled forward's site: the eager path where the call steers or reads."""
        return self._steerlab_apply(site, act) if site in self._steerlab().sites else None

    def _steerlab_plan_forward(self, kwargs: dict) -> None:
        state = self._steerlab()
        state.reads.new_forward()
        runner = self.model_runner
        batch = runner.input_batch
        n = batch.num_reqs
        req_ids = list(batch.req_ids[:n])
        try:
            if tuple(req_ids) != state.known[0]:  # a new request, or one gone
                for rid in req_ids:
                    if rid not in state.plans:  # read when scheduled, unless that failed
                        params = runner.requests[rid].sampling_params
                        state.plans[rid] = parse_plan(  # an op's tensors travel as vectors do
                            getattr(params, "extra_args", None), state.vectors, state.read
                        )
                    state.reads.track(rid, state.plans[rid], runner.requests[rid])
                state.known = (tuple(req_ids), any(state.plans[rid] for rid in req_ids))
            if not state.known[1]:
                return
            starts = runner.query_start_loc.np[: n + 1].tolist()
            state.batch = state.layouts.forward(
                req_ids,
                starts,
                kwargs["positions"],
                state.plans,
                lambda: {rid: runner.requests[rid].num_prompt_tokens for rid in req_ids},
            )
        except Exception as err:  # every steered request of this forward fails
            for rid in req_ids:
                plan = state.plans.get(rid)
                if plan is not None:
                    state.errors.setdefault(plan.names[0], f"laying out the batch: {err!r}")

    def _steerlab_done(self, output: Any = None) -> None:
        state, buffers = self._steerlab(), self._steerlab_graph()
        if state.batch is not None and not hooks.finite(output):
            self._steerlab_scrub()
        if buffers is not None and buffers.eager is not None:  # ran uncompiled: counted there
            buffers.eager = None
        elif buffers is not None and state.batch is not None:
            self._steerlab_reads("the compiled model's reads", lambda: buffers.reads.feed(
                state.batch, state.reads, state.errors))  # fmt: skip
            short = set(buffers.shortfall())
            for site, steers in state.batch.by_site.items():
                for steer in steers:
                    if site not in short:
                        state.fired.add(steer.rows)
                        continue
                    for row, _ in steer.rows:
                        state.errors.setdefault(row, f"the compiled model steered fewer tokens "
                                                f"at {site} than asked")  # fmt: skip
        state.batch = None

    def _steerlab_scrub(self) -> None:
        """Zero every NaN and inf in this worker's KV cache, after a steered forward whose
        output held one (a steer overflowed; the engine fails that row).

        The overflowing row wrote them into its KV blocks, and vLLM frees and hands those
        blocks to later requests without clearing them. An attention kernel reads a block's
        unused slots too and masks them with weight 0, and 0 * NaN is NaN: every later
        request given such a block, unsteered ones included, would get NaN logits. Finite
        values are untouched, so the rows decoding beside it go on exactly; only forwards
        that carry a steer are checked, so an unsteered engine pays nothing."""
        seen: set[int] = set()
        for kv in self.model_runner.kv_caches:  # layers may share one tensor
            if id(kv) not in seen and kv.is_floating_point():
                seen.add(id(kv))
                torch.nan_to_num_(kv, nan=0.0, posinf=0.0, neginf=0.0)

    def _steerlab_apply(self, site: str, act: torch.Tensor) -> torch.Tensor | None:
        """Conditions read ``site`` first, then its steers act, then monitors read."""
        state = self._steerlab()
        batch = state.batch
        if batch is None:
            return None
        reading = bool(batch.req_ids)  # some request has a condition or a monitor
        if reading:
            self._steerlab_reads(site, lambda: state.reads.before(site, act, batch, state.errors))
        steers = batch.by_site.get(site, [])
        for steer in steers:
            try:
                act = self._steerlab_one(steer, act, site)
            except Exception as err:
                for row, _ in steer.rows:
                    state.errors.setdefault(row, f"at {site}: {err!r}")
        if reading:
            self._steerlab_reads(site, lambda: state.reads.after(site, act, batch))
        return act if steers else None

    def _steerlab_reads(self, site: str, read: Any) -> None:
        """A read that fails fails every request that reads (never a silent gap)."""
        state = self._steerlab()
        try:
            read()
        except Exception as err:
            for reads in state.reads.rows.values():
                state.errors.setdefault(reads.name, f"reading {site}: {err!r}")

    def _steerlab_one(self, steer: SiteSteer, act: torch.Tensor, site: str) -> torch.Tensor:
        state = self._steerlab()
        tokens = act.shape[0]
        ready = steer.ready.get((tokens, act.device, act.dtype))
        if ready is None:
            ready = steer.ready[(tokens, act.device, act.dtype)] = operands(
                steer, act, state.vectors, state.moved)  # fmt: skip
        touched = ready.touched
        if steer.gate is not None:  # counted below as visited: the hook ran either way
            assert state.batch is not None
            gate = state.reads.mask(site, steer, state.batch, tokens, state.errors)
            touched = touched & gate.to(act.device)[:, None]
        new = ready.op(act, ready.alpha)
        state.fired.add(steer.rows)
        if ready.everywhere and steer.gate is None:
            return new
        return torch.where(touched, new, act)
