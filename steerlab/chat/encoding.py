"""A conversation as token ids: the chat template's rendering, checked, and what a turn adds.

Every turn is encoded the way ``lm.generate(conversation, chat=True)`` encodes it: the
template renders the whole conversation (earlier replies as their text), and the rendering
is tokenized. The cache already holds most of it, and a turn feeds only from the first
token where the two differ (``common_prefix``). For the templates tested (the toy model's,
Llama-3 and ChatML) the cache holds each reply as the exact ids the model generated, its
EOS included, and those equal the rendering, so a turn feeds only the new message and the
template's tokens around it.

Where a template renders a reply differently from how it was generated, the turn
re-feeds from the first differing token. That happens when:

- the reply ended at a stop string (the text is cut before it, the cache holds it);
- the reply ended at ``max_new_tokens`` (no EOS yet: the template's end-of-turn is fed);
- the model produced token ids that its tokenizer would not produce for that text
  (non-canonical merges, special tokens inside a reply, which the text leaves out);
- the template rewrites history (strips reasoning from earlier replies, trims
  whitespace, or stamps today's date into the system prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from steerlab.core.prompts import Message, PromptError, _single_bos, check_messages, check_text

_PROBE = "\x00steerlab-role-probe-{}\x00"


def as_messages(message: str | Message | Sequence[Message]) -> list[Message]:
    """What ``say`` takes (a string is the user's message) as checked message dicts
    (``core.prompts.check_messages``: errors name the message index)."""
    if isinstance(message, str):
        check_text(message, "message")
        return [{"role": "user", "content": message}]
    listed = check_messages([message] if isinstance(message, dict) else message, "say()")
    if any(m["role"] == "assistant" for m in listed):
        raise PromptError("say() takes your messages; the assistant's replies come from the model.")
    return listed


def render(tokenizer: Any, messages: list[Message], *, generation_prompt: bool) -> list[int]:
    """Token ids of the template's rendering, with one BOS (as ``lm.generate(chat=True)``).

    Raises:
        PromptError: the template refused the conversation (``raise_exception`` in it).
    """
    try:
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
    except Exception as error:  # jinja's TemplateError, or the template's own exception
        raise PromptError(f"The chat template refused this conversation: {error}") from error
    return _single_bos(tokenizer, tokenizer(text, add_special_tokens=False)["input_ids"])


def check_roles(tokenizer: Any, history: list[Message], new: list[Message]) -> None:
    """Every new message must appear in the rendering: a template may drop a role it does
    not know (or raise, which ``render`` reports)."""
    probes = [{"role": m["role"], "content": _PROBE.format(i)} for i, m in enumerate(new)]
    try:
        text = tokenizer.apply_chat_template(
            history + probes, tokenize=False, add_generation_prompt=True
        )
    except Exception as error:
        roles = sorted({m["role"] for m in new})
        raise PromptError(
            f"The chat template refused a message with role {', '.join(map(repr, roles))}: {error}"
        ) from error
    for i, m in enumerate(new):
        if _PROBE.format(i) not in text:
            raise PromptError(
                f"This model's chat template does not render role {m['role']!r}: the "
                "message would be dropped. Use a role the template knows (user, system...)."
            )


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the longest common prefix of two sequences."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
