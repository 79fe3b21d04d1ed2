"""Train the steers tutorial 12 loads, and write them beside it in tutorials/trained/.

    .venv/bin/python scripts/train_tutorial12.py            # all four
    .venv/bin/python scripts/train_tutorial12.py reps       # one of them

Tutorial 12 ranks eight methods on the toy's two concepts. Four of them train (BiPO, RePS,
LoReFT, RePS-LoReFT), which on a 2-core CPU takes minutes, longer than a tutorial under
nbval may run; this script trains them on ``steerlab.toy.concept_data``, the data the tutorial shows,
with the benchmark's own defaults (``sl.evals.methods.BUILT_IN``; BiPO's are tutorial 11's
settings), and saves each as safetensors. CPU training is deterministic: the same seed writes
the same tensors.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import steerlab as sl
from steerlab.evals.methods import BUILT_IN
from steerlab.toy import concept_data

OUT = Path(__file__).resolve().parents[1] / "tutorials" / "trained"
SITE = "blocks.2.hook_resid_pre"
TRAINED = ("bipo", "reps", "reft", "reps_reft")


def path(concept: str, method: str) -> Path:
    return OUT / f"{concept}.{method}.safetensors"


def main(methods: list[str]) -> None:
    lm = sl.load("steerlab-tiny", backend="hf")
    OUT.mkdir(exist_ok=True)
    for concept in ("sentiment", "setting"):
        data = concept_data(concept, lm=lm)
        for method in methods or TRAINED:
            start = time.perf_counter()
            steer = BUILT_IN[method].make(lm, data, SITE)  # BiPO's defaults: tutorial 11's
            steer.save(path(concept, method))
            print(f"{concept} {method}: {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
