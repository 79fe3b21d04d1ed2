"""The context window: one rule for whether a call fits, and one message when it does not."""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from steerlab.core.errors import ContextError

# Every character str.isspace() accepts (what str.split drops), for counting without a copy.
_SPACES = tuple(
    "\u0009\u000a\u000b\u000c\u000d\u001c\u001d\u001e\u001f\u0020\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def fits(n_ctx: int | None, prompt: int, new: int) -> bool:
    """Whether ``prompt`` tokens (cached ones included) plus ``new`` fit in ``n_ctx``.

    >>> fits(128, 100, 28), fits(128, 100, 29), fits(None, 10**6, 1)
    (True, False, True)
    """
    return n_ctx is None or prompt + new <= n_ctx


def check_window(n_ctx: int | None, prompt: int, new: int, *, what: str = "max_new_tokens",
                 hint: str = "") -> None:  # fmt: skip
    """Refuse a call past the context window, before any compute.

    Args:
        n_ctx: the model's context window (None: unbounded).
        prompt: tokens the longest row holds before it generates (cached ones included).
        new: tokens it may generate.
        what: the argument that set ``new``, named in the message.
        hint: said after the message (how to make it fit).

    Raises:
        ContextError: naming both counts and the window.
    """
    if not fits(n_ctx, prompt, new):
        raise ContextError(
            f"{prompt} prompt tokens + {what}={new} = {prompt + new}, beyond this model's "
            f"context window of {n_ctx}{hint}."
        )


_LONGEST: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def longest_token(tokenizer: Any) -> int:
    """The most characters one token stands for: the longest vocabulary entry (byte-level
    entries are one character per byte, sentencepiece's ``▁`` is the space it decodes to,
    WordPiece's ``##`` is dropped when decoded: each is at least its decoded length)."""
    try:
        return _LONGEST[tokenizer]
    except (KeyError, TypeError):
        pass
    longest = max(map(len, tokenizer.get_vocab()), default=1)
    with contextlib.suppress(TypeError):  # an object that takes no weak reference: recount
        _LONGEST[tokenizer] = longest
    return longest


def least_tokens(tokenizer: Any, text: str) -> int:
    """A lower bound on the tokens ``text`` encodes to, without tokenizing it.

    Each token stands for at most ``longest_token`` characters. Whitespace is not counted
    (some normalizers collapse it), and the rest at half weight (some drop accents), so the
    bound holds for every tokenizer that keeps the text's other characters.

    >>> class Chars:
    ...     def get_vocab(self): return {"a": 0, "bc": 1}
    >>> least_tokens(Chars(), "abcabc  abc")  # 9 non-space characters, 2 per token, halved
    2
    """
    visible = len(text) - sum(map(text.count, _SPACES))  # 29 C scans: ~25 ms for 8 MB
    return visible // (2 * longest_token(tokenizer))


def check_text_window(tokenizer: Any, text: str, n_ctx: int | None, *, prompt: str = "") -> None:
    """Refuse, before tokenizing it, a text that cannot fit in ``n_ctx`` tokens whatever
    its tokens turn out to be: so a multi-megabyte prompt for a small window costs a count,
    not seconds of tokenizing. Texts within ``2 * n_ctx`` characters are never counted."""
    if n_ctx is None or len(text) <= 2 * n_ctx:
        return
    if len(text) // (2 * longest_token(tokenizer)) <= n_ctx:  # not even with no whitespace
        return
    least = least_tokens(tokenizer, text)
    if least > n_ctx:
        raise ContextError(
            f"{prompt or 'The prompt'} has {len(text)} characters, at least {least} tokens for "
            f"this tokenizer (its longest token is {longest_token(tokenizer)} characters), "
            f"beyond this model's context window of {n_ctx}; refused before tokenizing."
        )
