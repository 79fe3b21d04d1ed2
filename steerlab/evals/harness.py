"""``lm_eval``: lm-evaluation-harness scores of a steered model, beside the unsteered ones.

Two paths, chosen by what ``lm_eval`` is given:

- **An in-process model** is handed to lm-eval as a model of steerlab's own
  (``evals/inprocess.py``), which calls the engine's scoring directly: no server, no HTTP.
  Multiple-choice contexts are fed once for all their choices, every document's rolling
  windows go together, and the steer (at ``alpha``) is on every request. Its rolling windows
  are cut as lm-eval's ``hf`` model cuts them at the model's window (``max_length=n_ctx``), so
  its per-sample values equal ``hf``'s.
- **A server's URL**: lm-eval's ``local-completions`` model talks to ``steerlab serve``, with
  token-id prompts, ``echo`` and ``logprobs``. A steered run names a *preset* as its model (a
  server model name that stands for the base model steered at a fixed alpha), because lm-eval's
  scoring path cannot send a ``steering`` field. It sends 16 prompts a request, one request at
  a time (the fastest of lm-eval's request styles in ``benchmarks/bench_scoring.py``), and a
  perplexity task's windows of every document together, 16 a request (``completions_model``),
  where lm-eval's API models send one document a request. lm-eval's API models assume a
  2048-token window; ``lm_eval`` tells them the server's (``n_ctx``, of which lm-eval keeps one
  token for the token each scoring request samples, so windows are one token shorter than
  ``hf``'s at ``n_ctx``), and tokenizing goes through the server's ``/tokenize``.
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steerlab.core.errors import SteerError
from steerlab.core.rows import SteerArg, as_steers, checked_steers
from steerlab.core.scalars import as_int, as_real
from steerlab.core.steer import Steer, at_alphas
from steerlab.core.table import Table

if TYPE_CHECKING:
    from steerlab.model import SteerableModel

_NOT_METRICS = ("alias", "sample_len")  # lm-eval's per-task bookkeeping, beside the metrics
STEERED = "steered"  # what an in-process model's steered run is called
# prompts per request: the fastest of lm-eval's request styles (benchmarks/bench_scoring.py)
BATCH = 16


@dataclass(frozen=True)
class HarnessResult:
    """lm-eval's results for the unsteered model and, when a steer was given, the steered one.

    ``unsteered`` and ``steered`` are what ``lm_eval.simple_evaluate`` returned (its
    ``results``, ``configs``, ``samples`` with ``log_samples=True`` ...).

    >>> run = lambda acc: {"results": {"my_task": {"acc,none": acc, "acc_stderr,none": 0.02}}}
    >>> HarnessResult(run(0.61), run(0.58), "steerlab-tiny", "steered").table()
    lm-eval: steerlab-tiny vs preset 'steered'
         task  metric  unsteered  unsteered_stderr  steered  steered_stderr  delta
      my_task     acc       0.61              0.02     0.58            0.02  -0.03
    """

    unsteered: dict[str, Any]
    steered: dict[str, Any] | None
    model: str
    preset: str | None
    steer: str | None = None  # an in-process run's steer, in words (a preset is a server's)

    def table(self) -> Table:
        """Per task and metric: unsteered, steered and the difference, each with its stderr."""
        records = []
        for task, metrics in self.unsteered["results"].items():
            other = (self.steered or {}).get("results", {}).get(task, {})
            for key, value in metrics.items():
                name, _, filt = key.partition(",")
                if "_stderr" in name or name in _NOT_METRICS or not isinstance(value, (int, float)):
                    continue
                record: dict[str, Any] = {"task": task, "metric": name, "filter": filt,
                                          "unsteered": float(value)}  # fmt: skip
                record["unsteered_stderr"] = _number(metrics.get(f"{name}_stderr,{filt}"))
                if self.steered is not None:
                    record["steered"] = _number(other.get(key))
                    record["steered_stderr"] = _number(other.get(f"{name}_stderr,{filt}"))
                    record["delta"] = record["steered"] - record["unsteered"]
                records.append(record)
        columns = ["task", "metric", "unsteered", "unsteered_stderr"]
        if self.steered is not None:
            columns += ["steered", "steered_stderr", "delta"]
        title = f"lm-eval: {self.model}"
        if self.preset:
            title += f" vs preset {self.preset!r}"
        elif self.steered is not None:
            title += f" vs steered{f' ({self.steer})' if self.steer else ''}, in-process"
        # A stderr lm-eval has no formula for is "N/A" in its own tables; the records hold NaN.
        return Table(title, columns, records, {c: ".4g" for c in columns[2:]}, missing="N/A")

    def __repr__(self) -> str:
        return repr(self.table())

    def _repr_html_(self) -> str:
        return self.table()._repr_html_()


def lm_eval(
    lm_or_url: SteerableModel | str,
    tasks: str | Sequence[str],
    steer: SteerArg | str = None,
    *,
    alpha: float = 1.0,
    limit: int | float | None = None,
    include_path: str | Path | None = None,
    num_fewshot: int | None = None,
    model_args: Mapping[str, Any] | None = None,
    api_key: str | None = None,
    log_samples: bool = False,
    bootstrap_iters: int = 1000,
    seed: int = 0,
) -> HarnessResult:
    """Run lm-eval's tasks on a steerlab model, unsteered and steered.

    Which path runs depends on ``lm_or_url`` (see the module's docstring): an in-process
    model is scored by its own engine inside lm-eval, with no server and no HTTP, its values
    equal to lm-eval's ``hf`` model's; a URL is scored through that server by lm-eval's
    ``local-completions`` model, 16 prompts a request (``model_args={"batch_size": ...}``).
    ``result.unsteered["config"]["model"]`` names what ran, and ``"steerlab_path"`` the path.

    Args:
        lm_or_url: an in-process model, or the base URL of a running ``steerlab serve``
            (``http://127.0.0.1:8000``).
        tasks: lm-eval task names (its registry, or tasks in ``include_path``).
        steer: for a model: a steering vector, a ``Steer`` or a list of them, at ``alpha``.
            For a URL: the name of one of the server's presets. None: unsteered only.
        alpha: multiplies the steer's own alpha (a vector's scale included).
        limit: documents per task (an int), or a share of them (a float below 1).
        include_path: a folder of task YAML files (local tasks; nothing downloads).
        num_fewshot: few-shot examples per prompt (the task's default when None).
        model_args: for a URL, extra ``local-completions`` arguments, overriding steerlab's;
            an in-process model takes none.
        api_key: a server's API key (``steerlab serve --api-key``).
        log_samples: keep lm-eval's per-sample records (``result.unsteered["samples"]``).
        bootstrap_iters: lm-eval's bootstrap resamples for the stderr of metrics without a
            closed form (its default, 100000, is slow on a laptop).
        seed: lm-eval's random, numpy, torch and few-shot seeds.

    Returns:
        a ``HarnessResult``; ``result.table()`` sets steered beside unsteered.

    Needs the ``evals`` extra (``pip install 'steerlab[evals]'``) and, for a URL, the
    ``server`` extra.

    >>> sl.evals.lm_eval(lm, ["my_task"], vec, alpha=4, include_path="tasks/")  # needs a task folder; slow  # doctest: +SKIP
    """
    try:
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager
    except ImportError as error:
        raise ImportError("sl.evals.lm_eval needs lm-evaluation-harness: "
                          "pip install 'steerlab[evals]'.") from error  # fmt: skip
    in_process = not isinstance(lm_or_url, str)
    names, limit, alpha, num_fewshot = _check_arguments(tasks, limit, alpha, include_path,
                                                        num_fewshot, in_process, model_args)  # fmt: skip
    steers = _in_process_steers(lm_or_url, steer, alpha) if in_process else []  # type: ignore[arg-type]
    manager = _task_manager(TaskManager, names, include_path)
    _check_task_names(manager, names, include_path)

    def run(model: Any) -> dict[str, Any]:
        out = simple_evaluate(
            model=model, tasks=names, limit=limit, num_fewshot=num_fewshot,
            task_manager=manager, log_samples=log_samples, bootstrap_iters=bootstrap_iters,
            random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
            fewshot_random_seed=seed,
        )  # fmt: skip
        if out is None:
            raise RuntimeError("lm-eval returned no results.")
        return dict(out)

    if not isinstance(lm_or_url, str):  # in-process: the engine scores, no server
        from steerlab.evals.inprocess import lm_eval_model

        with _no_dataset_bars():
            unsteered = run(lm_eval_model(lm_or_url))
            steered = run(lm_eval_model(lm_or_url, steers, name=f"{lm_or_url.name} + "
                                        f"{STEERED}")) if steers else None  # fmt: skip
        said = f"{', '.join(s.site for s in steers)} at alpha {alpha:g}" if steers else None
        return HarnessResult(unsteered, steered, lm_or_url.name, None, said)

    with _server(lm_or_url, steer, alpha, api_key) as (url, card, preset, key):
        model = card["id"]
        args = _client_args(url, card, key, model_args)

        def served(name: str) -> dict[str, Any]:
            out = run(completions_model({**args, "model": name}))
            # lm-eval names the model by its class; say what ran: the server's model or preset
            out.setdefault("config", {}).update(model=name, steerlab_path=f"server {url}")
            return out

        with _no_dataset_bars(), _no_request_bars():
            unsteered = served(model)
            steered = served(preset) if preset else None
    return HarnessResult(unsteered, steered, model, preset)


def _check_arguments(
    tasks: Any,
    limit: Any,
    alpha: Any,
    include_path: Any,
    num_fewshot: Any,
    in_process: bool,
    model_args: Mapping[str, Any] | None,
) -> tuple[list[str], int | float | None, float, int | None]:
    """``(task names, limit, alpha, num_fewshot)`` as plain values (numpy's numbers
    included); every argument refused by name before anything runs."""
    if isinstance(tasks, str):
        names = [tasks]
    elif isinstance(tasks, Sequence) and not isinstance(tasks, bytes):
        names = list(tasks)
    else:
        names = []
    if not names or not all(isinstance(t, str) and t for t in names):
        raise SteerError(f"tasks must be a task name or a list of them; got {tasks!r:.80}.",
                         "tasks")  # fmt: skip
    whole, share = as_int(limit), as_real(limit)
    if limit is not None and not (whole is not None and whole >= 1 or whole is None and share
                                  is not None and 0 < share <= 1):  # fmt: skip
        raise SteerError("limit must be an int >= 1 or a share in (0, 1]; got "
                         f"{limit!r:.60}.", "limit")  # fmt: skip
    number = as_real(alpha)
    if number is None:
        raise SteerError(f"alpha must be a finite number; got {alpha!r:.60}.", "alpha")
    shots = as_int(num_fewshot)
    if num_fewshot is not None and (shots is None or shots < 0):
        raise SteerError("num_fewshot must be None (the task's default) or an int >= 0; got "
                         f"{num_fewshot!r:.60}.", "num_fewshot")  # fmt: skip
    if include_path is not None and not Path(include_path).is_dir():
        raise SteerError(f"include_path {str(include_path)!r} is not a folder of task files.",
                         "include_path")  # fmt: skip
    if in_process and model_args:
        raise SteerError(
            "model_args are local-completions' settings, for a server's URL; an in-process "
            f"model is scored by its engine directly and takes none (got {dict(model_args)}).",
            "model_args",
        )
    return names, (whole if whole is not None else share), number, shots


def _client_args(url: str, card: Mapping[str, Any], key: str | None,
                 model_args: Mapping[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """``local-completions``' arguments for the server at ``url`` (the user's last)."""
    args: dict[str, Any] = {"base_url": f"{url}/v1/completions", "tokenizer_backend": "remote",
                            "num_concurrent": 1, "batch_size": BATCH, "max_retries": 1,
                            "tokenized_requests": True,
                            "custom_prefix_token_id": _prefix_id(url, key)}  # fmt: skip
    if card.get("n_ctx"):  # lm-eval keeps one token of it for the token a request samples
        args["max_length"] = int(card["n_ctx"])
    if key:  # lm-eval sends a bearer token only from the environment, or from a header
        args.update(auth_token=key, header={"Authorization": f"Bearer {key}"})
    args.update(model_args or {})
    return args


def _in_process_steers(lm: SteerableModel, steer: SteerArg | str, alpha: float) -> list[Steer]:
    """The steers of an in-process run: ``steer`` at ``alpha`` (multiplying its own), checked
    against ``lm`` before anything runs."""
    if isinstance(steer, str):
        raise ValueError(f"steer={steer!r} names a preset, which only a server has; for an "
                         "in-process model give the steering vector or Steer itself.")  # fmt: skip
    return checked_steers(lm, at_alphas(as_steers(steer), [alpha]))


def completions_model(args: Mapping[str, Any]) -> Any:
    """lm-eval's ``local-completions`` model made from ``args`` (its ``model_args``), with
    one change: its rolling loglikelihoods (perplexity tasks) send the windows of every
    document together, ``batch_size`` a request, as lm-eval's ``hf`` model batches them,
    where lm-eval's API models send one document a request. Every window is scored as the
    same prompt either way; a document's loglikelihood is the sum of its windows', in order.
    """
    return _batched_rolling().create_from_arg_obj(dict(args))


@functools.cache
def _batched_rolling() -> Any:
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from steerlab.evals.inprocess import rolling_loglikelihoods

    class BatchedRollingCompletions(LocalCompletionsAPI):  # type: ignore[misc]
        """``local-completions``, sending all documents' rolling windows together."""

        def loglikelihood_rolling(self, requests: list[Any],
                                  disable_tqdm: bool = False) -> list[float]:  # fmt: skip
            # the windows of TemplateAPI.loglikelihood_rolling: one token kept for the sample
            return rolling_loglikelihoods(
                self, requests, self.max_length - 1,
                lambda windows: self._loglikelihood_tokens(windows, disable_tqdm=True))  # fmt: skip

    return BatchedRollingCompletions


def _check_task_names(manager: Any, names: Sequence[str], include_path: Any = None) -> None:
    """Refuse a task lm-eval's ``TaskManager`` does not know (not a name, a pattern of names,
    or a task file), naming it and its closest names, before any server starts; one of the
    toy's tasks is answered with where they are written (``steerlab.toy.tasks.lm_eval_tasks()``)."""
    from steerlab.toy.tasks import TASKS

    known = manager.all_tasks
    for name in names:
        if name in known or manager.match_tasks([name]) or Path(name).is_file():
            continue
        if name in TASKS:
            where = (
                ""
                if include_path is None
                else f" (include_path {str(include_path)!r} does not hold it)"
            )
            raise SteerError(
                f"{name!r} is one of steerlab's toy tasks, which lm-eval knows only from their "
                f"folder{where}: write them with steerlab.toy.tasks.lm_eval_tasks() and pass "
                "include_path=steerlab.toy.tasks.lm_eval_tasks().", "tasks")  # fmt: skip
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise SteerError(
            f"lm-eval has no task {name!r} (in its registry or include_path).{hint} "
            "List them with: lm-eval ls tasks.", "tasks"
        )  # fmt: skip


@contextmanager
def _server(url: str, steer: Any, alpha: float,
            api_key: str | None) -> Iterator[tuple[str, dict[str, Any], str | None, str | None]]:  # fmt: skip
    """``(url, base model's card, preset name or None, api key or None)`` for a server's URL:
    the card is ``/v1/models``'s entry (``id``, ``n_ctx`` ...)."""
    url = url.rstrip("/").removesuffix("/v1")
    cards = _get(url, "/v1/models", api_key)["data"]
    names = [card["id"] for card in cards]
    if steer is not None and not isinstance(steer, str):
        raise ValueError(
            "A server's steered model is one of its presets: start it with "
            "`steerlab serve MODEL --preset NAME=VECTOR_FILE@ALPHA` and pass steer='NAME' "
            f"(it serves {names}). lm-eval's scoring requests cannot carry a vector."
        )
    if steer is not None and steer not in names[1:]:
        raise ValueError(f"The server has no preset {steer!r}; its models are {names}.")
    if alpha != 1.0:
        raise ValueError("alpha= applies to an in-process steer; a preset has its own.")
    yield url, cards[0], steer, api_key


def _task_manager(manager: Any, names: list[str], include_path: str | Path | None) -> Any:
    """lm-eval's task index over ``include_path`` alone when that folder holds every task
    named: indexing lm-eval's own ~15,000 task files takes 5-20 s on a laptop, and dominated
    a toy run. Otherwise the folder and lm-eval's tasks together."""
    if include_path is not None:
        local = manager(include_path=str(include_path), include_defaults=False)
        if all(name in local.all_tasks for name in names):
            return local
    return manager(include_path=None if include_path is None else str(include_path))


@contextmanager
def _no_dataset_bars() -> Iterator[None]:
    """Without the ``datasets`` library's bar for loading a task's split (lm-eval's own bars
    over requests stay: they are the progress of long work)."""
    from datasets.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()


@contextmanager
def _no_request_bars() -> Iterator[None]:
    """Without lm-eval's "Requesting API" bars (and its per-request tokenizing bars), which
    its API models draw with no option to turn them off: kilobytes of stderr in a notebook
    for a few seconds of requests."""
    from lm_eval.api import model
    from lm_eval.models import api_models

    saved = [(module, name, getattr(module, name)) for module in (model, api_models)
             for name in ("tqdm", "tqdm_asyncio") if hasattr(module, name)]  # fmt: skip
    try:
        for module, name, bar in saved:
            setattr(module, name, _QuietGather if name == "tqdm_asyncio" else _quiet(bar))
        yield
    finally:
        for module, name, bar in saved:
            setattr(module, name, bar)


def _quiet(bar: Any) -> Any:
    """``bar`` (tqdm) with ``disable=True`` whatever the caller passed."""

    def quiet_bar(*args: Any, **kwargs: Any) -> Any:
        return bar(*args, **{**kwargs, "disable": True})

    return quiet_bar


class _QuietGather:
    """``tqdm_asyncio.gather`` without its bar."""

    @staticmethod
    async def gather(*tasks: Any, **_: Any) -> list[Any]:
        import asyncio

        return list(await asyncio.gather(*tasks))


def _get(url: str, path: str, key: str | None) -> dict[str, Any]:
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.get(url + path, headers=headers, timeout=30)
    response.raise_for_status()
    return dict(response.json())


def _prefix_id(url: str, key: str | None) -> int | None:
    """The token a rolling loglikelihood window starts from: BOS, else EOS, as lm-eval's hf
    model picks it (lm-eval's remote tokenizer reads a BOS id of 0 as missing)."""
    import httpx

    info = _get(url, "/tokenizer_info", key)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    for name in ("bos_token", "eos_token"):
        if info.get(name):
            body = {"prompt": info[name], "add_special_tokens": False}
            response = httpx.post(url + "/tokenize", json=body, headers=headers, timeout=30)
            tokens = response.json().get("tokens", []) if response.status_code == 200 else []
            if len(tokens) == 1:
                return int(tokens[0])
    return None


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan
