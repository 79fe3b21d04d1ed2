"""Preference pairs from (instruction, concept reply): the model's own greedy reply is the
other side, as AxBench builds RePS's training data."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from steerlab.core.concepts import Preference
from steerlab.core.errors import SteerError
from steerlab.core.prompts import has_chat_template, rendered
from steerlab.core.scalars import as_int, flag

if TYPE_CHECKING:
    from steerlab.model import SteerableModel


def preference_pairs(lm: SteerableModel, instructions: Sequence[str], replies: Sequence[str], *,
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
