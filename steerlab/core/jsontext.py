"""JSON from files steerlab did not write: nesting bounded before the parser recurses.

``json.loads`` recurses once per nested array or object, so a file nested thousands deep
raises ``RecursionError`` (or, nested just under the limit, leaves a value that the next
recursive walk trips over). ``loads`` refuses nesting past ``max_depth`` first, naming the
key path where it starts, so each reader can raise its own clear error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

# Deeper than any file steerlab reads (a SAELens cfg.json is 3 deep, a vector header 3).
MAX_DEPTH = 64
# A JSON string (escapes included) or one structural character.
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},]')


class NestingError(ValueError):
    """JSON nested deeper than a reader accepts; ``path`` names where (``metadata.a[0]``)."""

    def __init__(self, path: str, max_depth: int) -> None:
        super().__init__(f"{path or 'the top level'} is nested more than {max_depth} deep")
        self.path = path
        self.max_depth = max_depth


def too_deep(text: str | bytes, max_depth: int = MAX_DEPTH) -> str | None:
    """The key path where ``text`` first nests past ``max_depth``, or None.

    A scan of the text, never a recursion: strings are skipped whole, so brackets inside
    them do not count. The path shows the first four steps, then ``…``.

    >>> too_deep('{"a": [[1]]}', 2), too_deep('{"a": "[[["}', 1)
    ('a[0]', None)
    """
    if isinstance(text, bytes):
        if text.count(b"[") + text.count(b"{") <= max_depth:
            return None
        text = text.decode("utf-8", errors="replace")
    if text.count("[") + text.count("{") <= max_depth:
        return None  # cannot be deeper than its number of openings
    stack: list[list[Any]] = []  # per open container: [kind, key or index, expecting a key]
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            if len(stack) == max_depth:
                return _path(stack)
            stack.append([token, 0 if token == "[" else None, token == "{"])
        elif token in "]}":
            if stack:
                stack.pop()
        elif not stack:
            continue
        elif token == ",":
            top = stack[-1]
            if top[0] == "[":
                top[1] += 1
            else:
                top[2] = True
        elif stack[-1][0] == "{" and stack[-1][2]:  # a string where a key belongs
            stack[-1][1], stack[-1][2] = _key(token), False
    return None


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH,
          object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:  # fmt: skip
    """``json.loads``, after refusing nesting past ``max_depth``.

    Raises:
        NestingError: the text nests too deep (its ``path`` says where).
        json.JSONDecodeError, UnicodeDecodeError: as ``json.loads``.

    >>> loads('{"a": 1}')
    {'a': 1}
    """
    path = too_deep(text, max_depth)
    if path is not None:
        raise NestingError(path, max_depth)
    return json.loads(text, object_pairs_hook=object_pairs_hook)


def _key(token: str) -> str:
    try:
        return str(json.loads(token))
    except ValueError:
        return token[1:-1]


def _path(stack: list[list[Any]]) -> str:
    steps = [f"[{step}]" if kind == "[" else f".{step}" for kind, step, _ in stack]
    text = "".join(steps[:4]).removeprefix(".")
    return text + ("…" if len(steps) > 4 else "")
