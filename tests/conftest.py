"""Shared fixtures: tiny random models on every backend, built from configs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import BACKENDS, load_tiny  # noqa: E402

import steerlab as sl  # noqa: E402
from steerlab.testing import save_tiny  # noqa: E402

# `make test-fast` runs these modules: the core, the engines (eager), the server and vectors.
# Every other module here is marked slow; a slow test inside one of these is marked by hand.
FAST_MODULES = frozenset({
    # core: values, ops, sampling, errors, inputs, hooks
    "test_bad_inputs", "test_bad_inputs_31", "test_core_inputs", "test_errors", "test_hooks",
    "test_imports", "test_op_base", "test_penalties", "test_sampling", "test_steering",
    "test_values", "test_window",
    # engines (eager) and loading
    "test_batching", "test_concurrency", "test_convert", "test_engine", "test_engine_parity",
    "test_engine_scoring", "test_loading", "test_loading_errors", "test_load_check",
    "test_loop", "test_parity", "test_prefix", "test_scheduler",
    # server
    "test_server", "test_server_concurrency", "test_server_connections", "test_server_fields",
    "test_server_presets", "test_server_scoring", "test_server_stop", "test_server_stream",
    "test_server_tokens",
    # vectors
    "test_extract", "test_named_vectors", "test_vector_io", "test_vectors",
})  # fmt: skip
HERE = Path(__file__).parent


def _skips_slow(config) -> bool:
    """Whether ``-m`` is a chain of ``and`` terms, one of them ``not slow``."""
    expr = config.option.markexpr or ""
    terms = [term.strip(" ()") for term in expr.split(" and ")]
    return " or " not in expr and "not slow" in terms


def pytest_ignore_collect(collection_path, config):
    """Under ``-m "not slow"`` a slow module is not imported at all: importing every test
    module costs ``make test-fast`` about ten seconds of its ninety."""
    if collection_path.parent != HERE or not _skips_slow(config):
        return None
    if collection_path.is_dir():
        return True  # tests/browser: all slow
    name = collection_path.name
    return True if name.startswith("test_") and collection_path.stem not in FAST_MODULES else None


# The modules whose point is the backends themselves run every backend in make test-fast;
# elsewhere the fast set runs the hf backend, and make test all three.
BACKEND_MODULES = frozenset({"test_parity", "test_loading", "test_loading_errors", "test_convert"})


def pytest_collection_modifyitems(config, items):
    """Mark slow every test under tests/ outside ``FAST_MODULES`` (new modules start slow),
    and, outside ``BACKEND_MODULES``, the runs of a test on the hooked and bridge backends."""
    for item in items:
        if HERE not in item.path.parents:
            continue
        module = item.path.stem
        other = module not in BACKEND_MODULES and _other_backend(item)
        if module not in FAST_MODULES or other:
            item.add_marker(pytest.mark.slow)


def _other_backend(item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("backend") in ("hooked", "bridge")


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


@pytest.fixture(scope="session")
def lm_eval_tasks(tmp_path_factory) -> Iterator[Path]:
    """The toy world's lm-eval tasks in one folder for the session, and one lm-eval
    ``TaskManager`` per set of arguments: making one reads every task file lm-eval ships
    (some 15,000, seconds each time), so the session's lm-eval runs share it, as one
    ``lm_eval`` command does. Skips without lm-eval."""
    pytest.importorskip("lm_eval")
    import lm_eval.tasks

    from steerlab.toy.tasks import lm_eval_tasks as write_tasks

    real, made = lm_eval.tasks.TaskManager, {}

    def shared(*args, **kwargs):
        key = repr((args, sorted(kwargs.items())))
        if key not in made:
            made[key] = real(*args, **kwargs)
        return made[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lm_eval.tasks, "TaskManager", shared)
        yield write_tasks(tmp_path_factory.mktemp("tasks"))


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
