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

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from steerlab.core.bars import counter
from steerlab.core.concepts import ConceptData
from steerlab.core.errors import SteerError
from steerlab.core.prompts import encode, has_chat_template
from steerlab.core.request import Sampling
from steerlab.core.rows import as_steers
from steerlab.core.scalars import as_int, flag
from steerlab.core.sites import resolve
from steerlab.core.steer import at_alphas
from steerlab.core.table import Table
from steerlab.core.window import check_window
from steerlab.evals.detection import detection_table
from steerlab.evals.intervals import check_bootstrap
from steerlab.evals.make_on import check_make_on
from steerlab.evals.methods import Method, Prompting, resolve_methods
from steerlab.evals.protocol import factor_table, judge_workers, leaderboard_table, rate_samples


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
        seed: the sampling seed; every method samples with the same one.
        chat: apply the chat template; None: when the model has one.
        level, n_boot: the leaderboard's bootstrap interval.
        progress: one progress bar over the whole run.
        make_on: an in-process model with ``lm``'s weights on which every method makes its
            steer and detection is measured; ``lm`` then only generates (a vLLM engine,
            say). Checked first: the same config, tokenizer, sites, and a probe text's
            log-probabilities to the dtypes' rounding (``evals.make_on``).

    Raises:
        SteerError: bad input, before any compute: a concept without the data its method
            needs, fewer than 2 instructions, bad factors, an unknown method, a method
            that needs an in-process model on vLLM without ``make_on``, a ``make_on`` with
            other weights.
        JudgeError: an unreachable judge, before any compute.
        SamplingError, SiteError, ContextError (ValueErrors): a bad temperature or seed,
            an unknown site, generations that would not fit the model's window; also
            before any compute.
    """
    maker = lm if make_on is None else make_on
    plan = _check(lm, concepts, methods, site, judge, selection, max_new_tokens, temperature,
                  seed, chat, level, n_boot, maker)  # fmt: skip
    data_list: list[ConceptData] = plan["concepts"]
    methods, chat = plan["methods"], plan["chat"]
    seconds = dict.fromkeys(("make", "generate", "judge", "detect"), 0.0)
    steers: dict[tuple[str, str], Any] = {}
    prompts: dict[tuple[str, str], str] = plan["prompts"]
    samples: list[dict[str, Any]] = []
    rows = sum(len(d.instructions) * len(m.factors) for d in data_list for m in methods)
    with counter(
        rows * 2, "benchmark", disable=not progress
    ) as bar:  # each sample made, then rated
        for data in data_list:
            n_select = math.floor(len(data.instructions) * selection)
            for method in methods:
                bar.set_postfix_str(f"{method.name} / {data.name}")
                started = time.perf_counter()
                steer, inputs = _make(maker, method, data, site, prompts)
                steers[(method.name, data.name)] = steer
                seconds["make"] += time.perf_counter() - started
                started = time.perf_counter()
                factors = list(method.factors)
                steering = at_alphas(as_steers(steer), factors) if steer is not None else None
                out = lm.generate(inputs, steering, max_new_tokens=max_new_tokens,
                                  temperature=temperature, seed=seed, chat=chat)  # fmt: skip
                seconds["generate"] += time.perf_counter() - started
                k = len(factors) if steer is not None else 1
                for r, text in enumerate(out.text):  # prompt-major: row = instruction * k + factor
                    i = r // k
                    samples.append({"method": method.name, "concept": data.name,
                                    "factor": factors[r % k], "instruction_index": i,
                                    "split": "selection" if i < n_select else "test",
                                    "instruction": data.instructions[i],
                                    "model_input": inputs[i], "text": text})  # fmt: skip
                bar.update(len(out.text))
        bar.set_postfix_str("judge")
        started = time.perf_counter()
        parse_failures = rate_samples(judge, samples, bar.update)
        seconds["judge"] = time.perf_counter() - started
    started = time.perf_counter()
    detection = detection_table(maker, data_list, methods, steers, site)
    seconds["detect"] = time.perf_counter() - started
    table = factor_table(samples, data_list, methods)
    board = leaderboard_table(samples, table, methods, level, n_boot, seed)
    return BenchmarkResult(table, board, samples, steers, detection, parse_failures, prompts,
                           seconds)  # fmt: skip


def _check(lm: Any, concepts: Any, methods: Any, site: Any, judge: Any, selection: Any,
           max_new_tokens: Any, temperature: Any, seed: Any, chat: Any, level: float,
           n_boot: int, maker: Any) -> dict[str, Any]:  # fmt: skip
    """Every refusal, before any compute; the run's concepts, methods, chat and prompts."""
    check_make_on(lm, maker)
    concepts = _check_concepts(concepts)
    methods = resolve_methods(methods)
    _check_splits(concepts, methods, selection)
    if not isinstance(site, str):
        raise SteerError(f"site must be a site name such as 'blocks.2.hook_resid_pre'; got "
                         f"{site!r:.60}.")  # fmt: skip
    resolve(site, lm.sites())
    if as_int(max_new_tokens) is None or max_new_tokens < 1:
        raise SteerError(f"max_new_tokens must be an int >= 1; got {max_new_tokens!r}.")
    check_bootstrap(level, n_boot)
    Sampling(temperature=temperature, seed=seed)  # refuses a bad temperature or seed by name
    cannot = [m.name for m in methods if getattr(m, "in_process", False)]
    if cannot and not maker.engine.capabilities.capture:
        raise SteerError(f"Methods {cannot} read activations or train, which the "
                         f"{lm.engine.kind} engine cannot do: give make_on= an in-process "
                         "model with the same weights (sl.load(..., backend='hf')), pass "
                         "steers made elsewhere as sl.evals.Method(name, make=lambda lm, data, "
                         "site: steer), or leave them out.")  # fmt: skip
    _check_judge(judge, methods)
    chat = has_chat_template(lm.tokenizer) if chat is None else flag(chat, "chat")
    # the prompting arms' prompts, written now (by the judge where none is given), so that
    # every input the run will feed is checked against the window before any compute
    prompts: dict[tuple[str, str], str] = {}
    inputs = [i for d in concepts for i in d.instructions]
    for method in (m for m in methods if isinstance(m, Prompting)):
        for data in concepts:
            prompt = method.prompt_for(judge, data.name)
            prompts[(method.name, data.name)] = prompt
            inputs += method.inputs(prompt, data.instructions)
    longest = max(len(encode(lm.tokenizer, i, chat=chat)) for i in inputs)
    check_window(lm.n_ctx, longest, int(max_new_tokens))
    return {"concepts": concepts, "methods": methods, "chat": chat, "prompts": prompts}


def _check_concepts(concepts: Any) -> list[ConceptData]:
    if isinstance(concepts, ConceptData):
        concepts = [concepts]
    if isinstance(concepts, (str, bytes)) or not isinstance(concepts, Sequence) or not concepts:
        raise SteerError("concepts must be a non-empty list of sl.evals.ConceptData; got "
                         f"{concepts!r:.80}.")  # fmt: skip
    for i, data in enumerate(concepts):
        if not isinstance(data, ConceptData):
            raise SteerError(f"concepts[{i}] is {type(data).__name__}, not "
                             "sl.evals.ConceptData.")  # fmt: skip
    names = [d.name for d in concepts]
    if len(set(names)) != len(names):
        raise SteerError(f"Concept names repeat: {names}; each concept needs its own name.")
    return list(concepts)


def _check_splits(concepts: list[ConceptData], methods: list[Method | Prompting],
                  selection: Any) -> None:  # fmt: skip
    """Each concept has both splits and the data each method reads."""
    if isinstance(selection, bool) or not isinstance(selection, (int, float)) \
            or not 0 < selection < 1:  # fmt: skip
        raise SteerError(f"selection must be a share in (0, 1); got {selection!r}.")
    for data in concepts:
        n = len(data.instructions)
        if n < 2:
            raise SteerError(f"Concept {data.name!r} has {n} instruction(s); the protocol needs "
                             "at least 2: some to choose the factor, the rest to test it.")  # fmt: skip
        n_select = math.floor(n * selection)
        if not 1 <= n_select < n:
            raise SteerError(f"selection={selection} leaves concept {data.name!r} "
                             f"{n_select} of {n} instructions to choose the factor and "
                             f"{n - n_select} to test it; each split needs at least one.")  # fmt: skip
        for method in methods:
            empty = [f for f in method.needs if not getattr(data, f)]
            if empty:
                raise SteerError(f"Method {method.name!r} needs ConceptData.{empty[0]}, and "
                                 f"concept {data.name!r} has none.")  # fmt: skip


def _check_judge(judge: Any, methods: list[Method | Prompting]) -> None:
    """The judge rates, writes prompts where a prompting arm asks it to, and answers."""
    if not callable(getattr(judge, "rate", None)):
        raise SteerError(f"judge must have rate(concept, instruction, text); got "
                         f"{type(judge).__name__}.")  # fmt: skip
    judge_workers(judge)
    if any(isinstance(m, Prompting) and m.prompt is None for m in methods) \
            and not callable(getattr(judge, "write_prompt", None)):  # fmt: skip
        raise SteerError("Prompting(prompt=None) has the judge write each concept's prompt, and "
                         f"this judge ({type(judge).__name__}) has no write_prompt(concept); "
                         "give sl.evals.Prompting(prompt='...').")  # fmt: skip
    ping = getattr(judge, "ping", None)
    if callable(ping):
        ping()  # an unreachable judge is refused now, not after the generations


def _make(lm: Any, method: Method | Prompting, data: ConceptData, site: str,
          prompts: dict[tuple[str, str], str]) -> tuple[Any, list[str]]:  # fmt: skip
    """The method's steer (None for prompting) and the model inputs it generates from."""
    if isinstance(method, Prompting):
        return None, method.inputs(prompts[(method.name, data.name)], data.instructions)
    steer = method.make(lm, data, site)
    try:
        steers = as_steers(steer)
    except SteerError as error:
        raise SteerError(f"Method {method.name!r} made {type(steer).__name__}, not a steer: "
                         f"{error}") from None  # fmt: skip
    if not steers:
        raise SteerError(f"Method {method.name!r} made no steer for concept {data.name!r}.")
    return steer, list(data.instructions)
