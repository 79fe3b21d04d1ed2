"""The vLLM suite: run by ``make test-vllm`` in ``.venv-vllm``. One toy engine for the toy and
server modules; the parallel modules start their own.

vLLM starts its engine in spawned processes, which inherit these settings. The KV cache is
kept small (1 GiB) for CI machines.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# The independent reference and the shared engine parity suite live beside the main tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

for name, value in {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_LOGGING_LEVEL": "WARNING",
}.items():
    os.environ.setdefault(name, value)


@pytest.fixture(scope="session")
def lm():
    """steerlab-tiny on vLLM compiled, with steering built in at every site (on a CPU the
    default is eager, and the default graph builds in none), one engine shared by the toy,
    server and parity modules."""
    import steerlab as sl

    # vLLM caches only full KV blocks, 128 tokens by default on CPU: smaller blocks let the
    # prefix-cache tests cache a prompt that fits the toy's 128-token window. Chunked
    # prefill off: every prompt in one forward, as a conditioned steer on the prompt needs
    # (tests_vllm/test_reads.py has an engine with it on).
    model = sl.load("steerlab-tiny", backend="vllm", max_model_len=128, graph="all",
                    vllm_args={"block_size": 32, "enable_chunked_prefill": False,
                               "enforce_eager": False})  # fmt: skip
    yield model
    model.engine.close()


@pytest.fixture(scope="session")
def eager():
    """The same engine run eagerly (``enforce_eager=True``): hooks on vLLM's modules, the
    reference for what the compiled engine runs uncompiled, and the other mode of ``each``."""
    import steerlab as sl

    model = sl.load("steerlab-tiny", backend="vllm", max_model_len=128,
                    vllm_args={"block_size": 32, "enable_chunked_prefill": False,
                               "enforce_eager": True})  # fmt: skip
    yield model
    model.engine.close()


@pytest.fixture(params=["compiled", "eager"])
def each(request):
    """Each mode's engine in turn."""
    return request.getfixturevalue("lm" if request.param == "compiled" else "eager")


@pytest.fixture(scope="session")
def hf():
    """The same weights in plain transformers, for the independent reference."""
    from transformers import AutoModelForCausalLM

    from steerlab.toy import asset_path

    return AutoModelForCausalLM.from_pretrained(
        asset_path("steerlab-tiny"), dtype=torch.float32
    ).eval()
