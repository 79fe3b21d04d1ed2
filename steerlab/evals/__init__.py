"""Is this vector any good? Steerability, an LLM judge, and lm-evaluation-harness.

- ``steerability(lm, vec, prompts, alphas, concept=...)``: concept against fluency, KL and
  length per alpha, with bootstrap intervals, from one batched generation.
- ``Judge(base_url, model)``: AxBench-style 0-2 ratings from any OpenAI-compatible endpoint.
- ``lm_eval(lm_or_url, tasks, steer=...)``: lm-evaluation-harness scores, steered beside
  unsteered, through a ``steerlab serve`` server (the ``evals`` extra).
"""

from steerlab.core.table import Table
from steerlab.evals.harness import HarnessResult, lm_eval
from steerlab.evals.intervals import Estimate, mean_interval, perplexity_interval
from steerlab.evals.judge import Criterion, Judge, JudgeError
from steerlab.evals.steerability import SteerabilityResult, steerability

__all__ = [
    "Criterion",
    "Estimate",
    "HarnessResult",
    "Judge",
    "JudgeError",
    "SteerabilityResult",
    "Table",
    "lm_eval",
    "mean_interval",
    "perplexity_interval",
    "steerability",
]
