"""A benchmark's checks, every one before any compute: the concepts and their data
against each method (window lengths included), the settings, the shard, and the judge (its
methods, its concepts, and one real rating of a fixed text, the only check that costs a
call, made last)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from steerlab.core.concepts import ConceptData
from steerlab.core.errors import SteerError
from steerlab.core.prompts import encode, has_chat_template
from steerlab.core.request import Sampling
from steerlab.core.scalars import as_int, flag
from steerlab.core.sites import resolve
from steerlab.core.window import check_window
from steerlab.evals.intervals import check_bootstrap
from steerlab.evals.make_on import check_make_on
from steerlab.evals.methods import Method, Prompting, resolve_methods
from steerlab.evals.protocol import judge_workers


def check_run(lm: Any, concepts: Any, methods: Any, site: Any, judge: Any, selection: Any,
           max_new_tokens: Any, temperature: Any, seed: Any, chat: Any, level: float,
           n_boot: int, maker: Any) -> dict[str, Any]:  # fmt: skip
    """Every refusal, before any compute; the run's concepts, methods and chat."""
    check_make_on(lm, maker)
    concepts = _check_concepts(concepts)
    methods = resolve_methods(methods)
    _check_splits(concepts, methods, selection)
    if not isinstance(site, str):
        raise SteerError(f"site must be a site name such as 'blocks.2.hook_resid_pre'; got "
                         f"{site!r:.60}.")  # fmt: skip
    resolve(site, lm.sites())
    for method in methods:
        if isinstance(method, Method) and method.site is not None:
            resolve(method.site, lm.sites())
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
    _check_judge(judge, methods, [d.name for d in concepts])
    _check_data_window(lm, concepts, methods)
    chat = has_chat_template(lm.tokenizer) if chat is None else flag(chat, "chat")
    # every input known now is checked against the window before any compute; the judge
    # writes the missing prompting prompts only after these checks (``_prompts``)
    inputs = [i for d in concepts for i in d.instructions]
    for method in (m for m in methods if isinstance(m, Prompting)):
        if method.prompt is not None:
            inputs += [i for d in concepts for i in method.inputs(method.prompt, d.instructions)]
    longest = max(len(encode(lm.tokenizer, i, chat=chat)) for i in inputs)
    check_window(lm.n_ctx, longest, int(max_new_tokens))
    _check_answers(judge)  # the one check that costs a judge call, after every cheap one
    return {"concepts": concepts, "methods": methods, "chat": chat}


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
        repeated = sorted({i for i in data.instructions if data.instructions.count(i) > 1})
        if repeated:
            raise SteerError(f"Concept {data.name!r} repeats the instruction {repeated[0]!r:.80}; "
                             "a repeat could land in both the selection and the test split. "
                             "Give each instruction once.")  # fmt: skip


def _check_data_window(lm: Any, concepts: list[ConceptData],
                       methods: list[Method | Prompting]) -> None:  # fmt: skip
    """Every text a method reads (positives, negatives, pairs) fits the model's window."""
    if lm.n_ctx is None:
        return
    for data in concepts:
        needed = {f: m.name for m in reversed(methods) for f in m.needs}
        for part in ("positives", "negatives"):
            for i, text in enumerate(getattr(data, part) if part in needed else ()):
                _fits(lm, len(encode(lm.tokenizer, text, chat=False)), data.name,
                      f"{part}[{i}]", needed[part])  # fmt: skip
        for i, pair in enumerate(data.pairs if "pairs" in needed else ()):
            prompt = len(encode(lm.tokenizer, pair.prompt, chat=False))
            longer = max(len(lm.tokenizer(t, add_special_tokens=False)["input_ids"])
                         for t in (pair.chosen, pair.rejected))  # fmt: skip
            _fits(lm, prompt + longer, data.name, f"pairs[{i}]", needed["pairs"])


def _fits(lm: Any, tokens: int, concept: str, where: str, method: str) -> None:
    if tokens > lm.n_ctx:
        raise SteerError(f"Concept {concept!r}: {where} is {tokens} tokens, beyond this "
                         f"model's context window of {lm.n_ctx}; method {method!r} reads it. "
                         "Shorten it or leave it out.")  # fmt: skip


def _check_judge(judge: Any, methods: list[Method | Prompting], concepts: list[str]) -> None:
    """The judge rates, writes prompts where a prompting arm asks it to, and knows each
    concept (a judge with ``check_concept``, such as ``ToyJudge``)."""
    if not callable(getattr(judge, "rate", None)):
        raise SteerError(f"judge must have rate(concept, instruction, text); got "
                         f"{type(judge).__name__}.")  # fmt: skip
    judge_workers(judge)
    if any(isinstance(m, Prompting) and m.asks_judge for m in methods) \
            and not callable(getattr(judge, "write_prompt", None)):  # fmt: skip
        raise SteerError("Prompting(prompt=None) has the judge write each concept's prompt, and "
                         f"this judge ({type(judge).__name__}) has no write_prompt(concept); "
                         "give sl.evals.Prompting(prompt='...').")  # fmt: skip
    check = getattr(judge, "check_concept", None)
    if callable(check):
        for concept in concepts:
            check(concept)


PROBE = ("the sea", "Tell me about your day.", "The waves rolled over the sand, and the "
         "gulls called over the sea.")  # fmt: skip


def _check_answers(judge: Any) -> None:
    """A judge served elsewhere (one with ``ping``) answers at all, then rates one fixed
    text for real: a misspelt model name fails now, not after the generations."""
    ping = getattr(judge, "ping", None)
    if callable(ping):
        ping()
        judge.rate(*PROBE)


def check_shard(shard: Any, run: Any) -> tuple[int, int]:
    try:
        i, n = shard
    except (TypeError, ValueError):
        i = n = None
    if as_int(i) is None or as_int(n) is None or not 0 <= i < n:
        raise SteerError(f"shard must be (i, n) with 0 <= i < n, running every n-th concept "
                         f"from the i-th; got shard={shard!r:.40}.")  # fmt: skip
    if n > 1 and run is None:
        raise SteerError(f"shard={shard!r} runs part of the concepts; give each shard its own "
                         "run= folder, then join them with sl.evals.merge_runs.")  # fmt: skip
    return int(i), int(n)
