"""End to end on the toy: BiPO moves held-out neutral openings to happy, fluently; LoReFT
moves held-out forest openings to the sea. Each trains and scores on CPU within a minute."""

from __future__ import annotations

import steerlab as sl
from steerlab.toy import mean_concept_score, perplexity

NAMES = ["Mia", "Tom", "Lily", "Ben", "Sam", "Anna", "Max", "Rosa", "Leo", "Ella", "Finn", "Nora"]
ANIMALS = ["fox", "bear", "rabbit", "mouse", "cat", "dog", "pig", "goat"]
HELD_NAMES = ["Ava", "Ivy", "Kai", "Zoe", "Eli", "Mae", "Ray", "Sky"]  # never in training
HAPPY = [("smiled", "happy"), ("laughed", "glad"), ("sang", "cheerful")]
SAD = [("cried", "sad"), ("frowned", "scared"), ("sighed", "lonely")]
FOREST = ["forest", "woods", "grove", "glade", "trail", "thicket"]
SEA = ["sea", "beach", "shore", "ocean", "harbor", "bay", "coast"]
WAVES = ["The waves rolled over the sand", "The tide rose on the shore",
         "The gulls flew over the water", "The boats rocked in the harbor"]  # fmt: skip


def happy_vs_sad(n: int) -> list[sl.Preference]:
    """Pairs that differ only in the sentiment words."""
    pairs = []
    for i in range(n):
        name, (hv, hf), (sv, sf) = NAMES[i % 12], HAPPY[i % 3], SAD[i % 3]
        prompt = f"Once upon a time, there was a {ANIMALS[i % 8]} named {name}."
        pairs.append(sl.Preference(prompt, f" {name} {hv} and felt {hf}.",
                                   f" {name} {sv} and felt {sf}."))  # fmt: skip
    return pairs


def forest_to_sea(n: int) -> list[sl.Example]:
    return [sl.Example(f"One day, {NAMES[i % 12]} the {ANIMALS[i % 8]} went to the "
                       f"{FOREST[i % 6]}.",
                       f" {WAVES[i % 4]}, and {NAMES[i % 12]} walked along the {SEA[i % 7]}.")
            for i in range(n)]  # fmt: skip


def test_bipo_makes_neutral_openings_happy_and_stays_fluent(toy_lm):
    vec, history = sl.train.bipo(toy_lm, happy_vs_sad(48), site="blocks.2.hook_resid_pre",
                                 epochs=10, lr=2e-2, batch_size=16, seed=0, progress=False)  # fmt: skip
    assert history.loss[-1] < history.loss[0]
    held = [f"One day, {n} the {a} went for a walk." for n, a in zip(HELD_NAMES, ANIMALS)]
    options = {"max_new_tokens": 40, "temperature": 1.0, "seed": 1}
    plain = toy_lm.generate(held, **options).text
    steered = toy_lm.generate(held, steer=vec * 3.5, **options).text
    assert mean_concept_score(plain) < 0.7
    assert mean_concept_score(steered) >= 0.9
    assert perplexity(toy_lm, held, steered) <= 2 * perplexity(toy_lm, held, plain)
    against = toy_lm.generate(held, steer=vec * -3, **options).text
    assert mean_concept_score(against) <= 0.1  # bi-directional: -v is sad


def test_loreft_continues_held_out_forest_openings_at_the_sea(toy_lm):
    reft, history = sl.train.reft(toy_lm, forest_to_sea(48), site="blocks.2.hook_resid_post",
                                  rank=4, positions="first:3+last:3", epochs=8, lr=1e-2,
                                  seed=0, progress=False)  # fmt: skip
    assert history.loss[-1] < history.loss[0] / 2
    held = [f"One day, {n} the {a} went to the {f}."
            for n, a, f in zip(HELD_NAMES, ANIMALS, FOREST + FOREST)]  # fmt: skip
    plain = toy_lm.generate(held, max_new_tokens=40).text
    steered = toy_lm.generate(held, steer=reft, max_new_tokens=40).text
    assert mean_concept_score(plain, "setting") < 0.2
    assert mean_concept_score(steered, "setting") >= 0.9
