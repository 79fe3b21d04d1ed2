"""What steerlab's vLLM graph sites cost inside a compiled forward, without vLLM
(``make bench-vllm``'s companion; any environment with torch):

    python benchmarks/bench_graph_sites.py [--no-write]

A stack of ``Linear(d, d)`` + tanh with one vLLM site after each (every site of a model of
``layers`` blocks, in forward order), compiled as vLLM compiles (inductor, the whole graph,
guards dropped, the token count marked dynamic), run unsteered: what a compiled model pays
for its sites when nothing is steered. Arms, in one process: no sites (the plain stack);
every site as built (``graph.GraphBuffers.steer``: the table's Form terms, the LoReFT
columns and the reads of conditions and monitors); the same without the reads; without the
LoReFT columns; without both. Best of 5 runs of 50 calls, at 1, 16 and 512 tokens, one
thread. The table replaces its section of RESULTS.md (``sections.replace_section``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from sections import replace_section
from torch import nn

from steerlab.core.sites import Site
from steerlab.engine.vllm import graph
from steerlab.engine.vllm.graph import GraphBuffers
from steerlab.engine.vllm.sites import vllm_sites

TOKENS = (1, 16, 512)
SHAPES = ((4, 128), (2, 768))  # (blocks, width): the toy's, and GPT-2's width


def _without(buffers: GraphBuffers, parts: set[str]) -> None:
    """Take the reads out of ``buffers``' sites when ``parts`` names them (the LoReFT
    columns go by ``graph.low_rank_edit``, patched while the arm compiles)."""
    if "reads" in parts:
        buffers.reads.before = lambda slot, act: None  # type: ignore[method-assign]
        buffers.reads.after = lambda slot, act: None  # type: ignore[method-assign]
        buffers.reads.finish = lambda: None  # type: ignore[method-assign]


def _arm(layers: int, d: int, parts: set[str] | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """The compiled stack (``parts`` None: no sites; else the sites without ``parts``)."""
    names = vllm_sites(layers)
    order = sorted(names, key=lambda name: Site.parse(name).forward_order)
    buffers = GraphBuffers(names, 4096, d, torch.float32, torch.device("cpu"))
    if parts is not None:
        _without(buffers, parts)
    torch.manual_seed(0)
    linears = nn.ModuleList(nn.Linear(d, d) for _ in order)
    # every arm's ``forward`` is the same code object and guards are dropped: without a
    # reset, dynamo would hand each arm the first arm's compiled graph
    torch._dynamo.reset()

    def forward(x: torch.Tensor) -> torch.Tensor:
        for linear, site in zip(linears, order):
            x = torch.tanh(linear(x))
            if parts is not None:
                x = buffers.steer(site, x)
        return x

    return torch.compile(forward, fullgraph=True, dynamic=False,
                         options={"guard_filter_fn": torch.compiler.skip_all_guards_unsafe})  # fmt: skip


def _time(fn: Callable[[torch.Tensor], torch.Tensor], tokens: int, d: int) -> float:
    x = torch.randn(tokens, d)
    for _ in range(20):
        fn(x)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(50):
            fn(x)
        best = min(best, (time.perf_counter() - start) / 50)
    return best * 1e6


ARMS = {"no sites": None, "sites as built": set(), "without reads": {"reads"},
        "without LoReFT": {"loreft"}, "without both": {"reads", "loreft"}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = ["## vLLM graph sites, compiled, unsteered (`benchmarks/bench_graph_sites.py`)", "",
             "A Linear+tanh stack with every vLLM site of the model in forward order, compiled "
             "as vLLM compiles it (inductor, whole graph, guards dropped), one thread, nothing "
             "steered; us a call, best of 5 x 50 calls; compile: the first call.", "",
             "| blocks x width | arm | compile s | " + " | ".join(f"{t} tok" for t in TOKENS)
             + " |", "|---|---|---|" + "---|" * len(TOKENS)]  # fmt: skip
    for layers, d in SHAPES:
        for name, parts in ARMS.items():
            with torch.no_grad():
                if parts is not None and "loreft" in parts:
                    saved, graph.low_rank_edit = graph.low_rank_edit, _no_edit
                fn = _arm(layers, d, parts)
                x = torch.randn(4096, d)
                torch._dynamo.mark_dynamic(x, 0)
                start = time.perf_counter()
                fn(x)
                compile_s = time.perf_counter() - start
                times = [_time(fn, t, d) for t in TOKENS]
                if parts is not None and "loreft" in parts:
                    graph.low_rank_edit = saved
            row = (f"| {layers} x {d} | {name} | {compile_s:.0f} | "
                   + " | ".join(f"{t:.0f}" for t in times) + " |")  # fmt: skip
            print(row, flush=True)
            lines.append(row)
    print("\n".join(lines))
    if not args.no_write:
        replace_section(lines)


def _no_edit(act: torch.Tensor, R: torch.Tensor, W: torch.Tensor, b: torch.Tensor,
             keep: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    return torch.zeros_like(act)


if __name__ == "__main__":
    main()
