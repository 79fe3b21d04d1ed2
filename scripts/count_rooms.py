"""Follow one steered, conditioned request from ``LocalEngine.stream`` to its steer's hook.

Prints the modules of ``steerlab`` ("rooms") the call enters, in order, from ``stream`` to
the first time a steer's hook runs, how many distinct rooms that is, and how many times
the call goes back to a room it had left; then the same less the calls of a value's own
``__hash__`` and ``__eq__`` (a steer's op or condition looked up as a dict key). Function entries only (``sys.setprofile``), the
toy model on the hf backend, greedy, two new tokens.

    .venv/bin/python scripts/count_rooms.py
"""

from __future__ import annotations

import sys

import torch

import steerlab as sl
from steerlab.core.request import Request, Sampling
from steerlab.core.steer import Steer


def main() -> None:
    lm = sl.load("steerlab-tiny", backend="hf")
    cond = sl.Condition("blocks.1.hook_resid_post", torch.ones(lm.d_model), threshold=-1e9)
    steer = Steer("blocks.2.hook_resid_pre", torch.ones(lm.d_model), 2.0, "all", when=cond)
    ids = tuple(lm.tokenizer.encode("Once upon a time"))
    requests = [Request(ids, (Steer.of(steer, 2.0),), Sampling(max_new_tokens=2))]
    trail: list[str] = []  # every function entered
    plain: list[str] = []  # less a value's own __hash__ / __eq__ (a dict key looked up)
    done = False

    def profile(frame, event, arg) -> None:  # noqa: ANN001
        nonlocal done
        if done or event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("steerlab."):
            return
        if not trail or trail[-1] != module:
            trail.append(module)
        if frame.f_code.co_name not in ("__hash__", "__eq__") and (
            not plain or plain[-1] != module
        ):
            plain.append(module)
        if module == "steerlab.engine.local.steering" and frame.f_code.co_name == "apply":
            done = True

    sys.setprofile(profile)
    try:
        steps = lm.engine.stream(requests, description="rooms")
        next(iter(steps))
    finally:
        sys.setprofile(None)
    print(" -> ".join(m.removeprefix("steerlab.") for m in trail))
    for what, rooms in (("every call", trail), ("less __hash__ / __eq__", plain)):
        seen: set[str] = set()
        back = 0
        for room in rooms:
            back += room in seen
            seen.add(room)
        print(f"{what}: {len(seen)} rooms, {back} returns to a room left before")


if __name__ == "__main__":
    main()
