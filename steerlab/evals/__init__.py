"""Is this vector any good? The benchmark, steerability, an LLM judge, and lm-evaluation-harness.

- ``benchmark(lm, concepts, methods, site=, judge=)``: which steer works, by AxBench's
  protocol: judged concept, instruction and fluency, the factor chosen on held-out data,
  against prompting and a random direction; concept detection beside it.

- ``steerability(lm, vec, prompts, alphas, concept=...)``: concept against fluency, KL and
  length per alpha, with bootstrap intervals, from one batched generation.
- ``Judge(base_url, model)``: AxBench-style 0-2 ratings from any OpenAI-compatible endpoint.
- ``write_concept_data(concept, writer=, instructions=)``: a concept's data written by an LLM
  (AxBench's recipe); ``ConceptData.from_axbench(folder, concept=)`` reads AxBench's own.
- ``lm_eval(lm_or_url, tasks, steer=...)``: lm-evaluation-harness scores, steered beside
  unsteered, through a ``steerlab serve`` server (the ``evals`` extra).
- ``inspect_model(lm, steer=vec, alpha=4)``: the model, steered, for Inspect AI's ``eval``
  (the ``inspect`` extra; ``inspect eval --model steerlab/NAME -M steer=FILE@ALPHA`` too).
"""

from typing import Any

from steerlab.core.concepts import ConceptData, Preference
from steerlab.core.table import Table
from steerlab.evals.benchmark import BenchmarkResult, benchmark, load_run, merge_runs
from steerlab.evals.detection import roc_auc
from steerlab.evals.harness import HarnessResult, lm_eval
from steerlab.evals.intervals import Estimate, mean_interval, perplexity_interval
from steerlab.evals.judge import Criterion, Judge, JudgeError
from steerlab.evals.methods import Method, Prompting
from steerlab.evals.steerability import SteerabilityResult, steerability
from steerlab.evals.writing import write_concept_data

__all__ = [
    "BenchmarkResult",
    "ConceptData",
    "Criterion",
    "Estimate",
    "HarnessResult",
    "Judge",
    "JudgeError",
    "Method",
    "Preference",
    "Prompting",
    "SteerabilityResult",
    "Table",
    "benchmark",
    "lm_eval",
    "load_run",
    "mean_interval",
    "merge_runs",
    "perplexity_interval",
    "roc_auc",
    "steerability",
    "write_concept_data",
]


def __getattr__(name: str) -> Any:
    """``inspect_model`` loads Inspect AI only when asked for (``import steerlab`` stays light,
    and ``from steerlab.evals import *`` works without the ``inspect`` extra)."""
    if name == "inspect_model":
        from steerlab.evals.inspect_provider import inspect_model

        return inspect_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
