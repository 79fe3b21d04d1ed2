"""The toy's two concepts as benchmark data: ``concept_data("sentiment")`` and
``concept_data("setting")``, built offline from the story generator and the toy model.

- **sentiment** ("happiness"): positives are happy stories, negatives sad ones; the pairs
  answer sad asks ("Tell me a sad story about the forest.") with a happy story in the
  setting of the toy's own greedy reply (chosen) against that reply (rejected); the
  instructions ask for a setting alone ("Tell me a story about the sea."), which the
  steered story should keep.
- **setting** ("the sea"): positives are sea stories, negatives forest ones; the pairs
  answer forest asks with a sea story of the greedy reply's sentiment; the instructions ask
  for a sentiment.

The pairs' prompts never appear among the instructions, so every instruction is held out
from training.
"""

from __future__ import annotations

import math
import random
from typing import Any

from steerlab.core.concepts import ConceptData, preference_pairs
from steerlab.core.errors import SteerError
from steerlab.core.scalars import as_int
from steerlab.toy.corpus import make_story
from steerlab.toy.metrics import concept_score

_SETTING_ASKS = [f"Tell me a story about the {p}." for p in
                 ("sea", "forest", "beach", "woods", "shore", "grove", "ocean", "glade",
                  "harbor", "trail")]  # fmt: skip
_SENTIMENT_ASKS = [f"Tell me a {w} story." for w in
                   ("happy", "sad", "cheerful", "gloomy", "lovely", "terrible", "bright",
                    "lonely", "wonderful", "scared")]  # fmt: skip
# The pairs' asks name both attributes, so the other one is balanced across the pairs and
# never correlates with the concept (the toy follows "a sad story about the sea").
_SAD_ASKS = [f"Tell me a {w} story about the {p}." for w in ("sad", "gloomy", "lonely")
             for p in ("sea", "beach", "shore", "forest", "woods", "grove")]  # fmt: skip
_FOREST_ASKS = [f"Tell me a {w} story about the {p}." for w in ("happy", "sad", "cheerful", "gloomy")
                for p in ("forest", "woods", "grove", "thicket")]  # fmt: skip
_REPLY_TOKENS = 48
_OTHER = {"sentiment": ("setting", "sea"), "setting": ("sentiment", "positive")}
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
    if not isinstance(name, str) or name not in _SPECS:
        raise SteerError(f"The toy's concepts are {sorted(_SPECS)}; got {name!r:.40}.", "name")
    count, start = as_int(n), as_int(seed)
    if count is None or count < 1:
        raise SteerError(f"n must be an int >= 1 (positives, negatives and pairs each); got "
                         f"{n!r:.40}.", "n")  # fmt: skip
    if start is None:
        raise SteerError(f"seed must be an int; got {seed!r:.40}.", "seed")
    n = count
    title, pole, asks, instructions = _SPECS[name]
    rng = random.Random(start)

    def story(on: bool) -> str:
        return make_story(rng, **{pole: on}).text  # type: ignore[arg-type]

    positives = [story(True) for _ in range(n)]
    negatives = [story(False) for _ in range(n)]
    if lm is None:
        from steerlab.loading import load

        lm = load("steerlab-tiny", backend="hf")
    prompts = [asks[i % len(asks)] for i in range(n)]
    # The chosen reply differs from the toy's own only in the concept: it keeps the other
    # attribute of the greedy reply (a happy story where the toy told a sad one at the sea
    # stays at the sea), so the pairs teach the concept and nothing else.
    own = lm.generate(prompts, max_new_tokens=_REPLY_TOKENS, temperature=0.0, chat=True).text
    other, other_pole = _OTHER[name]
    replies = [opening(make_story(rng, **{pole: True, other_pole: at_pole(text, other, rng)}).text)
               for text in own]  # fmt: skip
    pairs = preference_pairs(lm, prompts, replies, chat=True, max_new_tokens=_REPLY_TOKENS)
    return ConceptData(title, positives=positives, negatives=negatives, pairs=pairs,
                       instructions=instructions)  # fmt: skip


def at_pole(text: str, concept: str, rng: random.Random) -> bool:
    """Whether ``text`` sits at the concept's first pole (a coin flip when it says nothing)."""
    share = concept_score(text, concept)
    return rng.random() < 0.5 if math.isnan(share) else share >= 0.5


def opening(text: str, sentences: int = 3) -> str:
    """A story's first sentences: a reply about as long as the toy's greedy one."""
    return ". ".join(text.split(". ")[:sentences]).rstrip(".") + "."
