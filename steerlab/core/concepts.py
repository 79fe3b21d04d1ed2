"""Training and evaluation data as values: preference pairs, examples, and a concept's data.

``Preference`` and ``Example`` are what ``sl.train`` learns from; ``ConceptData`` is what
``sl.evals.benchmark`` needs to extract, train, detect and judge one concept. They live in
the core because the toy world builds them offline and the trainers and the benchmark read
them, and neither may import the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from steerlab.core.errors import SteerError


@dataclass(frozen=True)
class Preference:
    """A prompt with a preferred (``chosen``) and a dispreferred (``rejected``) continuation.

    >>> Preference("The day was", chosen=" happy and bright.", rejected=" sad and cold.").chosen
    ' happy and bright.'
    """

    prompt: str
    chosen: str
    rejected: str

    def __post_init__(self) -> None:
        for name in ("prompt", "chosen", "rejected"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise SteerError(f"Preference {name} must be a non-empty string.")
        if self.chosen == self.rejected:
            raise SteerError(f"Preference for {self.prompt!r:.40}: chosen equals rejected "
                             f"({self.chosen!r:.40}); the pair teaches nothing.")  # fmt: skip


@dataclass(frozen=True)
class Example:
    """A prompt and the continuation (``target``) to learn.

    >>> Example("Once upon a time", " there was a boat on the sea.").target
    ' there was a boat on the sea.'
    """

    prompt: str
    target: str

    def __post_init__(self) -> None:
        for name in ("prompt", "target"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise SteerError(f"Example {name} must be a non-empty string.")


def _texts(value: Any, field_name: str, concept: str) -> tuple[str, ...]:
    """A list of non-empty strings; a bare string (which would split into characters) refused."""
    where = f"ConceptData({concept!r}).{field_name}"
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise SteerError(f"{where} must be a list of strings; got {type(value).__name__} "
                         f"{value!r:.60}.")  # fmt: skip
    for i, text in enumerate(value):
        if not isinstance(text, str) or not text.strip():
            raise SteerError(f"{where}[{i}] must be a non-empty string; got {text!r:.60}.")
    return tuple(value)


@dataclass(frozen=True)
class ConceptData:
    """What a benchmark needs to know of one concept; each method reads the fields it needs.

    Args:
        name: the concept as the judge is told it ("happiness", "the sea").
        positives: texts that show the concept (mean difference, PCA, detection).
        negatives: texts that do not (the same methods).
        pairs: ``Preference(prompt, chosen, rejected)``: ``chosen`` shows the concept,
            ``rejected`` is the model's own reply (BiPO, RePS, LoReFT);
            ``sl.train.preference_pairs`` builds them.
        instructions: the prompts the steered model answers; the first part of them
            chooses each method's factor, the rest is the test split.

    >>> data = ConceptData("the sea", positives=["The waves rolled."], negatives=["The owl hooted."],
    ...                    instructions=["Tell me a story.", "Tell me a sad story."])
    >>> data
    ConceptData('the sea': 1 positives, 1 negatives, 0 pairs, 2 instructions)
    """

    name: str
    positives: Sequence[str] = ()
    negatives: Sequence[str] = ()
    pairs: Sequence[Preference] = ()
    instructions: Sequence[str] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise SteerError(f"ConceptData name must be a non-empty string; got {self.name!r:.60}.")
        for name in ("positives", "negatives", "instructions"):
            object.__setattr__(self, name, _texts(getattr(self, name), name, self.name))
        pairs = self.pairs
        if isinstance(pairs, (str, bytes)) or not isinstance(pairs, Sequence):
            raise SteerError(f"ConceptData({self.name!r}).pairs must be a list of "
                             f"sl.Preference; got {type(pairs).__name__}.")  # fmt: skip
        for i, pair in enumerate(pairs):
            if not isinstance(pair, Preference):
                raise SteerError(f"ConceptData({self.name!r}).pairs[{i}] is "
                                 f"{type(pair).__name__}, not sl.Preference.")  # fmt: skip
        object.__setattr__(self, "pairs", tuple(pairs))

    @property
    def examples(self) -> list[Example]:
        """The pairs' chosen sides as supervised examples (a LoReFT trained on likelihood)."""
        return [Example(p.prompt, p.chosen) for p in self.pairs]

    def __repr__(self) -> str:
        return (f"ConceptData({self.name!r}: {len(self.positives)} positives, "
                f"{len(self.negatives)} negatives, {len(self.pairs)} pairs, "
                f"{len(self.instructions)} instructions)")  # fmt: skip
