"""Progress bars that stay hidden for work under about a second.

steerlab's own bars (``extract``, ``sweep``) and the weight-loading bar transformers draws
inside ``sl.load`` all wait ``DELAY_S`` before they appear, so a toy model that loads and
extracts in a fraction of a second prints nothing, while a real model still shows progress.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")
DELAY_S = 1.0


def bar(items: Iterable[T], *, desc: str, disable: bool = False) -> Iterable[T]:
    """``items`` wrapped in a tqdm bar that shows only after ``DELAY_S`` seconds.

    >>> list(bar(range(3), desc="demo"))
    [0, 1, 2]
    """
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, disable=disable, leave=False, delay=DELAY_S)


def counter(total: int, desc: str, *, disable: bool = False) -> Any:
    """A tqdm bar counting to ``total`` (``bar.update(n)``), shown after ``DELAY_S`` seconds.

    >>> with counter(3, "demo") as b:
    ...     _ = b.update(3)
    """
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=disable, leave=True, delay=DELAY_S)


@contextmanager
def delayed_library_bars() -> Iterator[None]:
    """Give transformers' own progress bars the same delay, inside this block only.

    Usable as a decorator. A no-op on a transformers without ``set_tqdm_hook``.
    """
    from transformers.utils import logging

    set_hook = getattr(logging, "set_tqdm_hook", None)
    if set_hook is None:
        yield
        return
    previous: Callable[..., Any] | None = None

    def delayed(factory: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]):
        kwargs = {"delay": DELAY_S, **kwargs}
        return previous(factory, args, kwargs) if previous else factory(*args, **kwargs)

    previous = set_hook(delayed)
    try:
        yield
    finally:
        set_hook(previous)
