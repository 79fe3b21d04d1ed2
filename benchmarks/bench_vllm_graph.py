"""Steering inside vLLM's compiled graph against the same engine unsteered, and against
eager steering (``make bench-vllm``'s companion, in .venv-vllm):

    .venv-vllm/bin/python benchmarks/bench_vllm_graph.py [--model PATH] [--no-write]

Two engines on one model: compiled with steerlab's graph steering (the default) and
eager (``vllm_args={"enforce_eager": True}``). On each, greedy
fixed-length generation (``NEW`` tokens) at batch 1 and 16: unsteered, and steered (an
Add at the middle block's ``resid_pre``, every row its own alpha; five ops; an Add gated
by a per-token or a prompt condition, whose forwards the compiled engine runs uncompiled
where it must). Times are the best of
``REPEATS``, each arm in turn. The table replaces its section of RESULTS.md (``sections.replace_section``).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from sections import replace_section

import steerlab as sl

NEW, REPEATS = 32, 7
PROMPTS = ["Once upon a time", "The sea was calm and", "In the forest there was", "A cat"]


def _ops(d_model: int) -> list:
    g = torch.Generator().manual_seed(1)
    return [sl.Add(), sl.Ablate(), sl.Clamp(1.0), sl.Cap(-0.5, 0.5),
            sl.Rotate(90.0, torch.randn(d_model, generator=g))]  # fmt: skip


def _rows(lm: sl.SteerableModel, batch: int, steered: bool, kind: str = "add") -> list:
    """``batch`` rows; steered: at the middle block, each row its own alpha: an Add
    (``kind`` "add"), one of five operations in turn ("mixed"), or an Add on every token
    gated by a per-token condition a block earlier ("token"; compiled, its forwards run
    uncompiled) or by a prompt condition ("prompt"; compiled, its prefill runs uncompiled)."""
    from steerlab.engine import Request, Sampling, Steer

    g = torch.Generator().manual_seed(0)
    v = torch.randn(lm.d_model, generator=g) * 0.3
    layer = lm.n_layers // 2
    site = f"blocks.{layer}.hook_resid_pre"
    read = {"token": "token", "prompt": "mean"}.get(kind)
    when = None if read is None else sl.Condition(
        f"blocks.{layer - 1}.hook_resid_pre", torch.randn(lm.d_model, generator=g), 0.0,
        read=read, score="projection")  # fmt: skip
    sampling = Sampling(max_new_tokens=NEW, stop_at_eos=False)
    ops = _ops(lm.d_model)
    out = []
    for i in range(batch):
        ids = tuple(lm.tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"])
        op = ops[i % len(ops)] if kind == "mixed" else sl.Add()
        steers = (Steer(site, v, 1.0 + i / 8, "all", op, when=when),) if steered else ()
        out.append(Request(ids, steers, sampling, f"row{i}"))
    return out


def _plain(path: str, batches: tuple[int, ...]) -> dict[int, float]:
    """Plain vLLM compiled on the same prompts (no steerlab): best time at each batch."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=path, tokenizer=path, dtype="float32", max_model_len=128, block_size=32,
              enable_chunked_prefill=False, enforce_eager=False)  # fmt: skip
    tok = AutoTokenizer.from_pretrained(path)
    params = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    out = {}
    for batch in batches:
        prompts = [TokensPrompt(prompt_token_ids=tok(PROMPTS[i % len(PROMPTS)])["input_ids"])
                   for i in range(batch)]  # fmt: skip
        llm.generate(prompts, params, use_tqdm=False)
        out[batch] = float("inf")
        for _ in range(REPEATS):
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            out[batch] = min(out[batch], time.perf_counter() - start)
    return out


def _best(lm: sl.SteerableModel, rows: list) -> float:
    (best,) = _interleaved(lambda: lm.engine.run(rows))
    return best


def _interleaved(*runs: Callable[[], object]) -> list[float]:
    """Best time of each of ``runs`` over ``REPEATS`` rounds, each round running every
    one in turn (after a warm-up each), so a slow spell of the machine hits them alike."""
    for run in runs:
        run()
    best = [float("inf")] * len(runs)
    for _ in range(REPEATS):
        for k, run in enumerate(runs):
            start = time.perf_counter()
            run()
            best[k] = min(best[k], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="steerlab-tiny")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    common = {"block_size": 32, "enable_chunked_prefill": False}
    start = time.perf_counter()
    compiled = sl.load(args.model, backend="vllm", max_model_len=128, vllm_args=common)
    compiled_start = time.perf_counter() - start
    start = time.perf_counter()
    eager = sl.load(args.model, backend="vllm", max_model_len=128,
                    vllm_args={**common, "enforce_eager": True})  # fmt: skip
    eager_start = time.perf_counter() - start
    lines = [
        f"## vLLM: steering inside the compiled graph, {Path(args.model).name} "
        "(`benchmarks/bench_vllm_graph.py`)",
        "",
        f"{args.model}, float32, greedy, {NEW} new tokens, best of {REPEATS} rounds (each "
        "round runs the three arms in turn); steered at the middle block's resid_pre, each "
        "row its own alpha: an Add, one of five ops a row, or an Add gated by a condition "
        "a block earlier (projection > 0 on a random direction) that the compiled engine "
        "decides in uncompiled forwards. Engine start (this run, "
        f"with whatever compile cache it found): compiled {compiled_start:.0f} s, eager "
        f"{eager_start:.0f} s.",
        "",
        "| batch, steers | compiled unsteered tok/s | compiled steered tok/s | steered / "
        "unsteered (target >= 0.95) | eager steered tok/s | compiled / eager, steered |",
        "|---|---|---|---|---|---|",
    ]
    arms = {"add": "Add, alphas per row", "mixed": "5 ops, a row each",
            "token": "Add, per-token gate (every forward uncompiled)",
            "prompt": "Add, prompt gate on the prompt (prefill uncompiled)"}  # fmt: skip
    for batch, kind in ((1, "add"), (16, "add"), (16, "mixed"), (16, "token"), (16, "prompt")):
        plain_rows = _rows(compiled, batch, False)
        steered_rows = _rows(compiled, batch, True, kind)
        t_plain, t_steer, t_eager = _interleaved(
            partial(compiled.engine.run, plain_rows), partial(compiled.engine.run, steered_rows),
            partial(eager.engine.run, steered_rows))  # fmt: skip
        tok = batch * NEW
        lines.append(f"| {batch}, {arms[kind]} | {tok / t_plain:.0f} | {tok / t_steer:.0f} | "
                     f"{t_plain / t_steer:.2f}x | {tok / t_eager:.0f} | "
                     f"{t_eager / t_steer:.2f}x |")  # fmt: skip
        print(lines[-1], flush=True)
    mine = {batch: _best(compiled, _rows(compiled, batch, False)) for batch in (1, 16)}
    compiled.engine.close()
    eager.engine.close()
    from steerlab.loading import _locate

    plain = _plain(_locate(args.model), (1, 16))
    lines += ["", "What steerlab's graph sites and engine cost unsteered, against plain vLLM "
              "compiled on the same rows (no steerlab): " + ", ".join(
                  f"batch {b}: {NEW * b / plain[b]:.0f} tok/s plain, {NEW * b / mine[b]:.0f} "
                  f"steerlab ({plain[b] / mine[b]:.2f}x)" for b in (1, 16)) + "."]  # fmt: skip
    print("\n".join(lines))
    if not args.no_write:
        replace_section(lines)


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
