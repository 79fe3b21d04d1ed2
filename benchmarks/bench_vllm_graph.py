"""Steering inside vLLM's compiled graph against the same engine unsteered, and against
eager steering (``make bench-vllm``'s companion, in .venv-vllm):

    .venv-vllm/bin/python benchmarks/bench_vllm_graph.py [--model PATH] [--no-write]

Two engines on one model: compiled with steerlab's graph steering (the default) and
eager (``vllm_args={"enforce_eager": True}``). On each, greedy
fixed-length generation (``NEW`` tokens) at batch 1 and 16: unsteered, and steered (an
Add at the middle block's ``resid_pre``, every row its own alpha). Times are the best of
``REPEATS``, each arm in turn. The table replaces its section of RESULTS.md (``sections.replace_section``).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from sections import replace_section

import steerlab as sl

NEW, REPEATS = 32, 5
PROMPTS = ["Once upon a time", "The sea was calm and", "In the forest there was", "A cat"]


def _rows(lm: sl.SteerableModel, batch: int, steered: bool) -> list:
    from steerlab.engine import Request, Sampling, Steer

    v = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(0)) * 0.3
    site = f"blocks.{lm.n_layers // 2}.hook_resid_pre"
    sampling = Sampling(max_new_tokens=NEW, stop_at_eos=False)
    out = []
    for i in range(batch):
        ids = tuple(lm.tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"])
        steers = (Steer(site, v, 1.0 + i / 8, "all", sl.Add()),) if steered else ()
        out.append(Request(ids, steers, sampling, f"row{i}"))
    return out


def _best(lm: sl.SteerableModel, rows: list) -> float:
    lm.engine.run(rows)  # warm-up
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        lm.engine.run(rows)
        best = min(best, time.perf_counter() - start)
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
        "## vLLM: steering inside the compiled graph (`benchmarks/bench_vllm_graph.py`)",
        "",
        f"{args.model}, float32, greedy, {NEW} new tokens, best of {REPEATS}; steered: an Add "
        "at the middle block's resid_pre, each row its own alpha. Engine start (this run, "
        f"with whatever compile cache it found): compiled {compiled_start:.0f} s, eager "
        f"{eager_start:.0f} s.",
        "",
        "| batch | compiled unsteered tok/s | compiled steered tok/s | steered / unsteered "
        "(target >= 0.95) | eager steered tok/s | compiled / eager, steered |",
        "|---|---|---|---|---|---|",
    ]
    for batch in (1, 16):
        t_plain = _best(compiled, _rows(compiled, batch, False))
        t_steer = _best(compiled, _rows(compiled, batch, True))
        t_eager = _best(eager, _rows(eager, batch, True))
        tok = batch * NEW
        lines.append(f"| {batch} | {tok / t_plain:.0f} | {tok / t_steer:.0f} | "
                     f"{t_plain / t_steer:.2f}x | {tok / t_eager:.0f} | "
                     f"{t_eager / t_steer:.2f}x |")  # fmt: skip
        print(lines[-1], flush=True)
    compiled.engine.close()
    eager.engine.close()
    print("\n".join(lines))
    if not args.no_write:
        replace_section(lines)


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
