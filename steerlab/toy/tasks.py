"""Two lm-evaluation-harness tasks in the toy world, written as local task files.

- ``toy_sentiment`` (multiple choice, ``acc``): which ending fits a story's mood, " smiled."
  or " cried."; half the stories are happy, half sad.
- ``toy_stories`` (``loglikelihood_rolling``, ``word_perplexity``): held-out toy stories.

The documents come from the toy corpus's own generator with a seed the training run never
used, so they are new text in the model's world. ``lm_eval_tasks()`` writes the YAML and
the JSON-lines data (absolute paths, so nothing downloads) and returns the folder for
``include_path``.
"""

from __future__ import annotations

import json
import random
import re
import tempfile
from pathlib import Path
from typing import Any

from steerlab.toy.corpus import _NAMES, make_story

TASKS = ("toy_sentiment", "toy_stories")
SEED = 90_210  # not a training seed: these stories are held out
_ENDINGS = (" smiled.", " cried.")

_SENTIMENT = """task: toy_sentiment
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
_STORIES = """task: toy_stories
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
    aggregation: weighted_perplexity
    higher_is_better: false
"""


def sentiment_docs(n: int = 24) -> list[dict[str, Any]]:
    """Story openings that end before a mood word; label 0 (" smiled.") for happy ones."""
    rng = random.Random(SEED)
    docs = []
    for i in range(n):
        positive = i % 2 == 0
        text = make_story(rng, positive=positive).text
        name = next(w for w in re.findall(r"[A-Z][a-z]+", text) if w in _NAMES)  # the hero
        opening = ". ".join(text.split(". ")[:2])
        docs.append({"context": f"{opening}. {name}", "choices": list(_ENDINGS),
                     "label": 0 if positive else 1})  # fmt: skip
    return docs


def story_docs(n: int = 12) -> list[dict[str, str]]:
    rng = random.Random(SEED + 1)
    return [{"text": make_story(rng).text} for _ in range(n)]


def lm_eval_tasks(folder: str | Path | None = None) -> Path:
    """Write the toy tasks' YAML and data into ``folder`` (a new temporary one by default).

    >>> sorted(p.name for p in lm_eval_tasks().iterdir())
    ['toy_sentiment.jsonl', 'toy_sentiment.yaml', 'toy_stories.jsonl', 'toy_stories.yaml']
    """
    out = Path(tempfile.mkdtemp(prefix="steerlab-tasks-") if folder is None else folder)
    out.mkdir(parents=True, exist_ok=True)
    for name, template, docs in (("toy_sentiment", _SENTIMENT, sentiment_docs()),
                                 ("toy_stories", _STORIES, story_docs())):  # fmt: skip
        data = (out / f"{name}.jsonl").resolve()
        data.write_text("".join(json.dumps(d) + "\n" for d in docs))
        (out / f"{name}.yaml").write_text(template.format(data=json.dumps(str(data))))
    return out
