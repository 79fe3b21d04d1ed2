"""The generation options in every door's signature: ``takes_options``.

``lm.generate``, ``lm.stream``, ``chat.say`` and ``sl.connect``'s model take the options of
``core.request.OPTIONS`` as ``**options``; this decorator shows them as keyword-only
parameters and docstring lines, so notebooks tab-complete them and ``help`` lists them.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from typing import Any, TypeVar

from steerlab.core.request import OPTIONS

F = TypeVar("F", bound=Callable[..., Any])


def takes_options(func: F) -> F:
    """Show the generation options in ``func(..., **options)``'s signature and docstring.

    ``OPTIONS`` become keyword-only parameters (after the positional ones, before ``func``'s
    own keywords) in ``__signature__``, so notebooks tab-complete them and ``help`` lists
    them, and ``{options}`` in the docstring becomes one ``name: doc`` line each. ``func``
    builds its ``Sampling`` with ``Sampling.of(options)``.
    """
    sig = inspect.signature(func)
    params = list(sig.parameters.values())
    if not params or params[-1].kind is not inspect.Parameter.VAR_KEYWORD:
        raise TypeError(f"{func.__qualname__} must end with **options")
    positional = [p for p in params[:-1] if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    own = [p for p in params[:-1] if p.kind is inspect.Parameter.KEYWORD_ONLY]
    shown = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default,
                               annotation=o.annotation) for o in OPTIONS]  # fmt: skip
    func.__signature__ = sig.replace(parameters=[*positional, *shown, *own])  # type: ignore[attr-defined]
    if func.__doc__ and "{options}" in func.__doc__:
        line = next(x for x in func.__doc__.splitlines() if "{options}" in x)
        indent = line[: len(line) - len(line.lstrip())]
        lines = [textwrap.fill(f"{o.name}: {o.doc}", 92, initial_indent=indent,
                               subsequent_indent=indent + "    ") for o in OPTIONS]  # fmt: skip
        func.__doc__ = func.__doc__.replace(line, "\n".join(lines))
    return func
