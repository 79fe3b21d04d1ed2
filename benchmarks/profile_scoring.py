"""Where a one-prompt scoring request's time goes: lm-eval's multiple choice through
``steerlab serve``, one request at a time, split into timed spans.

The task, models and client are ``bench_scoring.py``'s. One run per model and tokenizer
(lm-eval's remote tokenizer, i.e. the server's ``/tokenize``, and the model's tokenizer on
the client, as ``sl.evals.lm_eval`` runs an in-process model), with wall-clock spans
(``time.perf_counter``) around:

- the client's ``/tokenize`` and ``/v1/completions`` round trips (lm-eval's calls);
- the engine thread's batch (``Scheduler._decode``: checks, the scoring forwards, sampling
  the one new token, the results) and, inside it, the scoring forwards (``prefill_scored``);
- building the JSON response (``responses.completion``).

Everything else in a round trip is HTTP (the client's ``requests``, uvicorn, FastAPI, the
body's validation, the hand-offs between the event loop, the worker thread and the engine
thread). Spans time the same process the client runs in, so the client's own Python counts.

    .venv/bin/python benchmarks/profile_scoring.py      # rewrites its RESULTS.md section
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))

import bench_scoring as bench  # noqa: E402

import steerlab as sl  # noqa: E402
from steerlab.toy import asset_path  # noqa: E402

SECTION = "## Scoring: where a one-prompt request's time goes"
# (module, attribute, span): what each span times
SPANS = [
    ("lm_eval.utils:RemoteTokenizer", "encode", "client: /tokenize round trips"),
    ("lm_eval.models.openai_completions:LocalCompletionsAPI", "model_call",
     "client: /v1/completions round trips"),
    ("steerlab.engine.scheduler:Scheduler", "_decode", "server: engine batch"),
    ("steerlab.engine.local.engine", "prefill_scored", "server: scoring forwards"),
    ("steerlab.server.responses", "completion", "server: JSON response built"),
]  # fmt: skip


def _target(path: str) -> Any:
    import importlib

    module, _, name = path.partition(":")
    found = importlib.import_module(module)
    return getattr(found, name) if name else found


@contextmanager
def spans() -> Iterator[dict[str, list[float]]]:
    """Each of ``SPANS`` timed while inside; the originals put back on the way out."""
    times: dict[str, list[float]] = defaultdict(list)
    saved = []
    for path, attribute, label in SPANS:
        owner = _target(path)
        original = getattr(owner, attribute)
        saved.append((owner, attribute, original))
        setattr(owner, attribute, _timed(original, times[label]))
    try:
        yield times
    finally:
        for owner, attribute, original in saved:
            setattr(owner, attribute, original)


def _timed(fn: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - start)

    return timed


def remote_client(url: str, key: str, model: str) -> Any:
    """``bench_scoring``'s client, but tokenizing through the server's ``/tokenize``."""
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    return LocalCompletionsAPI(
        base_url=f"{url}/v1/completions", model=model, tokenizer_backend="remote",
        tokenized_requests=True, max_retries=1, custom_prefix_token_id=0, auth_token=key,
        header={"Authorization": f"Bearer {key}"}, batch_size=1, num_concurrent=1,
    )  # fmt: skip


def profile_model(name: str, path: Path, tasks: dict[str, Any]) -> list[str]:
    from lm_eval.evaluator import evaluate as run
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    baseline = HFLM(pretrained=hf, tokenizer=AutoTokenizer.from_pretrained(path), batch_size=16,
                    add_bos_token=False, custom_prefix_token_id=0, device="cpu")  # fmt: skip
    base_s, _ = bench.evaluate(baseline, tasks, bench.MC)
    lm = sl.load(path, backend="hf", device="cpu")
    vector = torch.zeros(lm.d_model)
    lines = ["| span | remote tokenizer (s) | ms a request | client tokenizer (s) | "
             "ms a request |", "|---|---|---|---|---|"]  # fmt: skip
    columns = []
    with bench.served(lm, vector) as (url, key):
        for model in (remote_client(url, key, lm.name),
                      bench.client(url, key, lm.name, path, bench.ARMS["1 request at a time"])):  # fmt: skip
            run(lm=model, task_dict={bench.MC: tasks[bench.MC]}, limit=2, bootstrap_iters=0,
                verbosity="ERROR")  # fmt: skip
            lm.engine.prompt_store.clear()
            with spans() as times:
                start = time.perf_counter()
                run(lm=model, task_dict={bench.MC: tasks[bench.MC]}, bootstrap_iters=0,
                    verbosity="ERROR")  # fmt: skip
                wall = time.perf_counter() - start
            columns.append(_split(wall, dict(times)))
    requests = len(columns[0]["server: engine batch"][1]) or 1
    for label in columns[0]:
        cells = []
        for column in columns:
            total, _ = column[label]
            cells.append(f"{total:.2f} | {1000 * total / requests:.1f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    base_s = min(base_s, bench.evaluate(baseline, tasks, bench.MC)[0])  # before and after
    forwards = columns[-1]["server: scoring forwards"][0]
    head = f"### {name}: lm-eval `hf`, batch 16, {base_s:.2f} s for the same task (the faster "
    head += "of a run before the spans and one after)"
    return [head, "", *lines, "", f"{requests} requests; load average {os.getloadavg()[0]:.2f}. Were "
            f"everything but the scoring forwards free, this arm would take {forwards:.2f} s: "
            f"{base_s / forwards:.2f}x lm-eval `hf`.", ""]  # fmt: skip


def _split(wall: float, times: dict[str, list[float]]) -> dict[str, tuple[float, list[float]]]:
    """The spans, and what lies between them, as (seconds, the span's calls)."""
    total = {label: sum(times.get(label, [])) for _, _, label in SPANS}
    trips = total["client: /v1/completions round trips"]
    engine, built = total["server: engine batch"], total["server: JSON response built"]
    out = {label: (total[label], times.get(label, [])) for _, _, label in SPANS}
    out["server: engine batch besides the forwards"] = (
        engine - total["server: scoring forwards"],
        [],
    )
    out["HTTP and hand-offs (round trips less engine and response)"] = (trips - engine - built, [])
    out["lm-eval's own work (wall less round trips)"] = (
        wall - trips - total["client: /tokenize round trips"],
        [],
    )
    out["wall"] = (wall, [])
    return out  # fmt: skip


def main() -> list[str]:
    from lm_eval.tasks import TaskManager, get_task_dict

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [SECTION, "", f"Measured {started} by `benchmarks/profile_scoring.py` on cpu "
             f"({torch.get_num_threads()} CPU threads): the multiple-choice task of "
             "`bench_scoring.py`, one request at a time (lm-eval `local-completions`, one "
             "prompt a request), unsteered; wall-clock spans (module docstring). The client "
             "runs in the server's process, so its Python shares the interpreter.", ""]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="steerlab-profile-scoring-") as tmp:
        folder = bench.write_tasks(Path(tmp), 48, 12)
        manager = TaskManager(include_path=str(folder), include_defaults=False)
        tasks = get_task_dict([bench.MC], manager)
        for name, path in (("GPT-2-small shape", bench.gpt2_small(Path(tmp) / "gpt2-small")),
                           ("steerlab-tiny", Path(asset_path("steerlab-tiny")))):  # fmt: skip
            lines += profile_model(name, path, tasks)
    return lines


if __name__ == "__main__":
    from sections import replace_section

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))  # as bench_scoring.py
    replace_section(main())
