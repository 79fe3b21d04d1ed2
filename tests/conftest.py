"""Shared fixtures: tiny random models on every backend, built from configs."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import BACKENDS, load_tiny  # noqa: E402

import steerlab as sl  # noqa: E402
from steerlab.testing import save_tiny  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--stress-count", type=int, default=20,
                     help="iterations of the random-interrupt stress test")  # fmt: skip


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, str]:
    """Local HF-format folders of a tiny random GPT-2 and Llama."""
    root = tmp_path_factory.mktemp("tiny")
    return {fam: str(save_tiny(root / fam, fam)) for fam in ("gpt2", "llama")}


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def lm(tiny_dirs, backend) -> sl.SteerableModel:
    """A tiny GPT-2 on each backend."""
    return load_tiny(tiny_dirs, "gpt2", backend)


@pytest.fixture(scope="session")
def toy_hf():
    """steerlab-tiny's weights in plain transformers: the independent reference."""
    from transformers import AutoModelForCausalLM

    from steerlab.toy import asset_path

    path = asset_path("steerlab-tiny")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def toy_lm() -> sl.SteerableModel:
    """steerlab-tiny on the hf backend, shared by the tests that only read it."""
    return sl.load("steerlab-tiny", backend="hf")


@pytest.fixture
def direction() -> torch.Tensor:
    return torch.randn(64, generator=torch.Generator().manual_seed(1))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI, a skip is a failure: only tests that need a GPU may skip there."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and "gpu" not in item.keywords:
        report.outcome = "failed"
        report.longrepr = (
            f"skipped under CI, where everything but GPU tests must run: {report.longrepr}"
        )
