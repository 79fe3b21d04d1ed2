"""The context window: one rule for whether a call fits, and one message when it does not."""

from __future__ import annotations

from steerlab.core.errors import ContextError


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
