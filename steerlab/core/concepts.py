"""Training and evaluation data as values: preference pairs, examples, and a concept's data.

``Preference`` and ``Example`` are what ``sl.train`` learns from; ``ConceptData`` is what
``sl.evals.benchmark`` needs to extract, train, detect and judge one concept. They live in
the core because the toy world builds them offline and the trainers and the benchmark read
them, and neither may import the other. ``preference_pairs`` (``sl.train.preference_pairs``)
builds pairs from a model's own greedy replies, and ``ConceptData.from_axbench`` reads
AxBench's released data (``steerlab.core.axbench``), with pairs when given a model.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from steerlab.core.errors import SteerError
from steerlab.core.prompts import has_chat_template, rendered
from steerlab.core.scalars import as_int, flag


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

    @classmethod
    def from_axbench(cls, path: str | os.PathLike[str], concept: str | None = None, *,
                     concept_id: int | None = None, lm: Any = None,
                     instructions: Sequence[str] | None = None,
                     max_new_tokens: int | None = None) -> ConceptData:  # fmt: skip
        """One concept of an AxBench dataset folder (its released layout), as AxBench trains it.

        Args:
            path: the folder, such as ``concept500/prod_2b_l10_v1``, holding
                ``generate/metadata.jsonl`` and ``generate/train_data.parquet``.
            concept: the concept's description as its metadata names it; or
            concept_id: its id there.
            lm: the model whose greedy replies are the pairs' rejected side; None: no pairs.
            instructions: the prompts the steered model answers; None: the concept's
                positive rows' inputs.
            max_new_tokens: the greedy replies' length (``preference_pairs``'s rule when None).

        The positives are the concept's ``positive`` rows' outputs; the negatives are the
        ``negative`` rows AxBench shares between concepts (``concept_id`` -1), those of the
        concept's genre, as AxBench's training reads them. The pairs are ``(input, output,
        lm's greedy reply to input)`` for each positive row. Needs pandas and pyarrow (the
        ``axbench`` extra).

        Raises:
            SteerError: a folder without AxBench's files, an unknown concept (naming the
                closest ones), both or neither of ``concept`` and ``concept_id``.

        With AxBench's data at hand (its repository's ``axbench/concept500``),
        ``ConceptData.from_axbench("concept500/prod_2b_l10_v1", concept_id=0)`` is
        ``ConceptData('references to specific dates and publication information': 72
        positives, 72 negatives, 0 pairs, 72 instructions)``.
        """
        from steerlab.core.axbench import read_concept

        rows = read_concept(path, concept, concept_id)
        data = cls(rows.concept, positives=rows.positives, negatives=rows.negatives,
                   instructions=rows.inputs if instructions is None else instructions)  # fmt: skip
        if lm is None:
            return data
        pairs = preference_pairs(lm, rows.inputs, rows.positives, max_new_tokens=max_new_tokens)
        return replace(data, pairs=pairs)

    @property
    def examples(self) -> list[Example]:
        """The pairs' chosen sides as supervised examples (a LoReFT trained on likelihood)."""
        return [Example(p.prompt, p.chosen) for p in self.pairs]

    def __repr__(self) -> str:
        return (f"ConceptData({self.name!r}: {len(self.positives)} positives, "
                f"{len(self.negatives)} negatives, {len(self.pairs)} pairs, "
                f"{len(self.instructions)} instructions)")  # fmt: skip


def preference_pairs(lm: Any, instructions: Sequence[str], replies: Sequence[str], *,
                     chat: bool | None = None, max_new_tokens: int | None = None
                     ) -> list[Preference]:  # fmt: skip
    """``Preference(model input, reply, the model's own greedy reply)`` for each instruction.

    Args:
        lm: the model whose own replies are the rejected side.
        instructions: the prompts.
        replies: for each instruction, a reply that shows the concept (the chosen side).
        chat: render each instruction with the chat template; None: when the model has one.
            The pair's prompt is the rendered text, so training sees what generation sees.
        max_new_tokens: the greedy reply's length; None: the longest reply's token count.

    A reply the model would give itself teaches nothing and is dropped, with a warning.

    >>> pairs = preference_pairs(lm, ["Once upon a time"], [" there was a happy fox."])
    >>> pairs[0].chosen
    ' there was a happy fox.'
    """
    for what, texts in (("instructions", instructions), ("replies", replies)):
        if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
            raise SteerError(f"{what} must be a list of strings; got {type(texts).__name__}.")
        if not texts or not all(isinstance(t, str) and t for t in texts):
            raise SteerError(f"{what} must be a non-empty list of non-empty strings.")
    if len(instructions) != len(replies):
        raise SteerError(f"preference_pairs needs one reply per instruction; got "
                         f"{len(instructions)} instructions and {len(replies)} replies.")  # fmt: skip
    tokenizer = lm.tokenizer
    chat = has_chat_template(tokenizer) if chat is None else flag(chat, "chat")
    if max_new_tokens is None:
        max_new_tokens = max(len(tokenizer(r, add_special_tokens=False)["input_ids"])
                             for r in replies)  # fmt: skip
    elif as_int(max_new_tokens) is None or max_new_tokens < 1:
        raise SteerError(f"max_new_tokens must be an int >= 1; got {max_new_tokens!r}.")
    own = lm.generate(list(instructions), max_new_tokens=int(max_new_tokens), temperature=0.0,
                      chat=chat).text  # fmt: skip
    pairs = [Preference(rendered(tokenizer, i, chat=chat), r, o)
             for i, r, o in zip(instructions, replies, own) if o and o != r]  # fmt: skip
    if len(pairs) < len(replies):
        warnings.warn(f"{len(replies) - len(pairs)} of {len(replies)} replies equal the model's "
                      "own greedy reply (or it replied nothing); those pairs are dropped.",
                      stacklevel=2)  # fmt: skip
    return pairs
