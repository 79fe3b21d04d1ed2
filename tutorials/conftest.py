"""Settings for the notebook kernels that nbval starts (they inherit this environment).

Offline: the tutorials use the embedded ``steerlab-tiny`` and must never reach the hub.
pytest reads this file when ``tutorials`` is collected; ``make test`` collects
``tutorials`` and ``notebooks`` in one run, so the settings hold for both folders.
"""

from __future__ import annotations

import os

KERNEL_ENV = {
    "HF_HUB_OFFLINE": "1",  # no hub requests, even for a name that looks like a hub id
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",  # lm-eval's local tasks (tutorial 9) read JSON files only
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",  # no fork warning from the tokenizers thread pool
    "TQDM_DISABLE": "1",  # no progress bars in checked outputs (tqdm reads TQDM_* defaults)
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}
for name, value in KERNEL_ENV.items():
    os.environ.setdefault(name, value)  # kernels started later inherit it
