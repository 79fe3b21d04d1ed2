"""The namespace of the docstring examples (``pytest --doctest-modules steerlab``).

Every example may use ``sl`` (steerlab), ``torch`` and ``lm``, the toy model
``sl.load("steerlab-tiny")``, loaded once per session. This file sits at the repository
root, outside the package, so it is never part of ``import steerlab`` or the wheel.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from _pytest.doctest import DoctestItem  # noqa: E402

import steerlab as sl  # noqa: E402


@pytest.fixture(scope="session")
def _doctest_lm() -> sl.SteerableModel:
    return sl.load("steerlab-tiny")


@pytest.fixture(autouse=True)
def _doctest_names(request: pytest.FixtureRequest, doctest_namespace: dict) -> None:
    """For doctest items only (other tests never load the toy here): fill the namespace,
    and run in a fresh folder, so examples that write files leave none behind."""
    if not isinstance(request.node, DoctestItem):
        return
    doctest_namespace.update(sl=sl, torch=torch, lm=request.getfixturevalue("_doctest_lm"))
    request.getfixturevalue("monkeypatch").chdir(request.getfixturevalue("tmp_path"))
