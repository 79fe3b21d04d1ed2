"""Run every benchmark and write benchmarks/RESULTS.md (ratios measured in one run)."""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import bench_chat  # noqa: E402
import bench_engine  # noqa: E402
import bench_evals  # noqa: E402
import bench_features  # noqa: E402
from sections import replace_section, table  # noqa: E402


def main() -> None:
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor()}")
    rows = bench_engine.run()
    lines = [
        "# Engine benchmark",
        "",
        f"Measured {started} with `make bench` on {torch.get_num_threads()} CPU threads "
        f"(torch {torch.__version__}). Median of 3 interleaved runs each. `ratio` is the "
        "baseline's time over ours for speed rows (>1 is faster), ours over the baseline's for "
        "time rows.",
        "",
        *table(rows),
    ]
    lines += compiled_section()
    out = Path(__file__).parent / "RESULTS.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    bench_chat.append(bench_chat.main(), out)
    replace_section(bench_features.main(), out)
    replace_section(bench_evals.main(), out)
    extra = Path(__file__).parent / "bench_sweep.py"
    if extra.exists():
        import bench_sweep

        bench_sweep.main()
    try:
        import bench_server  # needs the server extra (fastapi, uvicorn, httpx)
    except ImportError as error:
        print(f"skipping the server benchmark: {error}")
    else:
        bench_server.main()  # appends its section to RESULTS.md


def compiled_section() -> list[str]:
    """The compiled fast path (bench_compiled.py), then the GPU figures kept from a GPU run."""
    import bench_compiled

    rows, notes = bench_compiled.run()
    lines = ["", "## Compiled fast path (`lm.compile()`), CPU", "", *table(rows, digits=3)]
    gpu = Path(__file__).parent / "RESULTS_compiled_gpu.md"
    return lines + ["", *notes] + (["", gpu.read_text()] if gpu.exists() else [])


if __name__ == "__main__":
    main()
