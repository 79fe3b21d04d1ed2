"""``ToyJudge``: a judge for the toy world that rates by rules, so the benchmark runs offline.

It answers the benchmark's judge protocol, ``rate(concept, instruction, text) -> (concept,
instruction, fluency)`` on 0-2, the way an LLM judge would for a toy story:

- **concept**: ``2 × concept_score(text, concept)``, the share of the concept's pole words
  among its lexicon words (0 when the text has none);
- **instruction**: the instruction's other attribute kept. "Tell me a story about the sea"
  asks for the sea: a text whose setting words are all sea words scores 2, all forest 0,
  none 0. An instruction that names neither pole asks for a story: any such word scores 2;
- **fluency**: from the unsteered toy's perplexity of the text, 2 at ``good`` or below, 0
  at ``bad`` or above, linear in log-perplexity between (the toy's own stories sit at
  about 2 to 3).
"""

from __future__ import annotations

import math
from typing import Any

from steerlab.core.errors import SteerError
from steerlab.toy.corpus import CONCEPTS
from steerlab.toy.metrics import concept_score
from steerlab.vectors.scoring import completion_nll

# What the judge is told (the ConceptData name) -> the toy concept and its pole-A prompt.
NAMES = {"happiness": "sentiment", "sentiment": "sentiment", "the sea": "setting",
         "setting": "setting"}  # fmt: skip
PROMPTS = {"sentiment": "Tell me a happy story.", "setting": "Tell me a story about the sea."}


class ToyJudge:
    """Rule-based 0-2 ratings for the toy's two concepts (see the module docstring).

    Args:
        lm: the toy model (any backend) whose unsteered perplexity measures fluency; None
            loads ``steerlab-tiny`` on the hf backend.
        good: the perplexity that rates fluency 2 (and below).
        bad: the perplexity that rates fluency 0 (and above).

    >>> judge = ToyJudge()
    >>> judge.rate("happiness", "Tell me a story about the sea.",
    ...            "Mia smiled at the sea. The waves rolled over the sand, and she sang.")[:2]
    (2.0, 2.0)
    """

    max_workers = 1  # one model in this process: ratings run one at a time

    def __init__(self, lm: Any = None, *, good: float = 4.0, bad: float = 16.0) -> None:
        if not 1.0 <= good < bad:
            raise ValueError(f"ToyJudge needs 1 <= good < bad; got good={good}, bad={bad}.")
        if lm is None:
            from steerlab.loading import load

            lm = load("steerlab-tiny", backend="hf")
        self.lm, self.good, self.bad = lm, float(good), float(bad)
        self._fluency: dict[str, float] = {}  # a benchmark's low factors repeat texts

    def __repr__(self) -> str:
        return f"ToyJudge(fluency 2 at perplexity <= {self.good:g}, 0 at >= {self.bad:g})"

    def rate(self, concept: str, instruction: str, text: str) -> tuple[float, float, float]:
        key = _concept(concept)
        (other,) = set(CONCEPTS) - {key}
        shown = concept_score(text, key)
        wanted, kept = concept_score(instruction, other), concept_score(text, other)
        if math.isnan(kept):
            follows = 0.0
        elif math.isnan(wanted):
            follows = 2.0
        else:
            follows = 2.0 * (1.0 - abs(kept - wanted))
        return (0.0 if math.isnan(shown) else 2.0 * shown, follows, self.fluency(text))

    def rate_with_replies(self, concept: str, instruction: str, text: str
                          ) -> tuple[tuple[float, float, float], tuple[str, str, str]]:  # fmt: skip
        """``rate``'s ratings and a reply per criterion saying which rule gave it."""
        ratings = self.rate(concept, instruction, text)
        why = ("the share of the concept's pole words among its lexicon words, times 2",
               "the instruction's other attribute kept in the text",
               "the unsteered toy's perplexity of the text")  # fmt: skip
        c, i, f = (f"By {rule}.\nRating: {value:g}" for rule, value in zip(why, ratings))
        return ratings, (c, i, f)

    def check_concept(self, concept: str) -> None:
        """Refuse a concept this judge has no rule for (before a benchmark generates)."""
        _concept(concept)

    def fluency(self, text: str) -> float:
        """2 at perplexity ``good`` or below, 0 at ``bad`` or above, log-linear between."""
        if not text.strip():
            return 0.0
        if text not in self._fluency:
            self._fluency[text] = self._rate_fluency(text)
        return self._fluency[text]

    def _rate_fluency(self, text: str) -> float:
        tokens = self.lm.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not tokens:
            return 0.0
        start = self.lm.tokenizer("")["input_ids"]  # the BOS a story starts after
        ((nll, n),) = completion_nll(self.lm, [start], [tokens])
        ppl = math.exp(nll / n)
        share = math.log(self.bad / ppl) / math.log(self.bad / self.good)
        return 2.0 * min(max(share, 0.0), 1.0)

    def write_prompt(self, concept: str) -> str:
        """The toy's own way to ask for the concept: the ask it was trained on."""
        return PROMPTS[_concept(concept)]


def _concept(name: str) -> str:
    if name not in NAMES:
        raise SteerError(f"ToyJudge knows the toy's concepts {sorted(NAMES)}; got {name!r}.")
    return NAMES[name]
