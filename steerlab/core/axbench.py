"""AxBench's released concept data, read as plain rows (``ConceptData.from_axbench`` builds on it).

AxBench (Wu et al., 2025) releases each dataset as a folder such as
``concept500/prod_2b_l10_v1``:

- ``generate/metadata.jsonl``: one concept a line, ``{"concept_id", "concept", "ref",
  "concept_genres_map": {concept: [genre, ...]}}``;
- ``generate/train_data.parquet`` (and ``train_data_<k>.parquet`` where a dataset is split):
  columns ``input``, ``output``, ``output_concept``, ``concept_genre``, ``category``,
  ``dataset_category``, ``concept_id``. A concept's rows are ``category == "positive"`` with
  its ``concept_id``; the negatives are shared by every concept: ``category == "negative"``,
  ``concept_id == -1``, ``output_concept == "EEEEE"``, 72 for each genre (text, math, code);
- ``inference/latent_eval_data.parquet``: held-out detection rows (positive, negative and
  hard negative for each concept), which ``ConceptData`` has no field for.

AxBench trains a concept on its positives against the shared negatives of the concept's
genre, its first genre in ``concept_genres_map`` (``axbench/scripts/train.py``,
``prepare_df``); this reader selects the same rows. pandas and pyarrow read the parquet
files (the ``axbench`` extra), imported only here.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steerlab.core.errors import SteerError
from steerlab.core.scalars import as_int

EMPTY_CONCEPT = "EEEEE"  # AxBench's output_concept of the shared negatives
COLUMNS = ("input", "output", "output_concept", "concept_genre", "category", "concept_id")


@dataclass(frozen=True)
class AxBenchConcept:
    """One concept's rows from an AxBench folder, in file order."""

    concept: str
    concept_id: int
    genre: str
    inputs: list[str]  # the positive rows' inputs
    positives: list[str]  # the positive rows' outputs
    negatives: list[str]  # the shared negatives of the concept's genre


def read_concept(path: str | os.PathLike[str], concept: str | None = None,
                 concept_id: int | None = None) -> AxBenchConcept:  # fmt: skip
    """The rows of one concept, chosen by ``concept`` (its description) or ``concept_id``.

    Raises:
        SteerError: both or neither of ``concept`` and ``concept_id``, a folder without
            AxBench's files, an unknown concept (naming the closest ones), a concept with
            no positive rows or no negatives of its genre.
    """
    if (concept is None) == (concept_id is None):
        raise SteerError("from_axbench needs exactly one of concept= (its description) and "
                         f"concept_id=; got concept={concept!r}, concept_id={concept_id!r}.")  # fmt: skip
    if concept is not None and (not isinstance(concept, str) or not concept.strip()):
        raise SteerError(f"concept must be a non-empty string; got {concept!r:.60}.")
    if concept_id is not None and as_int(concept_id) is None:
        raise SteerError(f"concept_id must be an int; got {concept_id!r}.")
    if not isinstance(path, (str, os.PathLike)):
        raise SteerError(f"path must be a folder path; got {type(path).__name__}.")
    folder = Path(path)
    meta_path, train_paths = folder / "generate" / "metadata.jsonl", _train_files(folder)
    if not meta_path.is_file() or not train_paths:
        raise SteerError(f"path {str(folder)!r} is not an AxBench dataset folder: it needs "
                         "generate/metadata.jsonl and generate/train_data.parquet (AxBench's "
                         "released layout, such as concept500/prod_2b_l10_v1).")  # fmt: skip
    meta = _metadata(meta_path)
    entry = _find(meta, concept, None if concept_id is None else int(concept_id), meta_path)
    name, cid = entry["concept"], int(entry["concept_id"])
    genre = entry["concept_genres_map"][name][0]
    frame = _frame(train_paths)
    pos = frame[(frame["category"] == "positive") & (frame["concept_id"] == cid)]
    neg = frame[(frame["category"] == "negative") & (frame["output_concept"] == EMPTY_CONCEPT)
                & (frame["concept_genre"] == genre)]  # fmt: skip
    if len(pos) == 0:
        raise SteerError(f"The AxBench folder {str(folder)!r} has no positive rows for concept "
                         f"{cid} ({name!r}).")  # fmt: skip
    if len(neg) == 0:
        raise SteerError(f"The AxBench folder {str(folder)!r} has no shared negatives of genre "
                         f"{genre!r} (category 'negative', output_concept {EMPTY_CONCEPT!r}).")  # fmt: skip
    return AxBenchConcept(name, cid, genre, list(pos["input"]), list(pos["output"]),
                          list(neg["output"]))  # fmt: skip


def _train_files(folder: Path) -> list[Path]:
    """``train_data.parquet`` first, then ``train_data_<k>.parquet`` by k (AxBench's order)."""
    generate = folder / "generate"
    if not generate.is_dir():
        return []
    found = [p for p in generate.glob("train_data*.parquet") if "combined" not in p.name]
    if not any(p.name == "train_data.parquet" for p in found):
        return []

    def order(p: Path) -> int:
        tail = p.stem.removeprefix("train_data").removeprefix("_")
        return int(tail) if tail.isdigit() else -1

    return sorted(found, key=order)


def _metadata(path: Path) -> list[dict[str, Any]]:
    entries = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                entry["concept_genres_map"][entry["concept"]][0]  # noqa: B018 (checked here)
                int(entry["concept_id"])
            except (ValueError, KeyError, IndexError, TypeError) as error:
                raise SteerError(f"{path}:{number} is not an AxBench metadata line (concept_id, "
                                 f"concept, concept_genres_map): {error}.") from None  # fmt: skip
            entries.append(entry)
    return entries


def _find(meta: list[dict[str, Any]], concept: str | None, concept_id: int | None,
          path: Path) -> dict[str, Any]:  # fmt: skip
    if concept_id is not None:
        for entry in meta:
            if int(entry["concept_id"]) == concept_id:
                return entry
        ids = sorted(int(e["concept_id"]) for e in meta)
        span = f"{ids[0]} to {ids[-1]}" if ids else "none"
        raise SteerError(f"concept_id {concept_id} is not in {path} (its ids: {span}).")
    for entry in meta:
        if entry["concept"] == concept:
            return entry
    names = [e["concept"] for e in meta]
    close = difflib.get_close_matches(str(concept), names, n=3, cutoff=0.0)
    raise SteerError(f"concept {concept!r} is not in {path}; the closest are {close}.")


def _frame(paths: list[Path]) -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise SteerError("Reading AxBench's parquet files needs pandas and pyarrow: "
                         "pip install 'steerlab[axbench]'.") from None  # fmt: skip
    frames = []
    for path in paths:
        try:
            frame = pd.read_parquet(path, columns=list(COLUMNS))
        except ImportError:
            raise SteerError("Reading AxBench's parquet files needs pyarrow: "
                             "pip install 'steerlab[axbench]'.") from None  # fmt: skip
        except (KeyError, ValueError) as error:  # a column missing
            raise SteerError(f"{path} lacks AxBench's columns {list(COLUMNS)}: {error}") from None
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)
