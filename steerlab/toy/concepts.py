"""The toy's two concepts as benchmark data: ``concept_data("sentiment")`` and
``concept_data("setting")``, built offline from the story generator and the toy model.

- **sentiment** ("happiness"): positives are happy stories, negatives sad ones; the pairs
  answer sad asks ("Tell me a sad story.") with a happy story (chosen) against the toy's
  own greedy reply (rejected); the instructions ask for a setting ("Tell me a story about
  the sea."), which the steered story should keep.
- **setting** ("the sea"): positives are sea stories, negatives forest ones; the pairs
  answer forest asks with a sea story; the instructions ask for a sentiment.

The pairs' prompts never appear among the instructions, so every instruction is held out
from training.
"""

from __future__ import annotations

import random
from typing import Any

from steerlab.core.concepts import ConceptData
from steerlab.toy.corpus import make_story
from steerlab.vectors.pairs import preference_pairs

_SETTING_ASKS = [f"Tell me a story about the {p}." for p in
                 ("sea", "forest", "beach", "woods", "shore", "grove", "ocean", "glade",
                  "harbor", "trail")]  # fmt: skip
_SENTIMENT_ASKS = [f"Tell me a {w} story." for w in
                   ("happy", "sad", "cheerful", "gloomy", "lovely", "terrible", "bright",
                    "lonely", "wonderful", "scared")]  # fmt: skip
_SAD_ASKS = [f"Tell me a {w} story." for w in ("sad", "gloomy", "terrible", "cold", "lonely")]
_FOREST_ASKS = [f"Tell me a story about the {p}." for p in ("forest", "woods", "grove",
                                                            "thicket")]  # fmt: skip
_SPECS = {  # name, pole keyword, pair asks, instructions
    "sentiment": ("happiness", "positive", _SAD_ASKS, _SETTING_ASKS),
    "setting": ("the sea", "sea", _FOREST_ASKS, _SENTIMENT_ASKS),
}


def concept_data(name: str, *, lm: Any = None, n: int = 36, seed: int = 0) -> ConceptData:
    """One of the toy's concepts as ``ConceptData`` (see the module docstring).

    Args:
        name: ``"sentiment"`` or ``"setting"``.
        lm: the model whose greedy replies are the pairs' rejected side; None loads
            ``steerlab-tiny`` (the hf backend).
        n: positives, negatives and pairs each.
        seed: the story generator's seed.

    >>> concept_data("setting")
    ConceptData('the sea': 36 positives, 36 negatives, 36 pairs, 10 instructions)
    """
    if name not in _SPECS:
        raise ValueError(f"The toy's concepts are {sorted(_SPECS)}; got {name!r}.")
    title, pole, asks, instructions = _SPECS[name]
    rng = random.Random(seed)

    def story(on: bool) -> str:
        return make_story(rng, **{pole: on}).text  # type: ignore[arg-type]

    positives = [story(True) for _ in range(n)]
    negatives = [story(False) for _ in range(n)]
    if lm is None:
        from steerlab.loading import load

        lm = load("steerlab-tiny", backend="hf")
    prompts = [asks[i % len(asks)] for i in range(n)]
    replies = [_opening(story(True)) for _ in range(n)]
    pairs = preference_pairs(lm, prompts, replies, chat=True, max_new_tokens=48)
    return ConceptData(title, positives=positives, negatives=negatives, pairs=pairs,
                       instructions=instructions)  # fmt: skip


def _opening(text: str, sentences: int = 3) -> str:
    """A story's first sentences: a reply about as long as the toy's greedy one."""
    return ". ".join(text.split(". ")[:sentences]).rstrip(".") + "."
