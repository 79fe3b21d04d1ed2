"""Whole saves: a file or a folder is replaced only once its new content is all on disk.

Both write beside the target (same filesystem, so the final rename is atomic) and clean up
after any failure, Ctrl-C included, so an earlier file or folder stays as it was.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO


def write_file(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it over ``path``.

    >>> write_file(Path("v.bin"), b"abc"); Path("v.bin").read_bytes()
    b'abc'
    """
    handle, temporary = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.",
                                         suffix=".tmp")  # fmt: skip
    try:
        with os.fdopen(handle, "wb") as f:
            _write(f, data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_folder(folder: Path, files: Mapping[str, bytes]) -> None:
    """Make ``folder`` hold ``files`` (name -> bytes), replacing it whole if it exists.

    The new folder is built beside the old one; anything else the old one holds is copied
    into it, so only the named files change. Then the old folder is renamed aside, the
    new one renamed in, and the old one removed. If the swap fails, the old folder is put
    back; either way no half-written folder is left.

    >>> write_folder(Path("my-sae"), {"cfg.json": b"{}"}); sorted(p.name for p in Path("my-sae").iterdir())
    ['cfg.json']
    """
    folder = folder.resolve()  # a symlinked folder is replaced where it points
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".tmp"))
    try:
        for name, data in files.items():
            with (staging / name).open("wb") as f:
                _write(f, data)
        if folder.exists():
            _copy_others(folder, staging, set(files))
        _swap(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _write(f: BinaryIO, data: bytes) -> None:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


def _copy_others(folder: Path, staging: Path, names: set[str]) -> None:
    for entry in folder.iterdir():
        if entry.name in names:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, staging / entry.name, symlinks=True)
        else:
            shutil.copy2(entry, staging / entry.name, follow_symlinks=False)


def _swap(staging: Path, folder: Path) -> None:
    if not folder.exists():
        os.rename(staging, folder)
        return
    aside = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.", suffix=".old"))
    os.rmdir(aside)  # only its unique name is wanted
    os.rename(folder, aside)
    try:
        os.rename(staging, folder)
    except BaseException:
        os.rename(aside, folder)
        raise
    shutil.rmtree(aside, ignore_errors=True)
