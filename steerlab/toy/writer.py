"""``ToyWriter``: the writer of the toy world, so ``sl.evals.write_concept_data`` runs offline.

It answers the writer's questions (``steerlab.core.writing``) the way an LLM would for a
toy story, for the toy's two concepts as ``ToyJudge`` names them ("happiness", "the sea"):

- **weave the concept in**: a short story at the concept's first pole (happy; at the sea);
- **keep it out**: a short story at its other pole (sad; in the forest). The toy writes no
  code or math, so a negative asked in those forms is a story too;
- the story's other attribute follows the request where it names one ("Tell me a sad story"
  keeps the sad; a happy sea story for "the sea"), else a coin flip.

The same question always gets the same story (the generator is seeded by the question), so
a run repeats; a question asked for another version gets another story.
"""

from __future__ import annotations

import random

from steerlab.core.writing import read_question
from steerlab.toy.concepts import at_pole, opening
from steerlab.toy.corpus import make_story
from steerlab.toy.judge import NAMES

# The toy concept -> its pole keyword in make_story, the other concept and its keyword.
_POLES = {"sentiment": ("positive", "setting", "sea"),
          "setting": ("sea", "sentiment", "positive")}  # fmt: skip


class ToyWriter:
    """The toy's offline writer: ``ask(question) -> a short toy story`` (see the module).

    Args:
        seed: mixed into each question's story generator.

    >>> from steerlab.core.writing import question
    >>> ToyWriter().ask(question("positive", "the sea", "Tell me a happy story."))  # doctest: +ELLIPSIS
    '...'
    """

    max_workers = 1
    max_retries = 0  # the same question gets the same story: asking again changes nothing

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def __repr__(self) -> str:
        return f"ToyWriter(seed={self.seed})"

    def ask(self, question: str) -> str:
        """A short toy story answering one of ``write_concept_data``'s questions.

        Raises:
            ValueError: a question ``write_concept_data`` did not write, or a concept the
                toy does not know.
        """
        asked = read_question(question)
        if asked.concept not in NAMES:
            raise ValueError(f"ToyWriter knows the toy's concepts {sorted(NAMES)}; got "
                             f"{asked.concept!r}.")  # fmt: skip
        keyword, other, other_keyword = _POLES[NAMES[asked.concept]]
        rng = random.Random(f"{self.seed}:{question}")
        poles = {keyword: asked.kind == "positive",
                 other_keyword: at_pole(asked.instruction, other, rng)}  # fmt: skip
        return opening(make_story(rng, **poles).text)  # type: ignore[arg-type]
