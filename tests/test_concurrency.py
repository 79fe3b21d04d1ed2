"""One model, many callers: a call's hooks never act on another call's forward, and no fault
leaves a hook behind. Each race is placed at its exact point, so the tests are deterministic.
"""

from __future__ import annotations

import gc
import random
import sys
import threading

import pytest
import torch
from helpers import PROMPTS

import steerlab as sl
from steerlab.engine import CallInFlightError

SITE = "blocks.1.hook_resid_pre"


def test_a_paused_unsteered_stream_refuses_a_steered_call(lm, direction):
    plain = lm.generate(PROMPTS, max_new_tokens=4, stop_at_eos=False).tokens
    stream = lm.stream(PROMPTS, max_new_tokens=4, stop_at_eos=False)
    next(stream)
    with pytest.raises(CallInFlightError, match="stream of 3 rows"):
        lm.generate(PROMPTS, sl.Steer(SITE, direction, alpha=8.0), max_new_tokens=2)
    rest = list(stream)
    assert rest[-1].result().tokens == plain  # the paused stream was never steered
    assert lm.hook_count() == 0


def test_a_second_thread_is_refused_or_queues_and_never_steers_the_first(lm, direction):
    plain = lm.generate(PROMPTS, max_new_tokens=3, stop_at_eos=False).tokens
    inside, release = threading.Event(), threading.Event()

    def hold(*_):
        inside.set()
        release.wait(10)

    handle = lm.model.register_forward_pre_hook(hold)
    got: dict[str, object] = {}
    worker = threading.Thread(target=lambda: got.setdefault(
        "out", lm.generate(PROMPTS, max_new_tokens=3, stop_at_eos=False)))  # fmt: skip
    worker.start()
    try:
        assert inside.wait(10)  # the unsteered call is mid-forward in the other thread
        with pytest.raises(CallInFlightError, match="thread"):
            lm.generate(PROMPTS, sl.Steer(SITE, direction, alpha=8.0), max_new_tokens=2)
        handle.remove()
        release.set()
        queued = lm.generate(PROMPTS, sl.Steer(SITE, direction, alpha=8.0), max_new_tokens=2,
                             wait=10)  # fmt: skip
    finally:
        handle.remove()
        release.set()
        worker.join(10)
    assert got["out"].tokens == plain and len(queued.tokens) == 3
    assert lm.hook_count() == 0


def test_a_hook_ignores_forwards_that_are_not_its_calls(lm, direction):
    """The user's own forward while a steered stream is paused is not steered."""
    ids = torch.tensor([lm.tokenizer(PROMPTS[1])["input_ids"]]).to(lm.backend.input_device)
    mask = torch.ones_like(ids)
    before = lm.backend.forward(ids, mask, None)
    stream = lm.stream(PROMPTS, sl.Steer(SITE, direction, alpha=8.0), max_new_tokens=4)
    next(stream)
    during = lm.backend.forward(ids, mask, None)
    stream.close()
    torch.testing.assert_close(during, before, rtol=0, atol=0)


def test_amplify_holds_both_models(tiny_dirs, direction):
    after = sl.load(tiny_dirs["gpt2"], backend="hf")
    before = sl.load(tiny_dirs["llama"], backend="hf")
    before.tokenizer = after.tokenizer  # the tiny models share the char vocabulary
    lda = sl.amplify(after, before, beta=1.0)
    stream = before.stream(PROMPTS, sl.Steer(SITE, torch.ones(before.d_model), alpha=3.0),
                           max_new_tokens=4)  # fmt: skip
    next(stream)
    with pytest.raises(CallInFlightError):
        lda.generate(PROMPTS, max_new_tokens=2)
    stream.close()
    assert len(lda.generate(PROMPTS, max_new_tokens=2).tokens) == 3


class _Holder:
    """Keeps a stream in a reference cycle, as a callback referring back to its owner does."""


def test_a_stream_freed_by_the_cycle_collector_leaves_no_hook(lm, direction):
    holder = _Holder()
    holder.me = holder
    holder.stream = lm.stream(PROMPTS, sl.Steer(SITE, direction, alpha=3.0), max_new_tokens=5)
    next(holder.stream)
    assert lm.hook_count() == 1
    del holder
    gc.collect()
    assert lm.hook_count() == 0
    lm.generate(PROMPTS, sl.Steer(SITE, direction, alpha=1.0), max_new_tokens=2)


def _interrupt_after_registering(monkeypatch):
    """KeyboardInterrupt right after a hook is registered, before anyone records it."""
    for name in ("register_forward_hook", "register_forward_pre_hook"):
        real = getattr(torch.nn.Module, name)

        def patched(self, *args, _real=real, **kwargs):
            _real(self, *args, **kwargs)
            raise KeyboardInterrupt

        monkeypatch.setattr(torch.nn.Module, name, patched)


def test_ctrl_c_between_registering_and_recording_leaks_nothing(lm, direction, monkeypatch):
    _interrupt_after_registering(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        lm.generate(PROMPTS, sl.Steer(SITE, direction, alpha=3.0), max_new_tokens=2)
    monkeypatch.undo()
    assert lm.hook_count() == 0
    lm.generate(PROMPTS, max_new_tokens=2)


def test_a_second_ctrl_c_during_cleanup_still_removes_every_hook(lm, direction, monkeypatch):
    import steerlab.core.tagging as hooks

    real, calls = hooks._tagged, []

    def interrupted_once(module):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt  # the second Ctrl-C lands in the middle of the cleanup
        return real(module)

    def boom(act, direction, alpha):
        raise KeyboardInterrupt  # the first Ctrl-C, inside a hook

    monkeypatch.setattr(hooks, "_tagged", interrupted_once)
    steers = [sl.Steer(SITE, direction, alpha=1.0), sl.Steer(SITE, direction, 1.0, op=boom)]
    with pytest.raises(KeyboardInterrupt):
        lm.generate(PROMPTS, steers, max_new_tokens=2)
    monkeypatch.undo()
    assert lm.hook_count() == 0
    lm.generate(PROMPTS, max_new_tokens=2)


def test_remove_hooks_is_an_emergency_exit(lm, direction):
    stream = lm.stream(PROMPTS, sl.Steer(SITE, direction, alpha=3.0), max_new_tokens=5)
    next(stream)
    assert lm.remove_hooks() == 1 and lm.hook_count() == 0
    stream.close()


@pytest.mark.stress
def test_random_interrupts_never_leave_a_hook(lm, direction, request):
    """Ctrl-C at a random line of steerlab during a steered call, a bounded number of times."""
    count = request.config.getoption("--stress-count")
    rng = random.Random(0)
    for _ in range(count):
        target, seen = rng.randrange(1, 400), [0]

        def tracer(frame, event, arg, target=target, seen=seen):
            if "steerlab" in frame.f_code.co_filename and event == "line":
                seen[0] += 1
                if seen[0] == target:
                    raise KeyboardInterrupt
            return tracer

        sys.settrace(tracer)
        try:
            lm.generate(PROMPTS, sl.Steer(SITE, direction, alpha=2.0), max_new_tokens=3)
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        assert lm.hook_count() == 0
    lm.generate(PROMPTS, max_new_tokens=2)  # the model is free again


BAD_INPUT = {
    "alpha as a string": (lambda v: dict(steer=sl.Steer(SITE, v, alpha="48"))),
    "alpha as a dict": (lambda v: dict(steer=sl.Steer(SITE, v, alpha={4: 1}))),
    "steer as text": (lambda v: dict(steer="blocks.1.hook_resid_pre")),
    "top_k as a bool": (lambda v: dict(top_k=True)),
    "empty stop string": (lambda v: dict(stop="")),
    "stop items not strings": (lambda v: dict(stop=["a", 3])),
    "op not an operation": (lambda v: dict(steer=sl.Steer(SITE, v, op=sl.Add))),
    "site with a newline": (lambda v: dict(steer=sl.Steer(SITE + "\n", v))),
    "layer with a leading zero": (lambda v: dict(steer=sl.Steer("blocks.01.hook_resid_pre", v))),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_refused_before_any_forward(lm, direction, case):
    forwards = []
    handle = lm.model.register_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises((ValueError, TypeError)) as err:
            lm.generate(PROMPTS, max_new_tokens=2, **BAD_INPUT[case](direction))
    finally:
        handle.remove()
    assert forwards == [] and lm.hook_count() == 0
    if "site" in case or "layer" in case:
        assert "out of range" not in str(err.value)


def test_nan_logits_raise_instead_of_an_empty_completion(lm, direction):
    with pytest.raises(FloatingPointError, match="NaN"):
        lm.generate(PROMPTS, sl.Steer(SITE, direction, alpha=1e38), max_new_tokens=3)
    assert lm.hook_count() == 0


# --- vector files -------------------------------------------------------------------------------


def _vector(lm) -> sl.SteeringVector:
    return sl.SteeringVector({SITE: torch.ones(lm.d_model)})


def test_a_save_that_fails_midway_leaves_the_old_file(lm, tmp_path, monkeypatch):
    path = _vector(lm).save(tmp_path / "v.safetensors")
    good = path.read_bytes()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        (_vector(lm) * 2).save(path)
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["v.safetensors"]  # no temporary left


def test_a_fifo_named_safetensors_is_refused_without_blocking(tmp_path):
    import os

    fifo = tmp_path / "trap.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(sl.VectorFileError, match="not a regular file"):
        sl.SteeringVector.load(fifo)


def test_a_file_with_d_model_zero_is_refused(lm, tmp_path):
    from steerlab.vectors import io

    path = tmp_path / "empty.safetensors"
    vec = _vector(lm)
    meta = io._metadata(vec)
    meta["d_model"] = "0"
    header = {"__metadata__": meta, SITE: {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}
    import json
    import struct

    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text)
    with pytest.raises(sl.VectorFileError, match="d_model=0"):
        sl.SteeringVector.load(path)


def test_a_file_made_for_another_model_of_the_same_width_warns(lm, tiny_dirs, tmp_path):
    from steerlab.vectors.io import VectorMismatchWarning

    other = sl.load(tiny_dirs["llama"], backend="hf")
    vec = sl.extract(other, ["I was happy."], ["I was sad."], [SITE])
    path = vec.save(tmp_path / "llama.safetensors")
    assert other.d_model == lm.d_model
    with pytest.warns(VectorMismatchWarning, match="extracted on"):
        sl.SteeringVector.load(path, model=lm)
