"""A small table for notebooks: aligned text, an HTML table, and ``to_pandas``.

Columns that come with ``<name>_low`` and ``<name>_high`` siblings in the records are shown
as one cell, ``value [low, high]``: the estimate with its confidence interval.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Table:
    """Records (plain dicts) shown by ``columns``; ``formats`` maps a column to a format spec,
    and ``missing`` is what a NaN shows as (the records keep the NaN).

    >>> Table("demo", ["a", "b"], [{"a": 1.0, "b": 2.0, "b_low": 1.5, "b_high": 2.5}])
    demo
      a             b
      1  2 [1.5, 2.5]
    """

    title: str
    columns: Sequence[str]
    records: list[dict[str, Any]]
    formats: Mapping[str, str] = field(default_factory=dict)
    missing: str = "nan"

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.records[i]

    def to_pandas(self) -> Any:
        """The records, intervals as ``_low``/``_high`` columns (pandas must be installed)."""
        import pandas as pd

        return pd.DataFrame.from_records(self.records)

    def _cell(self, record: Mapping[str, Any], column: str) -> str:
        value = record.get(column, "")
        if not isinstance(value, float):
            return str(value)
        if math.isnan(value):
            return self.missing
        spec = self.formats.get(column, ".3g")
        low, high = record.get(f"{column}_low"), record.get(f"{column}_high")
        if low is None or high is None or math.isnan(low):
            return format(value, spec)
        return f"{value:{spec}} [{low:{spec}}, {high:{spec}}]"

    def _rows(self) -> list[list[str]]:
        return [[self._cell(r, c) for c in self.columns] for r in self.records]

    def __repr__(self) -> str:
        rows = [list(self.columns), *self._rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self.columns))]
        lines = [self.title]
        lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in self._rows()
        )
        return (f"<b>{html.escape(self.title)}</b><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>")  # fmt: skip
