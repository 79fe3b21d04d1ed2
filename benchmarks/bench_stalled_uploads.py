"""Benchmark: one client's latency beside clients stalled mid-upload (issue 41).

steerlab-tiny is served on loopback in this process. A client sends 2-token
``/v1/completions`` requests one after another, alone, then while 20 other clients hold
connections open having sent their headers and half their body. The phases alternate for
``ROUNDS`` rounds (the machine's load drifts; alternating spreads it over both), at the
server's default 5 ms batching window and at a 200 ms one. Wanted: beside the stalled
clients, within 10 ms of alone.

    .venv/bin/python benchmarks/bench_stalled_uploads.py     # about a minute

It sends only to 127.0.0.1.
"""

from __future__ import annotations

import socket
import statistics
import time

import httpx
import torch

import steerlab as sl
from steerlab.server import ServedModels, create_app
from steerlab.server.background import serve_in_background

STALLED = 20
ROUNDS = 5
PER_PHASE = 8
WINDOWS_MS = (5.0, 200.0)
BODY = {"model": "steerlab-tiny", "prompt": "Once upon a time", "max_tokens": 2,
        "temperature": 0}  # fmt: skip


def _latencies(client: httpx.Client, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        client.post(url + "/v1/completions", json=BODY).raise_for_status()
        out.append(time.perf_counter() - start)
    return out


def _stall(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nContent-Length: 1000\r\n\r\n{\"model\": ")  # fmt: skip
    return sock


def measure(lm: sl.SteerableModel, window_ms: float) -> tuple[float, float]:
    """Median seconds per request: alone, and beside the stalled clients."""
    alone: list[float] = []
    beside: list[float] = []
    app = create_app(ServedModels(lm), window_ms=window_ms)
    with serve_in_background(app, idle_timeout=60) as url, httpx.Client(timeout=60) as client:
        _latencies(client, url, 3)  # warm
        for _ in range(ROUNDS):
            alone += _latencies(client, url, PER_PHASE)
            stalled = [_stall(url) for _ in range(STALLED)]
            time.sleep(0.2)  # every head and half-body read
            beside += _latencies(client, url, PER_PHASE)
            for sock in stalled:
                sock.close()
            time.sleep(0.2)
    return statistics.median(alone), statistics.median(beside)


def section() -> list[str]:
    """The measurement as RESULTS.md rows: alone and beside the stalled uploads, per window."""
    torch.set_num_threads(1)  # a 2-token completion gains nothing from more; shared cores
    # make threaded kernels' timings swing by hundreds of milliseconds
    lm = sl.load("steerlab-tiny", backend="hf")
    rows = []
    for window in WINDOWS_MS:
        alone, beside = measure(lm, window)
        rows.append(f"| {window:g} ms | {alone * 1000:.1f} | {beside * 1000:.1f} | "
                    f"+{(beside - alone) * 1000:.1f} | <= +10 ms |")  # fmt: skip
    return [
        "## Server: one client beside stalled uploads",
        "",
        f"`benchmarks/bench_stalled_uploads.py`: steerlab-tiny served on loopback; a client's "
        f"2-token `/v1/completions` alone, then while {STALLED} clients hold connections open "
        f"after their headers and half their body, alternating for {ROUNDS} rounds of "
        f"{PER_PHASE} requests; medians, 1 torch thread. A request is announced to the "
        "batching window only once its body has arrived, so a stalled upload holds no batch.",
        "",
        "| batching window | alone (ms) | beside stalled (ms) | difference | target |",
        "|---|---|---|---|---|",
        *rows,
    ]


def main() -> None:
    print("\n".join(section()))


if __name__ == "__main__":
    main()
