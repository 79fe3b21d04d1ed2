"""``benchmark``: which steer works, by AxBench's protocol (Wu et al., 2025).

For every method and concept: make the steer from the concept's data, generate each
instruction at every factor in one engine call (per-row alphas), have the judge rate each
text on concept, instruction relevance and fluency (0-2), and score a sample by the
harmonic mean of the three (0 if any is 0). The first ``floor(n × selection)``
instructions choose the factor with the highest mean; the score reported is the mean over
the other instructions at that factor, so the test split never influences the choice. The
leaderboard is the mean over concepts. Methods that give a direction are also scored on
concept detection (ROC AUC of positives against negatives, each text scored by the max
over its tokens of ``h·v̂`` at the site).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steerlab.core.concepts import ConceptData
from steerlab.core.errors import SteerError
from steerlab.core.identity import model_id
from steerlab.core.prompts import encode
from steerlab.core.table import Table
from steerlab.core.window import check_window
from steerlab.evals.checks import check_run, check_shard
from steerlab.evals.detection import detection_rows, detection_table
from steerlab.evals.methods import Method, Prompting
from steerlab.evals.pipeline import run_cells
from steerlab.evals.protocol import factor_table, leaderboard_table, score_sample
from steerlab.evals.runstore import DATABASE, RunStore, exists


@dataclass(frozen=True)
class BenchmarkResult:
    """Everything a ``benchmark`` run measured.

    Attributes:
        table: one row per method × concept: the factor chosen on the selection split,
            its selection score, the test score with its ``concept_rating`` /
            ``instruction_rating`` / ``fluency_rating`` means, and n (test samples).
        leaderboard: one row per method: the mean test score over concepts, with a
            bootstrap interval (samples resampled within each concept).
        samples: every generation: method, concept, factor, split, instruction, model
            input, text, the three ratings (``concept_rating``, ``instruction_rating``,
            ``fluency_rating``), their harmonic mean (``score``), parse_failed.
        steers: ``{(method, concept): steer}`` as each method made it (None: prompting).
        detection: method × concept ROC AUC, for methods whose steer is one direction.
        parse_failures: ratings the judge gave in no readable form (each scored 0).
        prompts: ``{(method, concept): the prompt}`` each prompting arm used.
        seconds: wall time by phase (make, generate, judge, detect).
    """

    table: Table
    leaderboard: Table
    samples: list[dict[str, Any]]
    steers: dict[tuple[str, str], Any]
    detection: Table
    parse_failures: int
    prompts: dict[tuple[str, str], str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"{self.leaderboard!r}\n\n{self.table!r}"

    def _repr_html_(self) -> str:
        return self.leaderboard._repr_html_() + self.table._repr_html_()

    def browse(self, method: str | None = None, concept: str | None = None,
               factor: float | None = None) -> Any:  # fmt: skip
        """The samples in a notebook widget: pick a method × concept cell, read its samples
        best first at the chosen factor, each beside the same instruction's unsteered or
        prompting text, with the ratings and the judge's replies; a slider for other
        factors. Needs ipywidgets (the ``notebook`` extra).

        Args:
            method, concept: the cell shown first (default: the leaderboard's top method,
                the first concept).
            factor: the factor shown first (default: the one the selection split chose).

        Returns:
            a ``steerlab.evals.browser.SampleBrowser`` (an ``ipywidgets.VBox``).
        """
        from steerlab.evals.browser import SampleBrowser

        return SampleBrowser(self, method=method, concept=concept, factor=factor)

    def to_pandas(self) -> Any:
        """Every sample as a row of a pandas DataFrame (pandas: the ``notebook`` extra)."""
        from steerlab.evals.samples import samples_frame

        return samples_frame(self.samples)


def benchmark(
    lm: Any,
    concepts: ConceptData | Sequence[ConceptData],
    methods: Any = ("mean_diff", "pca", "reps", "prompt", "random"),
    *,
    site: str,
    judge: Any,
    selection: float = 0.5,
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    seed: int = 0,
    chat: bool | None = None,
    level: float = 0.95,
    n_boot: int = 1000,
    progress: bool = True,
    run: str | Path | None = None,
    shard: tuple[int, int] = (0, 1),
    make_on: Any = None,
) -> BenchmarkResult:
    """Rank steering methods on concepts by AxBench's protocol.

    Args:
        lm: the model that generates. Every method runs on an in-process model; on vLLM,
            give ``make_on=`` an in-process model with the same weights for the methods
            that read activations or train (without it they are refused up front, and
            detection is not measured).
        concepts: ``ConceptData`` for each concept (``steerlab.toy.concept_data`` offline).
        methods: names (``"mean_diff"``, ``"pca"``, ``"bipo"``, ``"reps"``, ``"reft"``,
            ``"reps_reft"``, ``"prompt"``, ``"random"``), ``sl.evals.Method`` or
            ``sl.evals.Prompting`` objects. Default factor grids are AxBench's (see
            ``steerlab.evals.methods``): 2 ... 50 for RePS, 0.2 ... 5 for the rest, a
            unit direction scaled first by the concept's largest latent.
        site: where every steer acts.
        judge: anything with ``rate(concept, instruction, text) -> (concept, instruction,
            fluency)``, 0-2 each (``nan`` for a rating it could not read):
            ``sl.evals.Judge(url, model)`` or ``steerlab.toy.ToyJudge()``. Its
            ``max_workers`` (default 8) ratings run at once.
        selection: the share of each concept's instructions that chooses the factor.
        max_new_tokens: tokens each generation writes (AxBench: 128).
        temperature: sampling temperature (AxBench: 1.0); seeded, so a run repeats.
        seed: the sampling seed; every method and concept samples with the same one, so a
            cell's texts do not depend on which cells ran before it.
        chat: apply the chat template; None: when the model has one.
        level, n_boot: the leaderboard's bootstrap interval.
        progress: one progress bar over the whole run.
        run: a folder that keeps the run (``runstore``): settings, steers, generations,
            ratings with the judge's replies, written prompts, each stored as it exists.
            The same call again resumes it, doing only what is not stored; new concepts or
            methods add their cells; other settings are refused by name.
            ``sl.evals.load_run(run)`` reads what it holds. None: kept in memory.
        shard: ``(i, n)``: run every n-th concept from the i-th (0-based), each shard in
            its own ``run`` folder, on its own GPU or machine; ``sl.evals.merge_runs``
            joins the folders into the result one unsharded run gives.
        make_on: an in-process model with ``lm``'s weights on which every method makes its
            steer and detection is measured; ``lm`` then only generates (a vLLM engine,
            say). Checked first: the same config, tokenizer, sites, and a probe text's
            log-probabilities to the dtypes' rounding (``evals.make_on``).

    Raises:
        SteerError: bad input, before any compute: a concept without the data its method
            needs, fewer than 2 instructions, bad factors, an unknown method, a method
            that needs an in-process model on vLLM without ``make_on``, a ``make_on`` with
            other weights, a run folder holding another run.
        JudgeError: an unreachable judge, before any compute.
        SamplingError, SiteError, ContextError (ValueErrors): a bad temperature or seed,
            an unknown site, generations that would not fit the model's window; also
            before any compute.

    Any failure once the run has begun (the judge failing for good, a method's ``make``
    raising, Ctrl-C) keeps everything finished in ``run``; the error's note says so.
    """
    i, n = check_shard(shard, run)
    maker = lm if make_on is None else make_on
    plan = check_run(lm, concepts, methods, site, judge, selection, max_new_tokens, temperature,
                  seed, chat, level, n_boot, maker)  # fmt: skip
    data_list: list[ConceptData] = plan["concepts"]
    methods, chat = plan["methods"], plan["chat"]
    store = RunStore(run)
    try:
        store.check_settings(_settings(lm, judge, site, chat, selection, max_new_tokens,
                                       temperature, seed, level, n_boot))  # fmt: skip
        store.check_parts("concepts", [(d.name, k, _data_fingerprint(d))
                                       for k, d in enumerate(data_list) if k % n == i],
                          "concept")  # fmt: skip
        store.check_parts("methods", [(m.name, k, _method_fingerprint(m))
                                      for k, m in enumerate(methods)], "method")  # fmt: skip
        data_list = data_list[i::n]
        try:
            _prompts(lm, data_list, methods, judge, store, chat, max_new_tokens)
            seconds = run_cells(lm, maker, data_list, methods, site, judge, store, progress,
                           {"max_new_tokens": max_new_tokens, "temperature": temperature,
                            "seed": seed, "chat": chat})  # fmt: skip
        except BaseException as error:  # Ctrl-C too: say where the finished work is
            if run is not None:
                error.add_note(f"Everything finished is kept in run={str(run)!r}: call "
                               "sl.evals.benchmark again with the same arguments to resume, "
                               f"or read what it holds with sl.evals.load_run({str(run)!r}).")  # fmt: skip
            raise
        names = [(d.name, list(d.instructions)) for d in data_list]
        result = _result(dict.fromkeys([d.name for d in data_list], store), names,
                         [m.name for m in methods], selection, level, n_boot, seed, maker, site,
                         seconds)  # fmt: skip
    finally:
        store.close()
    empty = [f"{r['method']} / {r['concept']}: {r['empty']}" for r in result.table if r["empty"]]
    if empty:
        warnings.warn(f"Empty or blank generations (method / concept: count): "
                      f"{'; '.join(empty)}. They are rated as the judge sees them; a cell "
                      "marked degenerate in result.table says little about steering.",
                      EmptyGenerationWarning, stacklevel=2)  # fmt: skip
    return result


class EmptyGenerationWarning(UserWarning):
    """A benchmark run made empty or blank generations (``result.table``'s ``empty``)."""


def load_run(run: str | Path) -> BenchmarkResult:
    """What a finished or interrupted run folder holds, as a ``BenchmarkResult``: every
    stored concept and method, with the samples rated so far (an unfinished cell is scored
    on its rated samples; a cell with none has no row). Needs no model.

    >>> import tempfile, steerlab.toy as toy
    >>> folder, data = tempfile.mkdtemp(), toy.concept_data("sentiment", n=4)
    >>> done = sl.evals.benchmark(lm, data, ["mean_diff"], site="blocks.2.hook_resid_pre",
    ...                           judge=toy.ToyJudge(), max_new_tokens=4, run=folder,
    ...                           progress=False)
    >>> sl.evals.load_run(folder).table[0]["score"] == done.table[0]["score"]
    True
    """
    return merge_runs([run])


def merge_runs(runs: Sequence[str | Path]) -> BenchmarkResult:
    """One result from the run folders of shards (``benchmark(..., shard=(i, n))``) of one
    run: the same settings, methods and concept data in each. Concepts keep the order of
    the unsharded list, so the tables equal one unsharded run's.

    >>> import tempfile, steerlab.toy as toy
    >>> both = [toy.concept_data("sentiment", n=4), toy.concept_data("setting", n=4)]
    >>> parts = [tempfile.mkdtemp() for _ in range(2)]
    >>> for i, part in enumerate(parts):  # two shards, one concept each
    ...     _ = sl.evals.benchmark(lm, both, ["mean_diff"], site="blocks.2.hook_resid_pre",
    ...                            judge=toy.ToyJudge(), max_new_tokens=4, run=part,
    ...                            shard=(i, 2), progress=False)
    >>> [row["concept"] for row in sl.evals.merge_runs(parts).table]
    ['happiness', 'the sea']
    """
    if isinstance(runs, (str, Path)) or not isinstance(runs, Sequence) or not runs:
        raise SteerError(f"runs must be a non-empty list of run folders; got {runs!r:.80}.")
    for run in runs:
        if not isinstance(run, (str, Path)) or not exists(run):
            raise SteerError(f"run={run!r:.80} holds no benchmark run (no {DATABASE} in it).")
    stores = [RunStore(run) for run in runs]
    try:
        settings = stores[0].settings()
        where: dict[str, RunStore] = {}
        order: dict[str, tuple[int, str]] = {}
        methods = stores[0].fingerprints("methods")
        for run, store in zip(runs, stores):
            _same_run(settings, store.settings(), runs[0], run)
            for name, (position, mark) in store.fingerprints("methods").items():
                if methods.setdefault(name, (position, mark))[1] != mark:
                    raise SteerError(f"Method {name!r} has other settings in {str(run)!r} than "
                                     f"in {str(runs[0])!r}; these are not shards of one run.")  # fmt: skip
            for name, instructions in store.concepts():
                if name in where:
                    raise SteerError(f"Concept {name!r} is in {str(run)!r} and in another of "
                                     "these runs; give each shard's folder once.")  # fmt: skip
                where[name] = store
                order[name] = (store.fingerprints("concepts")[name][0], json.dumps(instructions))
        concepts = [(name, json.loads(order[name][1]))
                    for name in sorted(order, key=lambda c: order[c][0])]  # fmt: skip
        names = sorted(methods, key=lambda m: methods[m][0])
        return _result(where, concepts, names, settings["selection"], settings["level"],
                       settings["n_boot"], settings["seed"], None, settings["site"], {})  # fmt: skip
    finally:
        for store in stores:
            store.close()


def _same_run(first: dict[str, Any], other: dict[str, Any], a: Any, b: Any) -> None:
    for key in first.keys() | other.keys():
        if first.get(key) != other.get(key):
            raise SteerError(f"{str(b)!r} holds a run with {key}={other.get(key)!r}, and "
                             f"{str(a)!r} one with {key}={first.get(key)!r}; only shards of "
                             "one run merge.")  # fmt: skip


def _settings(lm: Any, judge: Any, site: str, chat: bool, selection: float,
              max_new_tokens: int, temperature: float, seed: int, level: float,
              n_boot: int) -> dict[str, Any]:  # fmt: skip
    """What decides a run's results, stored with it (``progress`` does not)."""
    identity = model_id(lm)
    model = getattr(judge, "model", None)  # the judge's model; where it is served may move
    if isinstance(model, str):
        judge_name = model
    else:
        judge_name = repr(judge) if " at 0x" not in repr(judge) else type(judge).__qualname__
    return {"model": {"name": identity.name, "config_sha256": identity.config_sha256},
            "site": site, "chat": chat, "selection": float(selection),
            "max_new_tokens": int(max_new_tokens), "temperature": float(temperature),
            "seed": int(seed), "judge": judge_name, "level": float(level),
            "n_boot": int(n_boot)}  # fmt: skip


def _data_fingerprint(data: ConceptData) -> dict[str, Any]:
    return {"positives": list(data.positives), "negatives": list(data.negatives),
            "pairs": [[p.prompt, p.chosen, p.rejected] for p in data.pairs],
            "instructions": list(data.instructions)}  # fmt: skip


def _method_fingerprint(method: Method | Prompting) -> dict[str, Any]:
    if isinstance(method, Prompting):
        return {"kind": "prompting", "prompt": method.prompt, "template": method.template,
                "factors": list(method.factors)}  # fmt: skip
    return {"kind": "method", "factors": list(method.factors), "needs": list(method.needs),
            "site": method.site}  # fmt: skip


def _prompts(lm: Any, concepts: list[ConceptData], methods: list[Method | Prompting],
             judge: Any, store: RunStore, chat: bool, max_new_tokens: int) -> None:  # fmt: skip
    """The prompting arms' prompts, stored: given, already stored, or written by the judge
    now (a paid call, so after every cheap check), then the inputs checked against the
    window."""
    inputs = []
    for method in (m for m in methods if isinstance(m, Prompting)):
        for data in concepts:
            cell = (method.name, data.name)
            prompt = method.prompt or store.prompt(cell)
            if prompt is None:
                prompt = method.prompt_for(judge, data.name)  # checked: usable, on concept
                store.put_prompt(cell, prompt)
            elif method.prompt is not None and store.prompt(cell) is None:
                store.put_prompt(cell, prompt)
            inputs += method.inputs(prompt, data.instructions)
    if inputs:
        longest = max(len(encode(lm.tokenizer, i, chat=chat)) for i in inputs)
        check_window(lm.n_ctx, longest, int(max_new_tokens))


def _result(where: dict[str, RunStore], concepts: list[tuple[str, list[str]]],
            methods: list[str], selection: float, level: float, n_boot: int, seed: int,
            lm: Any, site: str, seconds: dict[str, float]) -> BenchmarkResult:  # fmt: skip
    """The run's result, built from the stores alone (``where``: each concept's), so a
    resumed or merged run gives the same."""
    samples, failures = [], 0
    for name, instructions in concepts:
        n_select = math.floor(len(instructions) * selection)
        store = where[name]
        for method in methods:
            cell = (method, name)
            rated = store.ratings(cell)
            for row, factor, i, model_input, text in store.generations(cell):
                if row not in rated:
                    continue
                raw, replies = rated[row]
                sample = {"method": method, "concept": name, "factor": factor,
                          "instruction_index": i,
                          "split": "selection" if i < n_select else "test",
                          "instruction": instructions[i], "model_input": model_input,
                          "text": text}  # fmt: skip
                failures += score_sample(sample, raw)
                sample["judge_replies"] = replies
                samples.append(sample)
    names = [n for n, _ in concepts]
    steers = {(m, c): where[c].steer((m, c), lm) for c in names for m in methods
              if where[c].has_steer((m, c))}  # fmt: skip
    found, prompts = {}, {}
    for store in {id(s): s for s in where.values()}.values():
        found.update({(m, c): (a, n) for m, c, a, n in store.detection()})
        prompts.update(store.prompts())
    if lm is not None and not lm.engine.capabilities.capture:  # lm: the maker here
        detection = detection_table(lm, [], [], {}, site)  # says why it was not measured
    else:
        detection = detection_rows([{"method": m, "concept": c, "auroc": found[(m, c)][0],
                                     "n": found[(m, c)][1]}
                                    for c in names for m in methods if (m, c) in found])  # fmt: skip
    table = factor_table(samples, names, methods)
    board = leaderboard_table(samples, table, methods, level, n_boot, seed)
    prompts = {cell: p for cell, p in prompts.items() if cell[0] in methods and cell[1] in names}
    return BenchmarkResult(table, board, samples, steers, detection, failures, prompts, seconds)
