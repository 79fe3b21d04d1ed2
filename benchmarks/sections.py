"""Sections of ``RESULTS.md`` that each benchmark owns: rewritten in place, never the rest."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).parent / "RESULTS.md"


def replace_section(lines: list[str], path: Path = RESULTS) -> None:
    """Put ``lines`` (starting with their ``## `` heading) in ``path``: in place of the
    section with that heading, up to the next ``## `` heading, or at the end."""
    heading = lines[0]
    text = path.read_text() if path.exists() else ""
    block = "\n".join(lines).rstrip("\n") + "\n"
    if heading in text:
        start = text.index(heading)
        end = text.find("\n## ", start + len(heading))
        rest = "" if end < 0 else text[end + 1 :]
        text = text[:start] + block + ("\n" + rest if rest else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


def table(rows: list[dict[str, object]], digits: int = 2) -> list[str]:
    """Benchmark rows (``comparison``, ``ours_s``, ``baseline_s``, ``ratio``, ``target``, and
    optionally ``load``, the load average beside the figure) as a markdown table."""
    load = any("load" in r for r in rows)
    extra = (" load |", "---|") if load else ("", "")
    return [
        "| comparison | ours (s) | baseline (s) | ratio | target |" + extra[0],
        "|---|---|---|---|---|" + extra[1],
        *(
            f"| {r['comparison']} | {r['ours_s']:.{digits}f} | {r['baseline_s']:.{digits}f} | "
            f"{r['ratio']:.2f} | {r['target']} |"
            + (f" {r.get('load', float('nan')):.2f} |" if load else "")
            for r in rows
        ),  # fmt: skip
    ]
