"""What a writer is asked when it writes a concept's data, and how to read a question back.

AxBench (Wu et al., 2025; ``axbench/templates/prompt_templates.py``) has an LLM answer each
instruction twice: once weaving the concept in (a positive), once keeping it out (a
negative, 15% of them math and 15% code, the rest text). The wording here is steerlab's own.
It lives in the core because two layers read it: ``sl.evals.write_concept_data`` asks these
questions, and the toy's offline writer (``steerlab.toy.ToyWriter``) reads them back.

>>> q = question("positive", "the sea", "Tell me a story.")
>>> read_question(q)
Question(kind='positive', concept='the sea', instruction='Tell me a story.', genre='text', version=1)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GENRES = ("text", "math", "code")
GENRE_SHARE = {"math": 0.15, "code": 0.15}  # AxBench's negatives; text takes the rest

_HEAD = {
    "positive": "You are writing data for a study of how language models represent a concept.",
    "negative": "You are writing contrast data for a study of how language models represent "
    "a concept.",
}
_TASK = {
    "positive": "Answer the request, and weave the concept into the answer, even where it does "
    "not fit the request. Evoke the concept with words and ideas of its own rather than by "
    "repeating its description.",
    "negative": "Answer the request {form}, and keep the concept out of the answer entirely: do "
    "not mention it or anything that evokes it.",
}
_FORM = {
    "text": "in plain prose",
    "math": "with a short worked calculation or equation that it calls for",
    "code": "with a short piece of code that serves it",
}
_TAIL = "Keep the answer to one short paragraph (about 100 words), and reply with the answer only."
_VERSION = "This is version {version} of an answer to this request: make it differ from the others."
_SHAPE = re.compile(
    r"^(?P<head>.*?)\n\nConcept: (?P<concept>.*?)\n\nRequest:\n<<<\n(?P<instruction>.*?)\n>>>"
    r"\n\n(?P<task>.*)$",
    re.S,
)


@dataclass(frozen=True)
class Question:
    """One writer request, as ``read_question`` reads it back."""

    kind: str  # "positive" (weave the concept in) or "negative" (keep it out)
    concept: str
    instruction: str
    genre: str = "text"  # a negative's form: "text", "math" or "code"
    version: int = 1  # the n-th answer asked to the same instruction


def question(kind: str, concept: str, instruction: str, genre: str = "text",
             version: int = 1) -> str:  # fmt: skip
    """The text a writer is asked (see the module docstring)."""
    if kind not in _TASK or genre not in _FORM:
        raise ValueError(f"kind must be one of {sorted(_TASK)} and genre one of {GENRES}; "
                         f"got {kind!r}, {genre!r}.")  # fmt: skip
    task = _TASK[kind].format(form=_FORM[genre])
    extra = "" if version == 1 else " " + _VERSION.format(version=version)
    return (f"{_HEAD[kind]}\n\nConcept: {concept}\n\nRequest:\n<<<\n{instruction}\n>>>\n\n"
            f"{task} {_TAIL}{extra}")  # fmt: skip


def read_question(text: str) -> Question:
    """What ``question`` asked, read back from its text.

    Raises:
        ValueError: a text that ``question`` did not write.
    """
    match = _SHAPE.match(text)
    kinds = [k for k, head in _HEAD.items() if match and match["head"] == head]
    if not match or not kinds:
        raise ValueError(f"Not a writer question of steerlab's: {text!r:.80}")
    task = match["task"]
    genre = next((g for g, form in _FORM.items() if f"request {form}," in task), "text")
    version = re.search(r"This is version (\d+) ", task)
    return Question(kinds[0], match["concept"], match["instruction"], genre,
                    int(version[1]) if version else 1)  # fmt: skip


def genre_plan(n: int) -> list[str]:
    """The genres of ``n`` negatives by AxBench's shares: 15% math and 15% code (each
    rounded down), text the rest, each genre spread evenly through the list.

    >>> genre_plan(10)
    ['text', 'text', 'text', 'text', 'math', 'code', 'text', 'text', 'text', 'text']
    >>> plan = genre_plan(72)
    >>> plan.count("text"), plan.count("math"), plan.count("code")
    (52, 10, 10)
    """
    counts = {g: int(n * share) for g, share in GENRE_SHARE.items()}
    counts = {"text": n - sum(counts.values()), **counts}
    spots = [((k + 0.5) / c, g) for g, c in counts.items() for k in range(c)]
    return [g for _, g in sorted(spots, key=lambda s: s[0])]
