"""Learned steering: a LoReFT steer's cost against an Add at batch 8 (eager and compiled),
and BiPO training throughput (tokens/s) with its peak memory.

Run from the repository root: ``python benchmarks/bench_train.py [--small]``. ``--small``
uses a 4-layer, 256-wide GPT-2 shape (quick on a busy CPU); the default is GPT-2-small's
shape. Timings are medians of ``bench_engine.REPEATS`` interleaved runs.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import torch
from bench_engine import _median_pair

import steerlab as sl
from steerlab.testing import char_tokenizer

PROMPT = "The quick brown fox jumps over a"
NEW = 32


def _model(small: bool) -> sl.SteerableModel:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    width, layers = (256, 4) if small else (768, 12)
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=8 if small else 12,
                        vocab_size=50257, n_positions=1024, bos_token_id=0, eos_token_id=1,
                        pad_token_id=2)  # fmt: skip
    return sl.wrap(GPT2LMHeadModel(config).eval(), char_tokenizer())


def _reft(d: int, site: str, positions: str) -> sl.LoReFT:
    g = torch.Generator().manual_seed(0)
    R = torch.linalg.qr(torch.randn(d, 4, generator=g))[0].T.contiguous()
    return sl.LoReFT(site, R, torch.randn(4, d, generator=g), torch.randn(4, generator=g),
                     positions=positions)  # fmt: skip


def steer_rows(lm: sl.SteerableModel, label: str) -> list[tuple[str, float, float]]:
    """(row, LoReFT s, Add s) at batch 8, both at every position and both at f3+l3."""
    site = f"blocks.{lm.n_layers // 2}.hook_resid_post"
    prompts = [PROMPT] * 8
    rows = []
    for positions in ("all", "first:3+last:3"):
        add = sl.Steer(site, torch.randn(lm.d_model), alpha=4.0, positions=positions)
        reft = _reft(lm.d_model, site, positions)

        def run(steer: object) -> object:
            return lm.generate(prompts, steer, max_new_tokens=NEW, stop_at_eos=False)

        path = lm.explain(prompts, reft, max_new_tokens=NEW).split(":")[0]
        ours, base = _median_pair(lambda r=reft: run(r), lambda a=add: run(a))
        rows.append((f"{label}, b8, {NEW} new, positions {positions} ({path})", ours, base))
    return rows


def bipo_row(lm: sl.SteerableModel) -> tuple[float, float, int]:
    """(tokens/s, seconds, peak RSS MiB) of a BiPO run: 32 pairs, 2 epochs, batch 8."""
    pairs = [sl.Preference(f"{PROMPT} {i}", " happy and bright.", " sad and cold.")
             for i in range(32)]  # fmt: skip
    site = f"blocks.{lm.n_layers // 2}.hook_resid_pre"
    _, history = sl.train.bipo(lm, pairs, site=site, epochs=2, batch_size=8, progress=False)
    if torch.cuda.is_available():
        peak = torch.cuda.max_memory_allocated() // 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return history.tokens_per_second, history.seconds, peak


def section(small: bool = False, compiled: bool = True) -> list[str]:
    """The benchmark as a RESULTS.md section: LoReFT against Add (eager, then compiled
    unless ``compiled`` is False), and BiPO's training throughput with its peak memory."""
    label = "GPT-2 4x256" if small else "GPT-2-small shape"
    lm = _model(small)
    lines = [
        "## Learned steering (LoReFT, BiPO)",
        "",
        f"`benchmarks/bench_train.py`, {label}, batch 8. Ratio: LoReFT's time over Add's.",
        "",
        "| comparison | LoReFT (s) | Add (s) | LoReFT / Add | target |",
        "|---|---|---|---|---|",
    ]
    rows = list(steer_rows(lm, f"{label}, eager"))
    notes = []
    if compiled:
        lm.compile(backend="aot_eager" if not torch.cuda.is_available() else "inductor")
        start = time.perf_counter()
        rows += list(steer_rows(lm, f"{label}, compiled"))
        notes.append(f"- Compiled rows, compilation included in their warm-up: "
                     f"{time.perf_counter() - start:.0f} s.")  # fmt: skip
    else:
        notes.append("- Compiled rows left out (QUICK).")
    lines += [f"| {name} | {ours:.3f} | {base:.3f} | {ours / base:.2f} | <=1.10x |"
              for name, ours, base in rows]  # fmt: skip
    rate, seconds, peak = bipo_row(_model(small))
    return lines + [
        "",
        *notes,
        f"- BiPO, {label}: {rate:.0f} tokens/s ({seconds:.1f} s for 8 steps), peak memory "
        f"{peak} MiB (resident set on CPU, allocated on CUDA).",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    label = "GPT-2 4x256" if args.small else "GPT-2-small shape"
    lm = _model(args.small)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {sys.platform}")
    print("| comparison | LoReFT (s) | Add (s) | LoReFT / Add | target |")
    print("|---|---|---|---|---|")
    for name, ours, base in steer_rows(lm, f"{label}, eager"):
        print(f"| {name} | {ours:.3f} | {base:.3f} | {ours / base:.2f} | <=1.10x |")
    lm.compile(backend="aot_eager" if not torch.cuda.is_available() else "inductor")
    start = time.perf_counter()
    for name, ours, base in steer_rows(lm, f"{label}, compiled"):
        print(f"| {name} | {ours:.3f} | {base:.3f} | {ours / base:.2f} | <=1.10x |")
    print(
        f"(compiled rows, compilation included in the warm-up: {time.perf_counter() - start:.0f} s)"
    )
    rate, seconds, peak = bipo_row(_model(args.small))
    print(f"BiPO, {label}: {rate:.0f} tokens/s ({seconds:.1f} s for 8 steps), peak memory "
          f"{peak} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
