"""Where a compiled decode's time goes, by profile: the Python side (cProfile, by own time)
and the tensor side (``torch.profiler``, by self CPU time).

GPT-2-small shape (random weights), batch 1 and 8, 64 new tokens, steered at
``blocks.6.hook_resid_pre``; the first call (compilation) is left out. Prints the top lines
of each profile, and ``main`` returns them as a RESULTS.md section.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time

import torch
from bench_engine import _gpt2_small

import steerlab as sl

SECTION = "## Where the compiled step's time goes (profile)"
PROMPT = "The quick brown fox jumps over a"


def profile(lm: sl.SteerableModel, batch: int, new: int = 64, top: int = 12) -> list[str]:
    steer = sl.Steer("blocks.6.hook_resid_pre", torch.randn(768), alpha=4.0, positions="generated")

    def run() -> object:
        return lm.generate([PROMPT] * batch, steer, max_new_tokens=new, stop_at_eos=False)

    run()  # compile
    start = time.perf_counter()
    run()
    wall = time.perf_counter() - start
    python = cProfile.Profile()
    python.enable()
    run()
    python.disable()
    text = io.StringIO()
    pstats.Stats(python, stream=text).sort_stats("tottime").print_stats(top)
    lines = [f"### Batch {batch}: {wall:.3f} s for {new} new tokens ({1000 * wall / new:.1f} ms a token)",
             "", "Python, by own time (cProfile; its overhead inflates small calls):", "", "```"]  # fmt: skip
    body = text.getvalue().splitlines()
    start_at = next(i for i, line in enumerate(body) if "ncalls" in line)
    lines += [line.rstrip() for line in body[start_at : start_at + top + 1] if line.strip()]
    lines += ["```", "", "Tensor ops, by self CPU time (torch.profiler):", "", "```"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
    lines += ["  " + line.rstrip() for line in table.splitlines() if line.strip()]  # no "## "
    lines += ["```", ""]
    return lines


def main() -> list[str]:
    lines = [
        SECTION,
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        f"`benchmarks/profile_compiled.py` ({torch.get_num_threads()} CPU threads, torch "
        f"{torch.__version__}), GPT-2-small shape, steered at one site, after compilation.",
        "",
    ]
    lm = sl.wrap(*_gpt2_small()).compile()  # one model: each batch bucket compiles once
    for batch in (1, 8):
        lines += profile(lm, batch)
    return lines


if __name__ == "__main__":
    from sections import replace_section

    out = main()
    print("\n".join(out))
    replace_section(out)
