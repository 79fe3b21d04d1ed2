"""Run every benchmark and rewrite ``benchmarks/RESULTS.md`` whole (ratios measured in one run).

    make bench            # every benchmark at full size (about 20 minutes on 2 cores)
    make bench QUICK=1    # smaller sizes, the slowest sections left out (about 3 minutes);
                          # writes benchmarks/RESULTS_quick.md, never RESULTS.md
    BENCH_THREADS=2 make bench    # torch threads (1 by default)

The file starts with the machine, its load average before and after, the library versions
and each section's wall time. It is rewritten after every section, so a run cut short
leaves the sections that finished, and a section that fails is reported in its place while
the others still run.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import bench_chat  # noqa: E402
import bench_engine  # noqa: E402
import bench_evals  # noqa: E402
import bench_features  # noqa: E402
import bench_scoring  # noqa: E402
from sections import table  # noqa: E402

HERE = Path(__file__).parent
QUICK = os.environ.get("QUICK", "") not in ("", "0")
DEVICE = os.environ.get("STEERLAB_DEVICE", "cpu")
# torch's own thread count unless BENCH_THREADS says otherwise (BENCH_THREADS=1 on a shared,
# busy CPU, where a two-thread kernel waits for a descheduled partner and small ops were
# measured 5-30x slower); both arms of every ratio run with the same setting.
THREADS = int(os.environ.get("BENCH_THREADS", str(torch.get_num_threads())))
_PACKAGES = ("torch", "transformers", "transformer-lens", "lm-eval", "fastapi", "steerlab")


def engine_section() -> list[str]:
    if QUICK:
        bench_engine.REPEATS, bench_engine.NEW = 1, 12
    rows = bench_engine.run(backends=not QUICK)
    return [
        "## Engine",
        "",
        f"GPT-2-small-shaped random model, {bench_engine.NEW} new tokens, median of "
        f"{bench_engine.REPEATS} interleaved runs each. `ratio` is the baseline's time over "
        "ours for speed rows (>1 is faster), ours over the baseline's for time rows.",
        "",
        *table(rows),
    ]


def compiled_section() -> list[str]:
    """The compiled fast path (bench_compiled.py), then the GPU figures kept from a GPU run."""
    import bench_compiled

    rows, notes = bench_compiled.run()
    lines = ["## Compiled fast path (`lm.compile()`), CPU", "", *table(rows, digits=3)]
    gpu = HERE / "RESULTS_compiled_gpu.md"
    return lines + ["", *notes] + (["", gpu.read_text().rstrip()] if gpu.exists() else [])


def features_section() -> list[str]:
    if QUICK:
        bench_features.NEW, bench_features.D_SAE = 8, 4096
    return bench_features.main()


def scoring_section() -> list[str]:
    return bench_scoring.main(QUICK, DEVICE)


def scoring_in_process_section() -> list[str]:
    return bench_scoring.main_in_process(QUICK, DEVICE)


def server_section() -> list[str]:
    import bench_server  # needs the server extra (fastapi, uvicorn, httpx)

    if QUICK:
        bench_server.N_REQUESTS, bench_server.NEW, bench_server.WINDOWS_MS = 4, 8, (5.0,)
        return bench_server.section(bench_server.run()).splitlines()
    texts = [bench_server.section(bench_server.run()),
             bench_server.stall_section(bench_server.stall_run())]  # fmt: skip
    return "\n\n".join(texts).splitlines()


def reads_section() -> list[str]:
    import bench_reads

    return bench_reads.main(quick=QUICK)


def train_section() -> list[str]:
    import bench_train

    # the 4-layer model in both runs: the section's ratios are LoReFT's cost over Add's, and
    # a full-size compile of its own would take a third of the suite's 20 minutes
    return bench_train.section(small=True, compiled=not QUICK)


def train_throughput_section() -> list[str]:
    import bench_train_reft

    return bench_train_reft.section(epochs=3 if QUICK else 10)


def stalled_uploads_section() -> list[str]:
    import bench_stalled_uploads

    return bench_stalled_uploads.section()


def profile_section() -> list[str]:
    import profile_compiled

    return profile_compiled.main()


def benchmark_section() -> list[str]:
    import bench_benchmark

    return bench_benchmark.main()


def research_run_section() -> list[str]:
    import bench_research_run

    return bench_research_run.main()


def sweep_section() -> list[str]:
    import bench_sweep

    bench_sweep.main()  # writes RESULTS_sweep.md
    return ["## Sweep", "", "See [RESULTS_sweep.md](RESULTS_sweep.md), written by this run."]


# (title, the section's lines, whether QUICK runs it): cheapest first, so a run cut short
# still has most sections
SECTIONS: list[tuple[str, Callable[[], list[str]], bool]] = [
    ("engine", engine_section, True),
    ("scoring in-process (lm-eval)", scoring_in_process_section, True),
    ("scoring (lm-eval)", scoring_section, True),
    ("SAE features", features_section, True),
    ("server", server_section, True),
    ("server: stalled uploads", stalled_uploads_section, True),
    ("evaluation: steerability", bench_evals.main, False),
    ("evaluation: the benchmark protocol", benchmark_section, True),
    ("evaluation: a research run", research_run_section, False),
    ("chat sessions", bench_chat.main, False),
    ("conditions and monitors", reads_section, True),
    ("learned steering", train_section, True),
    ("training throughput", train_throughput_section, True),
    ("compiled step", compiled_section, False),
    ("compiled step profile", profile_section, False),
    ("sweep", sweep_section, False),
]


def header(started: str, load: tuple[float, ...], timings: list[tuple[str, str]],
           total: float) -> list[str]:  # fmt: skip
    now = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    versions = ", ".join(f"{p} {_version(p)}" for p in _PACKAGES)
    return [
        "# Benchmarks",
        "",
        f"Written by `make bench{' QUICK=1' if QUICK else ''}` (`benchmarks/run.py`), started "
        f"{started}, {total:.0f} s so far. Every ratio compares two arms measured in this run.",
        "",
        f"- Machine: {platform.platform()}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch threads, device {DEVICE}.",
        f"- Load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in load)} at the start, "
        f"{now} at the last section's end. The machine is shared: a load above its CPU count "
        "slows every arm, most of all two-thread kernels on small inputs.",
        f"- Versions: Python {platform.python_version()}, {versions}.",
        "",
        "| section | wall time |",
        "|---|---|",
        *(f"| {name} | {seconds} |" for name, seconds in timings),
    ]


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main() -> None:
    out = HERE / ("RESULTS_quick.md" if QUICK else "RESULTS.md")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load, start = os.getloadavg(), time.perf_counter()
    print(
        f"{platform.platform()}, {os.cpu_count()} CPUs, load average {load}; torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads; writing {out}",
        flush=True,
    )
    timings: list[tuple[str, str]] = []
    body: list[str] = []
    torch.set_num_threads(THREADS)
    threads = torch.get_num_threads()
    for name, section, quick in SECTIONS:
        if QUICK and not quick:
            timings.append((name, "left out (QUICK)"))
            continue
        began = time.perf_counter()
        try:
            lines = section()
        except Exception as error:  # the others still run; the failure is reported in place
            traceback.print_exc()
            lines = [f"## {name}: failed", "", f"`{type(error).__name__}: {error}`"]
        torch.set_num_threads(threads)  # a section may have set its own
        seconds = time.perf_counter() - began
        timings.append((name, f"{seconds:.0f} s"))
        print(f"== {name}: {seconds:.0f} s", flush=True)
        body += ["", *lines]
        text = header(started, load, timings, time.perf_counter() - start) + body
        out.write_text("\n".join(text).rstrip("\n") + "\n")
    print(f"wrote {out} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
