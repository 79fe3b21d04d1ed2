"""A benchmark run's store: one SQLite database (WAL mode) in the run folder, and the steers
it made as safetensors files beside it.

Every piece is written the moment it exists, each batch of rows in one transaction: the
run's settings, each concept's and method's fingerprint, the steers, the prompting arms'
written prompts, the generations, the judge's raw ratings and replies, the detection rows.
A crash or SIGKILL loses only the piece in flight; the same call resumes from what is
here. Settings that differ from the stored ones are refused by name, so two runs are never
mixed in one folder. Without a folder the store lives in memory, so a run without ``run=``
takes the same path.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from steerlab.core.errors import SteerError
from steerlab.core.identity import ModelId
from steerlab.core.reft import LoReFT
from steerlab.vectors import SteeringVector

DATABASE = "run.sqlite"
STEERS = "steers"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS concepts (name TEXT PRIMARY KEY, position INTEGER NOT NULL,
    fingerprint TEXT NOT NULL, instructions TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS methods (name TEXT PRIMARY KEY, position INTEGER NOT NULL,
    fingerprint TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS prompts (method TEXT, concept TEXT, prompt TEXT NOT NULL,
    PRIMARY KEY (method, concept));
CREATE TABLE IF NOT EXISTS steers (method TEXT, concept TEXT, file TEXT,
    PRIMARY KEY (method, concept));
CREATE TABLE IF NOT EXISTS generations (method TEXT, concept TEXT, row INTEGER,
    factor REAL NOT NULL, instruction_index INTEGER NOT NULL, model_input TEXT NOT NULL,
    text TEXT NOT NULL, PRIMARY KEY (method, concept, row));
CREATE TABLE IF NOT EXISTS ratings (method TEXT, concept TEXT, row INTEGER,
    concept_rating REAL, instruction_rating REAL, fluency_rating REAL, replies TEXT,
    PRIMARY KEY (method, concept, row));
CREATE TABLE IF NOT EXISTS detection (method TEXT, concept TEXT, auroc REAL, n INTEGER,
    PRIMARY KEY (method, concept));
"""

Cell = tuple[str, str]  # (method, concept)


def fingerprint(value: Any) -> str:
    """A short sha256 of a JSON-able value (keys sorted)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class RunStore:
    """The store of one run; ``RunStore(None)`` keeps it in memory.

    Safe to share between threads: every statement runs under one lock (the judge's
    workers write their ratings as each arrives).
    """

    def __init__(self, folder: str | Path | None) -> None:
        self.folder = None if folder is None else _folder(folder)
        target = ":memory:" if self.folder is None else str(self.folder / DATABASE)
        try:
            self._db = sqlite3.connect(target, check_same_thread=False, isolation_level=None)
            if self.folder is not None:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")  # WAL: a commit survives a crash
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as error:
            raise SteerError(f"run={str(folder)!r} holds {DATABASE}, and it is not a benchmark "
                             f"run's database: {error}.") from None  # fmt: skip
        self._lock = threading.Lock()
        self._steers: dict[Cell, Any] = {}  # in memory: what a folder keeps as files

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- settings ------------------------------------------------------------------------

    def check_settings(self, settings: dict[str, Any]) -> None:
        """Store ``settings`` on a new run; refuse one that differs from the stored, naming
        the setting."""
        stored = dict(self._query("SELECT key, value FROM settings"))
        if not stored:
            self._write("INSERT INTO settings VALUES (?, ?)",
                        [(k, json.dumps(v, sort_keys=True)) for k, v in settings.items()])  # fmt: skip
            return
        model = json.loads(stored.get("model", "{}"))
        mine, theirs = ModelId(**settings["model"]), ModelId(**model)
        why = mine.difference(theirs)
        if why is not None:
            raise SteerError(f"run={self._name()} holds a run of the model {theirs.name!r}, and "
                             f"this model is {mine.name!r} ({why}); give another run folder.")  # fmt: skip
        for key, value in settings.items():
            if key != "model" and stored.get(key) != json.dumps(value, sort_keys=True):
                raise SteerError(f"run={self._name()} holds a run with {key}="
                                 f"{_short(stored.get(key))}, and this call has {key}="
                                 f"{_short(json.dumps(value, sort_keys=True))}. Call again with "
                                 "the run's own settings to resume it, or give another run "
                                 "folder.")  # fmt: skip

    def settings(self) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self._query("SELECT key, value FROM settings")}

    def check_parts(self, table: str, parts: Sequence[tuple[str, int, Any]],
                    what: str) -> None:  # fmt: skip
        """Each concept's (or method's) fingerprint, with its place in the call's list: a
        new one is added, a known name with other content refused."""
        assert table in ("concepts", "methods")
        stored = {name: mark for name, (_, mark) in self.fingerprints(table).items()}
        new = []
        for name, position, content in parts:
            mark = fingerprint(content)
            if name in stored and stored[name] != mark:
                raise SteerError(f"run={self._name()} holds {what} {name!r} with other "
                                 f"{'data' if table == 'concepts' else 'settings'} than this "
                                 f"call's; give it another name, or another run folder.")  # fmt: skip
            if name not in stored:
                extra = (json.dumps(content["instructions"]),) if table == "concepts" else ()
                new.append((name, position, mark, *extra))
        marks = ", ".join("?" * (4 if table == "concepts" else 3))
        self._write(f"INSERT INTO {table} VALUES ({marks})", new)

    def fingerprints(self, table: str) -> dict[str, tuple[int, str]]:
        """name -> (place in the list it came in, fingerprint), of concepts or methods."""
        assert table in ("concepts", "methods")
        rows = self._query(f"SELECT name, position, fingerprint FROM {table}")
        return {name: (position, mark) for name, position, mark in rows}

    def concepts(self) -> list[tuple[str, list[str]]]:
        """Every stored concept, in the order they came: (name, instructions)."""
        rows = self._query("SELECT name, instructions FROM concepts ORDER BY position, rowid")
        return [(name, json.loads(instructions)) for name, instructions in rows]

    def methods(self) -> list[str]:
        rows = self._query("SELECT name FROM methods ORDER BY position, rowid")
        return [name for (name,) in rows]

    # -- prompts and steers --------------------------------------------------------------

    def prompt(self, cell: Cell) -> str | None:
        rows = self._query("SELECT prompt FROM prompts WHERE method=? AND concept=?", cell)
        return rows[0][0] if rows else None

    def put_prompt(self, cell: Cell, prompt: str) -> None:
        self._write("INSERT INTO prompts VALUES (?, ?, ?)", [(*cell, prompt)])

    def prompts(self) -> dict[Cell, str]:
        return {(m, c): p for m, c, p in self._query("SELECT * FROM prompts")}

    def has_steer(self, cell: Cell) -> bool:
        return cell in self._steers or bool(
            self._query("SELECT 1 FROM steers WHERE method=? AND concept=?", cell)
        )

    def steer(self, cell: Cell, model: Any = None) -> Any:
        """The steer stored for ``cell`` (None for prompting); a KeyError when none is."""
        if cell in self._steers:
            return self._steers[cell]
        rows = self._query("SELECT file FROM steers WHERE method=? AND concept=?", cell)
        if not rows:
            raise KeyError(cell)
        (file,) = rows[0]
        if file is None:
            return None
        assert self.folder is not None
        path = self.folder / file
        steer = LoReFT.load(path, model=model) if LoReFT.is_file(path) \
            else SteeringVector.load(path, model=model)  # fmt: skip
        self._steers[cell] = steer
        return steer

    def put_steer(self, cell: Cell, steer: Any) -> bool:
        """Keep the steer: a ``SteeringVector`` or ``LoReFT`` as a file, recorded once it is
        whole. Returns False for a steer no file holds (a ``Steer`` or a list of them): it
        is kept in memory for this call, and made again on a resume."""
        self._steers[cell] = steer
        if steer is None:
            self._write("INSERT INTO steers VALUES (?, ?, NULL)", [cell])
            return True
        if self.folder is None:
            self._write("INSERT INTO steers VALUES (?, ?, NULL)", [cell])
            return True
        if not isinstance(steer, (SteeringVector, LoReFT)):
            return False
        name = f"{_slug(cell[0])}.{_slug(cell[1])}.{fingerprint(list(cell))[:8]}"
        file = f"{STEERS}/{name}.{'reft.' if isinstance(steer, LoReFT) else ''}safetensors"
        (self.folder / STEERS).mkdir(exist_ok=True)
        part = self.folder / STEERS / f".{name}.part.safetensors"  # renamed once whole
        steer.save(part)  # the project's own files: LoReFT's or a vector's safetensors
        part.replace(self.folder / file)
        self._write("INSERT INTO steers VALUES (?, ?, ?)", [(*cell, file)])
        return True

    # -- generations, ratings, detection -------------------------------------------------

    def generations(self, cell: Cell) -> list[tuple[int, float, int, str, str]]:
        """(row, factor, instruction index, model input, text), in row order."""
        return self._query("SELECT row, factor, instruction_index, model_input, text FROM "
                           "generations WHERE method=? AND concept=? ORDER BY row", cell)  # fmt: skip

    def put_generations(self, cell: Cell,
                        rows: Iterable[tuple[int, float, int, str, str]]) -> None:  # fmt: skip
        self._write("INSERT INTO generations VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(*cell, *row) for row in rows])  # fmt: skip

    def ratings(self, cell: Cell) -> dict[int, tuple[tuple[Any, Any, Any], Any]]:
        """row -> (the judge's three raw ratings, None where unreadable; its replies or None)."""
        rows = self._query("SELECT row, concept_rating, instruction_rating, fluency_rating, "
                           "replies FROM ratings WHERE method=? AND concept=?", cell)  # fmt: skip
        return {r: ((c, i, f), None if replies is None else json.loads(replies))
                for r, c, i, f, replies in rows}  # fmt: skip

    def put_rating(self, cell: Cell, row: int, values: Sequence[float | None],
                   replies: Sequence[str] | None) -> None:  # fmt: skip
        text = None if replies is None else json.dumps(list(replies))
        self._write("INSERT INTO ratings VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(*cell, row, *values, text)])  # fmt: skip

    def detected(self, cell: Cell) -> bool:
        return bool(self._query("SELECT 1 FROM detection WHERE method=? AND concept=?", cell))

    def put_detection(self, rows: Iterable[tuple[str, str, float | None, int | None]]) -> None:
        """Detection rows; auroc None marks a cell whose steer has no one direction."""
        self._write("INSERT INTO detection VALUES (?, ?, ?, ?)", list(rows))

    def detection(self) -> list[tuple[str, str, float, int]]:
        return self._query("SELECT method, concept, auroc, n FROM detection WHERE auroc IS "
                           "NOT NULL")  # fmt: skip

    # -- the database --------------------------------------------------------------------

    def _query(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, tuple(args)).fetchall()

    def _write(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Every row in one transaction: all of them are stored, or none."""
        if not rows:
            return
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(sql, rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _name(self) -> str:
        return repr(str(self.folder))


def _folder(folder: str | Path) -> Path:
    if not isinstance(folder, (str, Path)) or not str(folder):
        raise SteerError(f"run must be a folder path; got {folder!r:.60}.")
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise SteerError(f"run={str(folder)!r} is a file, not a folder; a run keeps its "
                         "database and steers in a folder of its own.")  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    return path


def exists(folder: str | Path) -> bool:
    """Whether ``folder`` holds a run's database."""
    return (Path(folder) / DATABASE).is_file()


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name)[:40] or "x"


def _short(text: str | None) -> str:
    text = "(none)" if text is None else text
    return text if len(text) <= 80 else text[:77] + "..."
