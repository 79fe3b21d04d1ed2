"""The vLLM suite: run by ``make test-vllm`` in ``.venv-vllm``, one engine per test module.

vLLM starts its engine in spawned processes, which inherit these settings. The KV cache is
kept small (1 GiB) for CI machines.
"""

from __future__ import annotations

import os

for name, value in {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_LOGGING_LEVEL": "WARNING",
}.items():
    os.environ.setdefault(name, value)
