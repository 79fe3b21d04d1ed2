"""The panel's completions as a text or JSON file, and a button row that writes them."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as widgets

COMPLETION_FORMATS = ("txt", "json")


def completions_text(record: dict[str, Any]) -> str:
    """A readable report: the settings, then the baseline and steered completions.

    >>> print(completions_text({"prompt": "Hi", "alpha": 2.0, "baseline": "a", "steered": "b"}))
    prompt: Hi
    alpha: 2
    <BLANKLINE>
    --- baseline ---
    Hi|a
    <BLANKLINE>
    --- steered ---
    Hi|b
    """
    settings = [
        f"{k}: {_display(v)}" for k, v in record.items() if k not in ("baseline", "steered")
    ]
    prompt = record.get("prompt", "")
    return "\n".join(
        [
            *settings,
            "",
            "--- baseline ---",
            f"{prompt}|{record['baseline']}",
            "",
            "--- steered ---",
            f"{prompt}|{record['steered']}",
        ]
    )


def _display(value: object) -> object:
    """Floats rounded to 4 decimals for reading, the exact value after them when it differs.

    >>> _display(5.0000000000000036), _display(0.5)
    ('5 (exact 5.0000000000000036)', '0.5')
    """
    if not isinstance(value, float):
        return value
    shown = f"{round(value, 4) + 0.0:g}"
    return shown if float(shown) == value else f"{shown} (exact {value!r})"


def write_completions(record: dict[str, Any], path: str | Path) -> Path:
    """Write ``record`` as ``.txt`` or ``.json``, chosen by the suffix."""
    path = Path(path)
    suffix = path.suffix.lstrip(".")
    if suffix not in COMPLETION_FORMATS:
        raise ValueError(f"completions export writes {COMPLETION_FORMATS}, not {path.suffix!r}.")
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps(record, indent=2) if suffix == "json" else completions_text(record)
    path.write_text(body + "\n", encoding="utf-8")
    return path


def completions_button(
    record: Callable[[], dict[str, Any] | None],
    path_stem: str | Path | Callable[[], str | Path],
) -> widgets.HBox:
    """A (format, button, status) row writing ``{path_stem}.{format}`` from ``record()``.

    ``path_stem`` may be a function, called at each click for a fresh name.
    """
    fmt = widgets.Dropdown(
        options=list(COMPLETION_FORMATS), value="json", layout=widgets.Layout(width="6em")
    )
    button = widgets.Button(description="Export text", icon="download")
    status = widgets.Label(value="")

    def on_click(_: widgets.Button) -> None:
        current = record()
        if current is None:
            status.value = "nothing generated yet"
            return
        try:
            stem = path_stem() if callable(path_stem) else path_stem
            status.value = f"saved {write_completions(current, f'{stem}.{fmt.value}')}"
        except (OSError, ValueError) as error:
            status.value = f"failed: {error}"

    button.on_click(on_click)
    return widgets.HBox([fmt, button, status])
