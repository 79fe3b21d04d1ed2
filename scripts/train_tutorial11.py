"""Train the steers tutorial 11 loads, and write them beside it in tutorials/trained/.

    .venv/bin/python scripts/train_tutorial11.py

Training both on a 2-core CPU takes longer than a tutorial under nbval may run, so the
tutorial loads what this script writes (with the same data and settings it shows): a BiPO
vector (``happy.bipo.safetensors``), a LoReFT (``sea.reft.safetensors``) and each run's
``History`` as JSON. CPU training is deterministic: the same seed writes the same tensors.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import steerlab as sl

OUT = Path(__file__).resolve().parents[1] / "tutorials" / "trained"
NAMES = ["Mia", "Tom", "Lily", "Ben", "Sam", "Anna", "Max", "Rosa", "Leo", "Ella", "Finn", "Nora"]
ANIMALS = ["fox", "bear", "rabbit", "mouse", "cat", "dog", "pig", "goat"]
HAPPY = [("smiled", "happy"), ("laughed", "glad"), ("sang", "cheerful")]
SAD = [("cried", "sad"), ("frowned", "scared"), ("sighed", "lonely")]
FOREST = ["forest", "woods", "grove", "glade", "trail", "thicket"]
SEA = ["sea", "beach", "shore", "ocean", "harbor", "bay", "coast"]
WAVES = ["The waves rolled over the sand", "The tide rose on the shore",
         "The gulls flew over the water", "The boats rocked in the harbor"]  # fmt: skip
BIPO = dict(site="blocks.2.hook_resid_pre", epochs=10, lr=2e-2, batch_size=16, seed=0)
REFT = dict(site="blocks.2.hook_resid_post", rank=4, positions="first:3+last:3", epochs=8,
            lr=1e-2, seed=0)  # fmt: skip


def happy_vs_sad(n: int = 48) -> list[sl.Preference]:
    """Preference pairs that differ only in the sentiment words."""
    pairs = []
    for i in range(n):
        name, (hv, hf), (sv, sf) = NAMES[i % 12], HAPPY[i % 3], SAD[i % 3]
        prompt = f"Once upon a time, there was a {ANIMALS[i % 8]} named {name}."
        pairs.append(sl.Preference(prompt, f" {name} {hv} and felt {hf}.",
                                   f" {name} {sv} and felt {sf}."))  # fmt: skip
    return pairs


def forest_to_sea(n: int = 48) -> list[sl.Example]:
    """Forest openings, each continued at the sea."""
    return [sl.Example(f"One day, {NAMES[i % 12]} the {ANIMALS[i % 8]} went to the "
                       f"{FOREST[i % 6]}.",
                       f" {WAVES[i % 4]}, and {NAMES[i % 12]} walked along the {SEA[i % 7]}.")
            for i in range(n)]  # fmt: skip


def main() -> None:
    lm = sl.load("steerlab-tiny")
    OUT.mkdir(exist_ok=True)
    start = time.perf_counter()
    vec, bipo_history = sl.train.bipo(lm, happy_vs_sad(), **BIPO, progress=False)
    print(f"bipo: {time.perf_counter() - start:.1f} s, {bipo_history}")
    start = time.perf_counter()
    reft, reft_history = sl.train.reft(lm, forest_to_sea(), **REFT, progress=False)
    print(f"reft: {time.perf_counter() - start:.1f} s, {reft_history}")
    vec.save(OUT / "happy.bipo.safetensors")
    reft.save(OUT / "sea.reft.safetensors")
    for name, history in (("happy.bipo", bipo_history), ("sea.reft", reft_history)):
        record = dataclasses.asdict(history)
        (OUT / f"{name}.history.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
