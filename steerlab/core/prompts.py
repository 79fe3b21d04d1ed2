"""From prompts to a left-padded batch of token ids, chat templates included."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from steerlab.core.errors import PromptError
from steerlab.core.scalars import as_int, flag

Message = dict[str, str]
Prompt = str | list[Message]


ROLES = ("system", "developer", "user", "assistant", "tool")


def normalise(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    """One prompt or a list of them, as a non-empty list of checked prompts: strings that
    are valid Unicode text, or message lists (``check_messages``).

    >>> normalise("Hi"), len(normalise(["a", [{"role": "user", "content": "b"}]]))
    (['Hi'], 2)
    """
    if not isinstance(prompts, (str, list, tuple)):
        raise PromptError(
            f"prompts must be a string, a list of messages, or a list of those; got "
            f"{type(prompts).__name__} {prompts!r:.60}.{_ids_hint(prompts)}"
        )
    single = isinstance(prompts, str) or (
        isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], dict)
    )
    listed: list[Prompt] = [prompts] if single else list(prompts)  # type: ignore[list-item, arg-type]
    if not listed:
        raise PromptError("The prompt list is empty: give at least one prompt.")
    for i, p in enumerate(listed):
        if isinstance(p, str):
            check_text(p, f"prompt {i}")
        elif isinstance(p, list) and not _token_ids(p):
            listed[i] = check_messages(p, f"prompt {i}")
        else:
            raise PromptError(
                f"prompt {i} must be a string or a list of messages; got "
                f"{type(p).__name__} {p!r:.60}.{_ids_hint(p)}"
            )
    return listed


def _token_ids(x: Any) -> bool:
    """Whether ``x`` looks like token ids: an int (``as_int``'s), an int tensor or array, or
    a non-empty list of those."""
    if as_int(x) is not None:
        return True
    if hasattr(x, "dtype") and hasattr(x, "tolist"):  # a tensor or an array
        return "int" in str(x.dtype)
    return isinstance(x, (list, tuple)) and bool(x) and all(_token_ids(v) for v in x)


def _ids_hint(given: Any) -> str:
    if not _token_ids(given):
        return ""
    return (" Token ids are not a prompt here: decode them (lm.tokenizer.decode(ids)), or "
            "score them with steerlab.engine.scoring.score_prompts(lm.engine, [ids]).")  # fmt: skip


def check_text(text: str, what: str) -> None:
    """Refuse a string that is not valid Unicode text (a lone surrogate cannot be encoded,
    so no tokenizer can read it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PromptError(
            f"{what} holds a lone surrogate {text[error.start]!r} at character {error.start}: "
            "not valid Unicode text (decode bytes with errors='replace', or fix the string)."
        ) from None


def check_messages(messages: Any, what: str = "messages") -> list[Message]:
    """A conversation checked and made plain: a non-empty list of dicts, each with a known
    ``role`` and ``content`` that is a string or a list of text parts
    (``[{"type": "text", "text": ...}]``, joined with ""). Errors name the message index.

    >>> check_messages([{"role": "user", "content": [{"type": "text", "text": "Hi"}]}])
    [{'role': 'user', 'content': 'Hi'}]
    """
    if not isinstance(messages, list):
        raise PromptError(f"{what} must be a list of message dicts; got {type(messages).__name__}.")
    if not messages:
        raise PromptError(f"{what} is an empty list of messages: give at least one.")
    plain = []
    for i, m in enumerate(messages):
        where = f"{what}, message {i}"
        if not isinstance(m, dict):
            raise PromptError(
                f"{where} must be a dict with 'role' and 'content'; got {type(m).__name__} "
                f"{m!r:.60}."
            )
        missing = [k for k in ("role", "content") if k not in m]
        if missing:
            raise PromptError(f"{where} has no {' or '.join(map(repr, missing))}: {m!r:.60}.")
        role = m["role"]
        if role not in ROLES:
            raise PromptError(f"{where} has role {role!r:.40}; roles are {', '.join(ROLES)}.")
        plain.append({**m, "content": _content(m["content"], where)})
    return plain


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        check_text(content, where)
        return content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind != "text" or not isinstance(part.get("text"), str):
                raise PromptError(
                    f"{where}, content part {k} is {kind!r}: steerlab reads text parts "
                    "only ({'type': 'text', 'text': ...})."
                )
            check_text(part["text"], f"{where}, content part {k}")
            texts.append(part["text"])
        return "".join(texts)
    raise PromptError(
        f"{where} content must be a string or a list of text parts; got "
        f"{type(content).__name__} {content!r:.40}."
    )


def encode(tokenizer: Any, prompt: Prompt, *, chat: bool) -> list[int]:
    """Token ids for one prompt, with exactly the BOS the model expects (never two)."""
    if flag(chat, "chat"):
        messages = (
            [{"role": "user", "content": prompt}]
            if isinstance(prompt, str)
            else check_messages(prompt)
        )
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            # The rendered template carries its own special tokens.
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            return _single_bos(tokenizer, ids)
        warnings.warn(
            "This tokenizer has no chat template; using the raw message text.", stacklevel=3
        )
        prompt = "\n".join(m["content"] for m in messages)
    elif not isinstance(prompt, str):
        raise PromptError("A list of messages needs chat=True.")
    return _single_bos(tokenizer, tokenizer(prompt)["input_ids"])


def rendered(tokenizer: Any, prompt: Prompt, *, chat: bool) -> str:
    """The text a prompt is fed as: with ``chat``, its chat template rendered for a reply
    (when the tokenizer has one); otherwise the string itself. Training rows encode it with
    ``chat=False``: the same ids as the chat prompt where the template writes the BOS itself
    or the tokenizer adds none (one BOS either way, never two)."""
    if flag(chat, "chat") and getattr(tokenizer, "chat_template", None):
        messages = (
            [{"role": "user", "content": prompt}]
            if isinstance(prompt, str)
            else check_messages(prompt)
        )
        return str(tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True))  # fmt: skip
    if not isinstance(prompt, str):
        raise PromptError("A list of messages needs chat=True.")
    return prompt


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer carries a chat template (``chat=True`` then uses it)."""
    return bool(getattr(tokenizer, "chat_template", None))


def _single_bos(tokenizer: Any, ids: list[int]) -> list[int]:
    bos = tokenizer.bos_token_id
    while bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]
    return ids


@dataclass(frozen=True)
class Batch:
    """Left-padded prompts: pads first, so every row's last token is aligned."""

    input_ids: torch.Tensor  # [batch, pos]
    attention_mask: torch.Tensor  # [batch, pos], 1 on real tokens
    prompt_lengths: torch.Tensor  # [batch]

    @classmethod
    def left_pad(cls, rows: list[list[int]], pad_id: int) -> Batch:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            if row:
                ids[i, width - len(row) :] = torch.tensor(row)
                mask[i, width - len(row) :] = 1
        return cls(ids, mask, torch.tensor([len(r) for r in rows]))


def token_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of each token from its row's first real token; -1 on pads. [batch, pos]"""
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, -1)
