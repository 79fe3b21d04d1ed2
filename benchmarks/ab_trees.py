"""Two checkouts of steerlab, timed in the same run on the same workloads: new over old.

    python benchmarks/ab_trees.py OLD_TREE NEW_TREE [--rounds 7]

Each tree gets one worker process per workload (``PYTHONPATH`` set to the tree, so it
imports that tree's ``steerlab``), which builds its model and warms up once (the compiled
workload compiles there). The driver then asks the two workers in turn, round after round,
so machine load hits both alike, and prints each workload's median seconds and the ratio
new/old (1.00 costs the same; above 1 the new tree is slower). Public API only, so any two
commits compare. Workloads, on the GPT-2-small shape of ``bench_engine`` (32-token prompt):

- ``eager-b1``: one row, one Add steer, 32 new tokens;
- ``eager-b8-alphas``: one steer at 8 alphas, 8 rows, 32 new tokens (one plan steer);
- ``eager-conditioned``: a conditioned steer and a monitor, 4 prompts, 16 new tokens;
- ``compiled-b8``: the compiled step (inductor), one steer at 8 alphas, 32 new tokens;
- ``grid-140``: the benchmark's shape on steerlab-tiny: 10 prompts x 14 alphas, 8 tokens.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKLOADS = ("eager-b1", "eager-b8-alphas", "eager-conditioned", "compiled-b8", "grid-140")

WORKER = r"""
import sys, time, torch
torch.set_num_threads(int(sys.argv[2]))
import steerlab as sl
from transformers import GPT2Config, GPT2LMHeadModel
from steerlab.testing import char_tokenizer

name = sys.argv[1]
PROMPT = "The quick brown fox jumps over a"
if name == "grid-140":
    lm = sl.load("steerlab-tiny", backend="hf")
else:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                        bos_token_id=0, eos_token_id=1, pad_token_id=2)
    lm = sl.wrap(GPT2LMHeadModel(config).eval(), char_tokenizer())
d = lm.d_model
v = torch.randn(d, generator=torch.Generator().manual_seed(1)) / d ** 0.5
steer = sl.Steer("blocks.6.hook_resid_pre", v, 4.0)
alphas = [0.5 * k for k in range(8)]
opts = dict(temperature=0.0, stop_at_eos=False)
if name == "eager-b1":
    run = lambda: lm.generate(PROMPT, steer, max_new_tokens=32, **opts)
elif name == "eager-b8-alphas":
    many = sl.Steer("blocks.6.hook_resid_pre", v, alphas)
    run = lambda: lm.generate(PROMPT, many, max_new_tokens=32, **opts)
elif name == "eager-conditioned":
    cond = sl.Condition("blocks.3.hook_resid_post", v, threshold=-1e9)
    gated = sl.Steer("blocks.6.hook_resid_pre", v, 4.0, when=cond)
    mon = sl.Monitor("m", "blocks.8.hook_resid_post", v)
    prompts = [PROMPT, PROMPT[::-1], PROMPT.upper(), PROMPT[4:]]
    run = lambda: lm.generate(prompts, gated, max_new_tokens=16, monitor=[mon], **opts)
elif name == "compiled-b8":
    lm = lm.compile()
    many = sl.Steer("blocks.6.hook_resid_pre", v, alphas)
    run = lambda: lm.generate(PROMPT, many, max_new_tokens=32, **opts)
else:
    prompts = [f"Tell me about thing {i}." for i in range(10)]
    grid = sl.Steer("blocks.2.hook_resid_pre", v, [float(a) for a in range(14)])
    run = lambda: lm.generate(prompts, grid, max_new_tokens=8, **opts)
run(); run()
print("ready", sl.__file__, file=sys.stderr, flush=True)
print("ready", flush=True)
for line in sys.stdin:
    start = time.perf_counter()
    run()
    print(time.perf_counter() - start, flush=True)
"""


def _worker(tree: Path, name: str, threads: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(tree), "TOKENIZERS_PARALLELISM": "false"}
    # run in the tree: ``python -c`` puts the working folder first on sys.path
    proc = subprocess.Popen([sys.executable, "-c", WORKER, name, str(threads)], env=env,
                            cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "ready":
        raise RuntimeError(f"the {name} worker in {tree} did not start: {line!r}")
    return proc


def _time(proc: subprocess.Popen) -> float:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


def main() -> None:
    args = sys.argv[1:]
    rounds = 7
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        del args[i : i + 2]
    old, new = (Path(a).resolve() for a in args[:2])
    threads = max(1, (os.cpu_count() or 2) // 1)
    print(f"old {old}\nnew {new}\n{rounds} rounds, {threads} threads, one workload at a time\n")
    print("| workload | old s | new s | new / old |\n|---|---|---|---|")
    for name in WORKLOADS:
        a, b = _worker(old, name, threads), _worker(new, name, threads)
        t_old, t_new = [], []
        for _ in range(rounds):
            t_old.append(_time(a))
            t_new.append(_time(b))
        for proc in (a, b):
            proc.stdin.close()  # type: ignore[union-attr]
            proc.wait()
        m_old, m_new = statistics.median(t_old), statistics.median(t_new)
        print(f"| {name} | {m_old:.3f} | {m_new:.3f} | {m_new / m_old:.3f} |", flush=True)


if __name__ == "__main__":
    main()
