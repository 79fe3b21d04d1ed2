"""The compiled fast path (``lm.compile()``) against eager steerlab and HF ``generate``.

Ratios are measured in one run, each timing the median of ``bench_engine.REPEATS`` runs
interleaved with its baseline. Compile time (the first call of each bucket) is reported on its own and
kept out of the timings. HF ``generate`` runs unsteered: it is the floor steering tools sit
at. The panel rows time a slider change on ``steerlab-tiny`` to its first streamed token and
to its 30th, with the debounce reported separately.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

import torch
from bench_engine import _median_pair  # the same interleaved medians as the engine rows

import steerlab as sl
from steerlab.testing import char_tokenizer

PROMPT = "The quick brown fox jumps over a"


def _hf_generate(model: torch.nn.Module, ids: torch.Tensor, new: int) -> Callable[[], object]:
    def run() -> object:
        with torch.inference_mode():
            return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                  min_new_tokens=new, do_sample=False, pad_token_id=2)  # fmt: skip

    return run


def _row(rows: list[dict], name: str, ours: float, base: float, target: str) -> None:
    ratio = base / ours
    rows.append(dict(comparison=name, ours_s=ours, baseline_s=base, ratio=ratio, target=target))
    print(f"{name:<62} ours {ours:7.3f}s  baseline {base:7.3f}s  ratio {ratio:5.2f}  ({target})")


def tiny_rows(rows: list[dict], compile_s: dict[str, float]) -> None:
    fast = sl.load("steerlab-tiny", backend="hf", compile=True)
    eager = sl.load("steerlab-tiny", backend="hf")
    vector = torch.randn(fast.d_model)
    steer = sl.Steer("blocks.2.hook_resid_pre", vector, alpha=4.0, positions="generated")
    start = time.perf_counter()
    fast.generate(PROMPT, steer, max_new_tokens=64, stop_at_eos=False)
    compile_s["steerlab-tiny, batch 1"] = time.perf_counter() - start
    ids = torch.tensor([fast.tokenizer(PROMPT)["input_ids"]])

    def compiled() -> object:
        return fast.generate(PROMPT, steer, max_new_tokens=64, stop_at_eos=False)

    ours, base = _median_pair(compiled, lambda: eager.generate(PROMPT, steer, max_new_tokens=64,
                                                               stop_at_eos=False))  # fmt: skip
    _row(rows, "steerlab-tiny b1, 64 new, steered: compiled vs eager steerlab", ours, base,
         "report")  # fmt: skip
    ours, base = _median_pair(compiled, _hf_generate(eager.model, ids, 64))
    _row(rows, "steerlab-tiny b1, 64 new, steered: compiled vs HF generate", ours, base, ">=2.5x")


def gpt2_rows(rows: list[dict], compile_s: dict[str, float], new: int = 64) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                        bos_token_id=0, eos_token_id=1, pad_token_id=2)  # fmt: skip
    model = GPT2LMHeadModel(config).eval()
    lm = sl.wrap(model, char_tokenizer()).compile()
    steer = sl.Steer("blocks.6.hook_resid_pre", torch.randn(768), alpha=4.0, positions="generated")
    for batch in (1, 8):
        prompts = [PROMPT] * batch
        ids = torch.tensor([lm.tokenizer(PROMPT)["input_ids"]] * batch)
        start = time.perf_counter()
        lm.generate(prompts, steer, max_new_tokens=new, stop_at_eos=False)
        compile_s[f"GPT-2-small shape, batch {batch}"] = time.perf_counter() - start
        ours, base = _median_pair(
            lambda p=prompts: lm.generate(p, steer, max_new_tokens=new, stop_at_eos=False),
            _hf_generate(model, ids, new),
        )
        _row(rows, f"GPT-2-small shape b{batch}, {new} new, steered: compiled vs HF generate",
             ours, base, ">=1.25x")  # fmt: skip


def _panel_latency(lm: sl.SteerableModel, vector: torch.Tensor, debounce: float) -> dict:
    """Median over slider moves: debounce, first token after it, 30th token after it."""
    panel = sl.SteeringPanel(lm, {"v": vector}, prompt="Once upon a time", layer=2,
                             max_new_tokens=30, debounce=debounce)  # fmt: skip
    marks: dict[str, float] = {}
    shown, run = panel._show_texts, panel._generate
    tokens = [0]

    def show(prompt: str, texts: list[str]) -> None:
        tokens[0] += 1
        marks.setdefault("first", time.perf_counter())
        marks["last"] = time.perf_counter()
        shown(prompt, texts)

    def generate(request: object) -> str:
        marks["start"] = time.perf_counter()
        return run(request)  # type: ignore[arg-type]

    panel._show_texts, panel._generate = show, generate  # type: ignore[method-assign]
    samples: list[tuple[float, float, float]] = []
    for i in range(6):
        marks.clear()
        tokens[0] = 0
        moved = time.perf_counter()
        panel.controls.alpha.value = 2.0 + i
        panel.wait()
        samples.append((marks["start"] - moved, marks["first"] - marks["start"],
                        marks["last"] - marks["start"]))  # fmt: skip
    panel.close()
    debounce_s, first, last = (statistics.median(s) for s in zip(*samples))
    return {
        "debounce": debounce_s,
        "first": first,
        "last": last,
        "threads": threading.active_count(),
    }


def panel_rows(rows: list[dict], compile_s: dict[str, float]) -> list[str]:
    fast = sl.load("steerlab-tiny", backend="hf", compile=True)
    eager = sl.load("steerlab-tiny", backend="hf")
    vector = torch.randn(fast.d_model) * 2
    start = time.perf_counter()
    fast_t = _panel_latency(fast, vector, 0.15)  # the panel's first run compiles
    compile_s["panel (steerlab-tiny, batch 2), whole first measurement"] = (
        time.perf_counter() - start
    )
    eager_t = _panel_latency(eager, vector, 0.15)
    _row(rows, "panel: slider -> first token after debounce (compiled vs eager)",
         fast_t["first"], eager_t["first"], "<0.05 s")  # fmt: skip
    _row(rows, "panel: slider -> 30th token after debounce (compiled vs eager)",
         fast_t["last"], eager_t["last"], "report")  # fmt: skip
    return [
        f"- Panel debounce (timer to run start): {fast_t['debounce'] * 1000:.0f} ms compiled, "
        f"{eager_t['debounce'] * 1000:.0f} ms eager (set to 150 ms). First token after it: "
        f"{fast_t['first'] * 1000:.1f} ms compiled, {eager_t['first'] * 1000:.1f} ms eager; "
        f"30th token: {fast_t['last'] * 1000:.0f} ms compiled, {eager_t['last'] * 1000:.0f} ms eager."
    ]


def first_call() -> float:
    """Seconds of a new process's first compiled call (GPT-2-small shape, batch 1, 64 new):
    compilation, or loading it from inductor's cache, plus the call itself."""
    from bench_engine import _gpt2_small

    lm = sl.wrap(*_gpt2_small()).compile()
    steer = sl.Steer("blocks.6.hook_resid_pre", torch.randn(768), alpha=4.0, positions="generated")
    start = time.perf_counter()
    lm.generate(PROMPT, steer, max_new_tokens=64, stop_at_eos=False)
    return time.perf_counter() - start


def across_processes() -> list[str]:
    """The first compiled call in two fresh processes sharing one new inductor cache folder:
    the first compiles, the second loads what the first wrote (torch's on-disk FX graph and
    AOTAutograd caches, on by default; ``TORCHINDUCTOR_CACHE_DIR`` moves them)."""
    import os
    import subprocess
    import sys
    import tempfile

    times = []
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": folder}
        for _ in range(2):
            out = subprocess.run([sys.executable, __file__, "--first-call"], env=env, check=True,
                                 capture_output=True, text=True).stdout  # fmt: skip
            times.append(float(out.strip().splitlines()[-1]))
    print(f"first call, new process: {times[0]:.1f} s (empty cache), {times[1]:.1f} s (cached)")
    return [
        f"- First compiled call of a new process, GPT-2-small shape, batch 1, 64 new tokens "
        f"(the call itself included): {times[0]:.1f} s with an empty inductor cache, "
        f"{times[1]:.1f} s in the next process, which loads the compiled graphs from the cache "
        "on disk (target: <=30 s, or cached across processes)."
    ]


def run() -> tuple[list[dict], list[str]]:
    rows: list[dict] = []
    compile_s: dict[str, float] = {}
    tiny_rows(rows, compile_s)
    notes = panel_rows(rows, compile_s)
    gpt2_rows(rows, compile_s)
    notes += [f"- First call (compile included), {k}: {v:.1f} s" for k, v in compile_s.items()]
    notes += across_processes()
    for note in notes:
        print(note)
    return rows, notes


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--first-call"]:
        print(first_call())
    else:
        run()
