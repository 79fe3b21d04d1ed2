"""No hook left behind: every exit path takes steerlab's hooks off, and only them."""

import pytest
from helpers import PROMPTS

import steerlab as sl

SITE = "blocks.1.hook_resid_pre"


class Explode:
    """An operation that raises inside the hook."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __call__(self, act, direction, alpha):
        raise self.error


def test_normal_exit(lm, direction):
    assert lm.hook_count() == 0
    lm.generate(PROMPTS, sl.Steer(SITE, direction, alpha=2.0), max_new_tokens=3, capture=[SITE])
    assert lm.hook_count() == 0


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_exception_or_interrupt_inside_a_hook(lm, direction, error):
    steer = sl.Steer(SITE, direction, alpha=2.0, op=Explode(error))
    with pytest.raises(type(error)):
        lm.generate(PROMPTS, steer, max_new_tokens=3)
    assert lm.hook_count() == 0
    with pytest.raises(type(error)):
        lm.run_with_cache(PROMPTS, steer=steer)
    assert lm.hook_count() == 0


def test_stream_abandoned_halfway(lm, direction):
    stream = lm.stream(PROMPTS, sl.Steer(SITE, direction, alpha=2.0), max_new_tokens=10)
    first = next(stream)
    assert first.index == 0 and lm.hook_count() == 1
    stream.close()
    assert lm.hook_count() == 0


def test_user_hooks_survive_and_cells_rerun_cleanly(lm, direction):
    seen = []
    target = lm.model.get_submodule(next(n for n, _ in lm.model.named_modules() if n))
    handle = target.register_forward_hook(lambda *args: seen.append(1))
    try:
        for _ in range(3):  # a re-run notebook cell
            lm.generate(PROMPTS, sl.Steer(SITE, direction, alpha=1.0), max_new_tokens=2)
            assert lm.hook_count() == 0
        assert len(target._forward_hooks) == 1 and seen
    finally:
        handle.remove()


def test_a_paused_stream_keeps_autograd_and_blocks_other_calls(lm, direction):
    import torch

    stream = lm.stream(PROMPTS, sl.Steer(SITE, direction, alpha=2.0), max_new_tokens=5)
    next(stream)
    try:
        assert not torch.is_inference_mode_enabled()
        x = torch.ones(2, requires_grad=True)
        (x * 2).sum().backward()  # user code between steps still trains
        assert x.grad is not None
        with pytest.raises(RuntimeError, match="Another steerlab call"):
            lm.generate(PROMPTS, sl.Steer(SITE, direction, alpha=1.0), max_new_tokens=2)
        assert lm.hook_count() == 1  # the refused call attached nothing
    finally:
        stream.close()
    assert lm.hook_count() == 0
    lm.generate(PROMPTS, sl.Steer(SITE, direction, alpha=1.0), max_new_tokens=2)
