"""``lm_eval``: lm-evaluation-harness scores of a steered model, beside the unsteered ones.

lm-eval talks to ``steerlab serve`` through its ``local-completions`` model: token-id
prompts, ``echo`` and ``logprobs`` for loglikelihood and multiple-choice tasks, plain
completions for ``generate_until``. A steered run names a *preset* as its model (a server
model name that stands for the base model steered at a fixed alpha), because lm-eval's
scoring path cannot send a ``steering`` field. Given an in-process model, ``lm_eval``
serves it on loopback for the call, with the steer as the preset ``steered``. Given a
server's URL, ``steer`` names one of the server's presets (``--preset NAME=FILE@ALPHA``).

lm-eval sends 16 prompts a request, one request at a time: of its request styles (one
prompt a request, 16 a request, 8 concurrent requests) the fastest in
``benchmarks/bench_scoring.py``, faster than lm-eval's own in-process ``hf`` model, since
the server feeds each multiple-choice context once for all of its choices. Its API models
send a perplexity task (``loglikelihood_rolling``) one document a request whatever the
batch size; ``lm_eval`` uses ``local-completions`` with one change (``completions_model``):
every document's windows go together, 16 a request, as lm-eval's ``hf`` model batches them.

lm-eval's API models assume a 2048-token window; ``lm_eval`` tells them the model's own
(``n_ctx``, of which lm-eval keeps one token for the token each scoring request samples), so
a long document is cut into windows that fit, and a long context is cut from the left, as
lm-eval does for its ``hf`` model, instead of a request the server refuses.

For an in-process model lm-eval tokenizes locally, with the model's own (fast) tokenizer
saved to a temporary folder: lm-eval's remote tokenizer costs two ``/tokenize`` round trips
per loglikelihood (the context, and context plus continuation), which took longer than the
scoring itself on steerlab-tiny (``benchmarks/RESULTS.md``). Both give the same token ids:
the server tokenizes with the same tokenizer, without special tokens, as lm-eval's
``huggingface`` backend does with ``add_bos_token=False``. Against a server's URL, and for a
tokenizer that is not a fast one, tokenizing goes through the server's ``/tokenize``.
"""

from __future__ import annotations

import difflib
import functools
import math
import secrets
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from steerlab.core.rows import SteerArg
from steerlab.core.table import Table

if TYPE_CHECKING:
    from steerlab.model import SteerableModel

_NOT_METRICS = ("alias", "sample_len")  # lm-eval's per-task bookkeeping, beside the metrics
STEERED = "steered"  # the preset name an in-process model's steer is served under
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
        title = f"lm-eval: {self.model}" + (f" vs preset {self.preset!r}" if self.preset else "")
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
    """Run lm-eval's tasks against a steerlab server, unsteered and steered.

    Requests carry 16 prompts each, one request at a time, the fastest request style measured,
    and an in-process model's prompts are tokenized on the client with its own tokenizer
    instead of through the server (see the module's docstring);
    ``model_args={"batch_size": ...}`` changes the first.

    Args:
        lm_or_url: an in-process model (served on loopback for the call), or the base URL
            of a running ``steerlab serve`` (``http://127.0.0.1:8000``).
        tasks: lm-eval task names (its registry, or tasks in ``include_path``).
        steer: for a model: a steering vector, a ``Steer`` or a list of them, at ``alpha``.
            For a URL: the name of one of the server's presets. None: unsteered only.
        alpha: multiplies the steer's own alpha (a vector's scale included).
        limit: documents per task (an int), or a share of them (a float below 1).
        include_path: a folder of task YAML files (local tasks; nothing downloads).
        num_fewshot: few-shot examples per prompt (the task's default when None).
        model_args: extra ``local-completions`` arguments, overriding steerlab's.
        api_key: a server's API key (``steerlab serve --api-key``); an in-process model is
            served with a key of its own, known only to this call.
        log_samples: keep lm-eval's per-sample records (``result.unsteered["samples"]``).
        bootstrap_iters: lm-eval's bootstrap resamples for the stderr of metrics without a
            closed form (its default, 100000, is slow on a laptop).
        seed: lm-eval's random, numpy, torch and few-shot seeds.

    Returns:
        a ``HarnessResult``; ``result.table()`` sets steered beside unsteered.

    Needs the ``evals`` extra (``pip install 'steerlab[evals]'``) and, for an in-process
    model, the ``server`` extra.

    >>> sl.evals.lm_eval(lm, ["my_task"], vec, alpha=4, include_path="tasks/")  # needs a task folder; slow  # doctest: +SKIP
    """
    try:
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager
    except ImportError as error:
        raise ImportError("sl.evals.lm_eval needs lm-evaluation-harness: "
                          "pip install 'steerlab[evals]'.") from error  # fmt: skip
    names = [tasks] if isinstance(tasks, str) else list(tasks)
    if not names or not all(isinstance(t, str) and t for t in names):
        raise ValueError(f"tasks must be a task name or a list of them; got {tasks!r}.")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))
                              or limit <= 0 or (isinstance(limit, float) and limit > 1)):  # fmt: skip
        raise ValueError(f"limit must be an int >= 1 or a share in (0, 1]; got {limit!r}.")
    if not math.isfinite(alpha):
        raise ValueError(f"alpha must be finite; got {alpha!r}.")
    if include_path is not None and not Path(include_path).is_dir():
        raise ValueError(f"include_path {str(include_path)!r} is not a folder of task files.")
    manager = _task_manager(TaskManager, names, include_path)
    _check_task_names(manager, names)

    with _server(lm_or_url, steer, alpha, api_key) as (url, card, preset, key, folder):
        model = card["id"]
        args: dict[str, Any] = {"base_url": f"{url}/v1/completions", "tokenizer_backend": "remote",
                                "num_concurrent": 1, "batch_size": BATCH, "max_retries": 1,
                                "tokenized_requests": True,
                                "custom_prefix_token_id": _prefix_id(url, key)}  # fmt: skip
        if card.get("n_ctx"):  # lm-eval keeps one token of it for the token a request samples
            args["max_length"] = int(card["n_ctx"])
        if folder is not None and "tokenizer_backend" not in (model_args or {}):
            # no /tokenize round trips: the server's own tokenizer, on the client
            args.update(tokenizer_backend="huggingface", tokenizer=folder, add_bos_token=False)
        if key:  # lm-eval sends a bearer token only from the environment, or from a header
            args.update(auth_token=key, header={"Authorization": f"Bearer {key}"})
        args.update(model_args or {})

        def run(name: str) -> dict[str, Any]:
            out = simple_evaluate(
                model=completions_model({**args, "model": name}), tasks=names,
                limit=limit, num_fewshot=num_fewshot, task_manager=manager,
                log_samples=log_samples, bootstrap_iters=bootstrap_iters, random_seed=seed,
                numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=seed,
            )  # fmt: skip
            if out is None:
                raise RuntimeError("lm-eval returned no results.")
            return dict(out)

        with _no_dataset_bars(), _no_request_bars():
            unsteered = run(model)
            steered = run(preset) if preset else None
    return HarnessResult(unsteered, steered, model, preset)


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
    from lm_eval import utils
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    class BatchedRollingCompletions(LocalCompletionsAPI):  # type: ignore[misc]
        """``local-completions``, sending all documents' rolling windows together."""

        def loglikelihood_rolling(self, requests: list[Any],
                                  disable_tqdm: bool = False) -> list[float]:  # fmt: skip
            texts = [request.args[0] for request in requests]
            windows: list[tuple[Any, ...]] = []
            counts = []
            for text in texts:  # the windows of TemplateAPI.loglikelihood_rolling
                split = utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length - 1, context_len=1,
                )  # fmt: skip
                doc = [(None, *utils.make_disjoint_window(w)) for w in split]
                windows += doc
                counts.append(len(doc))
            scores = iter(self._loglikelihood_tokens(windows, disable_tqdm=True))
            out = []
            for text, n in zip(texts, counts):
                total = sum(next(scores)[0] for _ in range(n))
                self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
                out.append(total)
            return out

    return BatchedRollingCompletions


def _check_task_names(manager: Any, names: Sequence[str]) -> None:
    """Refuse a task lm-eval's ``TaskManager`` does not know (not a name, a pattern of names,
    or a task file), naming it and its closest names, before any server starts."""
    known = manager.all_tasks
    for name in names:
        if name in known or manager.match_tasks([name]) or Path(name).is_file():
            continue
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(
            f"lm-eval has no task {name!r} (in its registry or include_path).{hint} "
            "List them with: lm-eval ls tasks."
        )


@contextmanager
def _server(lm_or_url: Any, steer: Any, alpha: float,
            api_key: str | None) -> Iterator[tuple[str, dict[str, Any], str | None, str | None,
                                                   str | None]]:  # fmt: skip
    """``(url, base model's card, preset name or None, api key or None, tokenizer folder or
    None)`` for the call: the card is ``/v1/models``'s entry (``id``, ``n_ctx`` ...); the
    folder holds an in-process model's fast tokenizer."""
    if isinstance(lm_or_url, str):
        url = lm_or_url.rstrip("/").removesuffix("/v1")
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
        yield url, cards[0], steer, api_key, None
        return
    if isinstance(steer, str):
        raise ValueError(f"steer={steer!r} names a preset, which only a server has; for an "
                         "in-process model give the steering vector or Steer itself.")  # fmt: skip
    from steerlab.server import ServedModels, create_app
    from steerlab.server.background import serve_in_background
    from steerlab.server.presets import Preset

    presets = [] if steer is None else [Preset(STEERED, steer, alpha)]
    key = secrets.token_urlsafe(16)  # loopback only, and only this call's client knows it
    app = create_app(ServedModels(lm_or_url), api_key=key, presets=presets)
    with serve_in_background(app) as url, _saved_tokenizer(lm_or_url.tokenizer) as folder:
        card = _get(url, "/v1/models", key)["data"][0]
        yield url, card, STEERED if presets else None, key, folder


@contextmanager
def _saved_tokenizer(tokenizer: Any) -> Iterator[str | None]:
    """A temporary folder holding ``tokenizer``, for lm-eval to load as its own; None for a
    tokenizer that is not a fast one (reloaded, a slow tokenizer could come back fast, and
    split some text differently from the server)."""
    if not getattr(tokenizer, "is_fast", False) or not hasattr(tokenizer, "save_pretrained"):
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="steerlab-lm-eval-tokenizer-") as folder:
        tokenizer.save_pretrained(folder)
        yield folder


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
