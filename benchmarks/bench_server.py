"""Benchmark: the steering server's dynamic batching against the same requests one at a time.

A random GPT-2-small-shaped model (12 layers, d_model 768, 50257 tokens, char tokenizer) is
served on loopback in this process. 16 ``/v1/completions`` requests of 64 tokens each (own
prompt, seeded sampling, every other one steered at layer 6) are sent all at once, then one at
a time; the ratio of the two wall times is the batching gain. The server's overhead is one
request through HTTP against in-process ``lm.generate`` for the same request (medians of 3,
interleaved). Writes the "Server benchmark" section of ``RESULTS.md``.

A second case measures how one huge request holds up everyone else: ``STALL_CLIENTS`` clients
send short ``/v1/completions`` requests (one new token, steerlab-tiny) one after another while
another client posts an 8 MB prompt (refused as longer than the context window, after the
server has parsed and tokenized it), against the same clients with no big prompt, in the same
run. It writes the "Server: short requests beside an 8 MB prompt" section.

    .venv/bin/python benchmarks/bench_server.py           # both cases
    .venv/bin/python benchmarks/bench_server.py --stall   # the second case alone (about a minute)

The load generator sends at most ``N_REQUESTS`` requests per phase, only to 127.0.0.1, and
stops sending when ``DEADLINE_S`` has passed (the report then says how many were measured).
"""

from __future__ import annotations

import asyncio
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).parent))

from sections import replace_section  # noqa: E402

import steerlab as sl  # noqa: E402
from steerlab.server import ServedModels, create_app  # noqa: E402
from steerlab.server.background import serve_in_background  # noqa: E402
from steerlab.server.cli import settle_heap  # noqa: E402

N_REQUESTS = 16
NEW = 64
WINDOWS_MS = (5.0, 50.0)  # the server's default batching window, and a longer one
DEADLINE_S = 1200.0  # for the whole benchmark; the sequential phase stops sending after it
SITE = "blocks.6.hook_resid_pre"
TARGET = ">=2.5x"


@dataclass
class Phase:
    """Latencies of one phase's requests, and its wall time."""

    name: str
    wall_s: float
    latencies: list[float]
    batches: int
    cpu_s: float  # this process's CPU time (all threads): steadier than wall on a shared machine

    @property
    def tokens_per_s(self) -> float:
        return len(self.latencies) * NEW / self.wall_s

    def percentile(self, q: float) -> float:
        return _nearest_rank(self.latencies, q)


def _nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def bodies(vector: list[float]) -> list[dict]:
    """The requests: each its own prompt and seed; every other one steered."""
    out = []
    for i in range(N_REQUESTS):
        body = {"model": "bench", "prompt": f"Request {i:02d}: the quick brown fox jumps",
                "max_tokens": NEW, "temperature": 1.0, "seed": i, "ignore_eos": True}  # fmt: skip
        if i % 2:
            body["steering"] = [{"site": SITE, "vector": vector, "alpha": 4.0,
                                 "positions": "generated"}]  # fmt: skip
        out.append(body)
    return out


async def _send(client: httpx.AsyncClient, body: dict) -> float:
    start = time.perf_counter()
    response = await client.post("/v1/completions", json=body)
    response.raise_for_status()
    assert len(response.json()["choices"][0]["token_ids"]) == NEW
    return time.perf_counter() - start


async def _concurrent(url: str, requests: list[dict]) -> tuple[float, list[float]]:
    async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S) as client:
        start = time.perf_counter()
        latencies = await asyncio.gather(*(_send(client, b) for b in requests))
        return time.perf_counter() - start, list(latencies)


async def _sequential(url: str, requests: list[dict], deadline: float) -> tuple[float, list[float]]:
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S) as client:
        start = time.perf_counter()
        for body in requests:
            if time.monotonic() > deadline:
                break
            latencies.append(await _send(client, body))
        return time.perf_counter() - start, latencies


def _batches(url: str) -> int:
    return int(httpx.get(url + "/health", timeout=30).json()["batches"])


def _overhead(url: str, lm: sl.SteerableModel, body: dict) -> tuple[float, float]:
    """Median seconds of one request through the server, and in-process, interleaved."""
    prompt, seed = body["prompt"], body["seed"]

    def local() -> list[int]:  # wait: the engine thread may still be closing its batch
        return lm.generate(prompt, max_new_tokens=NEW, temperature=1.0, seed=seed,
                           stop_at_eos=False, wait=60).tokens[0]  # fmt: skip

    def remote() -> list[int]:
        reply = httpx.post(url + "/v1/completions", json=body, timeout=DEADLINE_S).json()
        return reply["choices"][0]["token_ids"]

    assert local() == remote(), "the server's tokens differ from in-process generate"
    t_server, t_local = [], []
    for _ in range(3):
        for fn, times in ((remote, t_server), (local, t_local)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(t_server), statistics.median(t_local)


def run() -> dict:
    """Every phase; returns the figures for the report."""
    from bench_engine import _gpt2_small

    deadline = time.monotonic() + DEADLINE_S
    load_before = os.getloadavg()
    model, tokenizer = _gpt2_small()
    lm = sl.wrap(model, tokenizer)
    vector = torch.randn(768, generator=torch.Generator().manual_seed(0)).tolist()
    requests = bodies(vector)
    phases: list[Phase] = []
    for window in WINDOWS_MS:
        with serve_in_background(create_app(ServedModels(lm), name="bench",
                                            window_ms=window)) as url:  # fmt: skip
            asyncio.run(_concurrent(url, requests[:2]))  # warm-up
            before, cpu = _batches(url), time.process_time()
            wall, latencies = asyncio.run(_concurrent(url, requests))
            phases.append(Phase(f"concurrent, window {window:g} ms", wall, latencies,
                                _batches(url) - before, time.process_time() - cpu))  # fmt: skip
            print(f"{phases[-1].name}: {wall:.1f} s, {phases[-1].batches} batches", flush=True)
    with serve_in_background(create_app(ServedModels(lm), name="bench")) as url:
        server_s, local_s = _overhead(url, lm, requests[0])
        print(f"one request: server {server_s:.2f} s, in-process {local_s:.2f} s", flush=True)
        before, cpu = _batches(url), time.process_time()
        wall, latencies = asyncio.run(_sequential(url, requests, deadline))
        phases.append(Phase("one at a time", wall, latencies, _batches(url) - before,
                            time.process_time() - cpu))  # fmt: skip
        print(f"one at a time: {wall:.1f} s for {len(latencies)} requests", flush=True)
    return {"phases": phases, "server_s": server_s, "local_s": local_s,
            "load": (load_before, os.getloadavg()), "threads": torch.get_num_threads()}  # fmt: skip


def section(figures: dict) -> str:
    """The markdown section for ``RESULTS.md``."""
    phases: list[Phase] = figures["phases"]
    one = phases[-1]
    before, after = figures["load"]
    overhead = figures["server_s"] - figures["local_s"]
    lines = [
        "## Server benchmark",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with "
        f"`benchmarks/bench_server.py` on {figures['threads']} CPU threads "
        f"({platform.machine()}, torch {torch.__version__}). Random GPT-2-small-shaped model "
        f"served on loopback in the same process; {N_REQUESTS} `/v1/completions` requests of "
        f"{NEW} tokens (own prompt and seed, temperature 1, every other one steered at layer 6). "
        f"Load average (1, 5, 15 min) before: {before[0]:.1f}, {before[1]:.1f}, {before[2]:.1f}; "
        f"after: {after[0]:.1f}, {after[1]:.1f}, {after[2]:.1f} (a shared machine: the "
        "ratios matter, the absolute times do not).",
        "",
        "| requests sent | batches | wall (s) | tokens/s | p50 latency (s) | p99 latency (s) "
        "| throughput vs one at a time | CPU s | per CPU s vs one at a time | target |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for phase in phases:
        ratio = phase.tokens_per_s / one.tokens_per_s
        cpu_ratio = (one.cpu_s / len(one.latencies)) / (phase.cpu_s / len(phase.latencies))
        target = TARGET if phase is not one else ""
        lines.append(
            f"| {phase.name} ({len(phase.latencies)}) | {phase.batches} | {phase.wall_s:.1f} "
            f"| {phase.tokens_per_s:.1f} | {phase.percentile(50):.2f} "
            f"| {phase.percentile(99):.2f} | {ratio:.2f}x | {phase.cpu_s:.1f} | {cpu_ratio:.2f}x "
            f"| {target} |"
        )
    lines += [
        "",
        f"Server overhead for one request ({NEW} tokens, median of 3): "
        f"{figures['server_s']:.3f} s through HTTP against {figures['local_s']:.3f} s for "
        f"in-process `lm.generate`: {overhead * 1000:+.0f} ms "
        f"({figures['server_s'] / figures['local_s']:.2f}x); same tokens.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    texts = [] if "--stall" in args else [section(run())]
    texts.append(stall_section(stall_run()))
    for text in texts:
        print(text)
        replace_section(text.splitlines())


STALL_CLIENTS = 8
STALL_MIN = 20  # short requests per client at least, in each phase
STALL_ROUNDS = 2
BIG_BYTES = 8_000_000


async def _short_client(client: httpx.AsyncClient, body: dict, stop: asyncio.Event) -> list[float]:
    """One client's short requests, one after another, until ``stop`` (and ``STALL_MIN`` sent)."""
    latencies: list[float] = []
    while len(latencies) < STALL_MIN or not stop.is_set():
        start = time.perf_counter()
        response = await client.post("/v1/completions", json=body)
        response.raise_for_status()
        latencies.append(time.perf_counter() - start)
    return latencies


async def _stall_phase(url: str, big: bytes | None, seconds: float) -> dict:
    """Short requests from every client while ``big`` is posted (or for ``seconds``)."""
    short = {"model": "bench", "prompt": "Once upon a time", "max_tokens": 1, "temperature": 0}
    limits = httpx.Limits(max_connections=STALL_CLIENTS + 1)
    async with httpx.AsyncClient(base_url=url, timeout=DEADLINE_S, limits=limits) as client:
        stop = asyncio.Event()
        start = time.perf_counter()
        clients = [asyncio.create_task(_short_client(client, short, stop))
                   for _ in range(STALL_CLIENTS)]  # fmt: skip
        status, big_s = None, 0.0
        if big is None:
            await asyncio.sleep(seconds)
        else:
            await asyncio.sleep(0.2)  # the short clients are under way
            sent = time.perf_counter()
            reply = await client.post("/v1/completions", content=big,
                                      headers={"content-type": "application/json"})  # fmt: skip
            status, big_s = reply.status_code, time.perf_counter() - sent
        stop.set()
        latencies = [t for lat in await asyncio.gather(*clients) for t in lat]
        return {"latencies": latencies, "wall_s": time.perf_counter() - start, "status": status,
                "big_s": big_s}  # fmt: skip


def stall_run() -> dict:
    """The short clients beside an 8 MB prompt, then alone for as long."""
    lm = sl.load("steerlab-tiny", backend="hf")
    words = "Once upon a time, there was a little fox who lived in the woods. "
    big = ('{"model": "bench", "max_tokens": 1, "prompt": "' + words * (BIG_BYTES // len(words))
           + '"}').encode()  # fmt: skip
    loaded, alone = [], []
    app = create_app(ServedModels(lm), name="bench")
    settle_heap()  # as `steerlab serve` does once its model is loaded
    with serve_in_background(app) as url:
        asyncio.run(_stall_phase(url, None, 0.5))  # warm-up
        for _ in range(STALL_ROUNDS):  # interleaved, so a change in the machine's load hits both
            loaded.append(asyncio.run(_stall_phase(url, big, 0.0)))
            alone.append(asyncio.run(_stall_phase(url, None, loaded[-1]["wall_s"])))
            print(f"8 MB prompt: {loaded[-1]['status']} after {loaded[-1]['big_s']:.1f} s",
                  flush=True)  # fmt: skip
    return {"loaded": loaded, "alone": alone, "bytes": len(big), "threads": torch.get_num_threads(),
            "load": os.getloadavg()}  # fmt: skip


def stall_section(figures: dict) -> str:
    """The markdown section for the short-requests-beside-a-big-prompt case."""
    loaded, alone = figures["loaded"], figures["alone"]
    pooled = {name: [t for phase in phases for t in phase["latencies"]]
              for name, phases in (("beside the 8 MB prompt", loaded), ("alone", alone))}  # fmt: skip
    p99 = [_nearest_rank(lat, 99) for lat in pooled.values()]
    big = ", ".join(f"{phase['status']} after {phase['big_s']:.1f} s" for phase in loaded)
    lines = [
        "## Server: short requests beside an 8 MB prompt",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with "
        f"`benchmarks/bench_server.py --stall` on {figures['threads']} CPU threads "
        f"({platform.machine()}, torch {torch.__version__}), load average "
        f"{figures['load'][0]:.1f} after. steerlab-tiny served on loopback in the same process; "
        f"{STALL_CLIENTS} clients each send `/v1/completions` requests of one new token one after "
        f"another while another client posts a {figures['bytes'] / 1e6:.1f} MB prompt, then for "
        f"as long with no big prompt; {STALL_ROUNDS} rounds of both, interleaved, pooled. The big "
        f"prompt was answered {big}: a 400, longer than the context window, found once the "
        "server has parsed and tokenized it (in worker threads). The heap is frozen once the "
        "model is loaded, as `steerlab serve` does (`settle_heap`).",
        "",
        "| phase | short requests | p50 latency (ms) | p99 latency (ms) | max (ms) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, lat in pooled.items():
        lines.append(f"| {name} | {len(lat)} | {_nearest_rank(lat, 50) * 1000:.0f} "
                     f"| {_nearest_rank(lat, 99) * 1000:.0f} | {max(lat) * 1000:.0f} |")  # fmt: skip
    lines += ["", f"p99 beside the big prompt over p99 alone: {p99[0] / p99[1]:.2f}x.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
