"""``make lab`` works in a git-ignored copy: running notebooks never changes the tracked ones."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_lab_copy_copies_every_notebook_once_and_keeps_the_users_edits(tmp_path):
    lab = tmp_path / "lab"
    tracked = sorted(
        p.relative_to(REPO) for d in ("tutorials", "notebooks") for p in (REPO / d).glob("*.ipynb")
    )
    before = {p: (REPO / p).read_bytes() for p in tracked}

    subprocess.run(["make", "-s", "lab-copy", f"LAB_DIR={lab}"], cwd=REPO, check=True)
    copies = sorted(p.relative_to(lab) for p in lab.rglob("*.ipynb"))
    assert copies == tracked
    trained = sorted(p.name for p in (REPO / "tutorials" / "trained").iterdir())
    assert sorted(p.name for p in (lab / "tutorials" / "trained").iterdir()) == trained
    assert all((lab / p).read_bytes() == before[p] for p in tracked)

    run = lab / tracked[0]
    run.write_text("{}")  # as if the user ran it and Lab saved outputs
    subprocess.run(["make", "-s", "lab-copy", f"LAB_DIR={lab}"], cwd=REPO, check=True)
    assert run.read_text() == "{}"  # a second make lab keeps the user's copy
    assert {p: (REPO / p).read_bytes() for p in tracked} == before


def test_the_default_lab_folder_is_git_ignored():
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "lab/tutorials/01_first_steering.ipynb"], cwd=REPO
    )
    assert ignored.returncode == 0
