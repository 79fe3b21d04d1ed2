"""vLLM with and without compilation, unsteered: start time and greedy tokens/s (issue 39's
ground). Run in .venv-vllm:

    .venv-vllm/bin/python benchmarks/bench_vllm_compile.py [--no-write]

For each model (steerlab-tiny, and a random GPT-2-small shape saved to a temporary folder
with steerlab's character tokenizer) and each mode (``enforce_eager=True``; compiled, vLLM's
default), one process starts a plain ``vllm.LLM`` (no steerlab worker extension: this is
vLLM's own speed), times the start, then greedy fixed-length generation at batch 1 and 16
(best of ``REPEATS``), and reports the compilation mode the worker ran with. Tokens of the
two modes are compared row for row. The table replaces its section of RESULTS.md (``sections.replace_section``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from sections import replace_section

NEW, REPEATS = 32, 3
PROMPTS = ["Once upon a time", "The sea was calm and", "In the forest there was", "A cat"]

CHILD = r"""
import json, sys, time, os
t0 = time.perf_counter()
from vllm import LLM, SamplingParams
folder, eager, new, repeats = sys.argv[1], sys.argv[2] == "eager", int(sys.argv[3]), int(sys.argv[4])
prompts = json.loads(sys.argv[5])
llm = LLM(model=folder, tokenizer=folder, dtype="float32", max_model_len=128,
          enforce_eager=eager, load_format="safetensors")
started = time.perf_counter() - t0
config = llm.llm_engine.vllm_config.compilation_config
mode = int(getattr(config, "mode", getattr(config, "level", -1)) or 0)
params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
out = {"start_s": started, "mode": mode}
for batch in (1, 16):
    rows = [{"prompt_token_ids": list(llm.get_tokenizer()(prompts[i % len(prompts)])["input_ids"])}
            for i in range(batch)]
    llm.generate(rows, params, use_tqdm=False)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        res = llm.generate(rows, params, use_tqdm=False)
        best = min(best, time.perf_counter() - t)
    out[f"tok_s_{batch}"] = batch * new / best
    out[f"tokens_{batch}"] = [list(r.outputs[0].token_ids) for r in res]
print("RESULT " + json.dumps(out), flush=True)
"""


def gpt2_small_shape(folder: Path) -> None:
    """A random GPT-2-small shape with steerlab's character tokenizer, saved in ``folder``
    (``bench_vllm_graph.py`` uses it too)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from steerlab.testing import char_tokenizer

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                        bos_token_id=0, eos_token_id=1)  # fmt: skip
    GPT2LMHeadModel(config).eval().save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)


def _run(folder: str, mode: str, caches: str) -> dict:
    """One engine in its own process; ``caches``: the folder for vLLM's and inductor's
    compile caches (a fresh one is a cold start)."""
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CACHE_ROOT": f"{caches}/vllm",
        "TORCHINDUCTOR_CACHE_DIR": f"{caches}/inductor",
    }
    proc = subprocess.run([sys.executable, "-c", CHILD, folder, mode, str(NEW), str(REPEATS),
                           json.dumps(PROMPTS)], env=env, capture_output=True, text=True,
                          timeout=1800)  # fmt: skip
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"vLLM ({mode}) on {folder} failed:\n{proc.stderr[-3000:]}")


def main() -> None:
    from steerlab.loading import _locate

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "gpt2-small-shape"
        gpt2_small_shape(small)
        for name, folder in (("steerlab-tiny", _locate("steerlab-tiny")),
                             ("GPT-2-small shape", str(small))):  # fmt: skip
            caches = tempfile.mkdtemp(dir=tmp)
            eager = _run(folder, "eager", caches)
            compiled = _run(folder, "compiled", caches)  # cold: nothing compiled yet
            compiled["warm_start_s"] = _run(folder, "compiled", caches)["start_s"]
            same = all(eager[f"tokens_{b}"] == compiled[f"tokens_{b}"] for b in (1, 16))
            rows.append((name, eager, compiled, same))
            print(name, {k: v for k, v in compiled.items() if not k.startswith("tokens")},
                  {k: v for k, v in eager.items() if not k.startswith("tokens")}, same,
                  flush=True)  # fmt: skip
    lines = [
        "## vLLM compiled against eager, unsteered (`benchmarks/bench_vllm_compile.py`)",
        "",
        f"Plain `vllm.LLM` (vllm-cpu, no steerlab extension), float32, greedy, {NEW} new "
        f"tokens, best of {REPEATS}; start = `import vllm` + `LLM()`, compiled from empty "
        "vLLM and inductor caches (cold), then again from what that start cached (warm); "
        "the compilation mode as vLLM reports it (0 = none).",
        "",
        "| model | mode (eager / compiled) | start s (eager / compiled cold / warm) | tok/s batch 1 "
        "(eager / compiled, ratio) | tok/s batch 16 (eager / compiled, ratio) | same tokens |",
        "|---|---|---|---|---|---|",
    ]
    for name, e, c, same in rows:
        lines.append(
            f"| {name} | {e['mode']} / {c['mode']} | {e['start_s']:.0f} / {c['start_s']:.0f} / "
            f"{c['warm_start_s']:.0f} | "
            f"{e['tok_s_1']:.0f} / {c['tok_s_1']:.0f}, {c['tok_s_1'] / e['tok_s_1']:.2f}x | "
            f"{e['tok_s_16']:.0f} / {c['tok_s_16']:.0f}, {c['tok_s_16'] / e['tok_s_16']:.2f}x | "
            f"{'yes' if same else 'no'} |"
        )
    print("\n".join(lines))
    if "--no-write" not in sys.argv:
        replace_section(lines)


if __name__ == "__main__":
    main()
