"""Training steers on a frozen model: BiPO and RePS vectors, and LoReFT interventions.

``sl.train.bipo`` and ``sl.train.reft`` run through the engine (its call guard, the
backend's forward with gradients) on the hf, hooked and bridge backends; the model's
weights are never changed and no hook is left behind. What they return is a steer like any
other: a ``SteeringVector`` or an ``sl.LoReFT``.
"""

from steerlab.core.concepts import Example, Preference, preference_pairs
from steerlab.train.bipo import bipo, bipo_loss
from steerlab.train.loop import History, TrainingError
from steerlab.train.reft import reft
from steerlab.train.reps import reps, reps_loss

__all__ = [
    "Example",
    "History",
    "Preference",
    "TrainingError",
    "bipo",
    "bipo_loss",
    "preference_pairs",
    "reft",
    "reps",
    "reps_loss",
]
