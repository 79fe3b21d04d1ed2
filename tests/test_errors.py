"""Bad input fails before any compute, with a clear message, and leaves the model as it was."""

import math

import pytest
import torch
from helpers import PROMPTS

import steerlab as sl

SITE = "blocks.1.hook_resid_pre"


@pytest.fixture
def untouched(lm):
    """Asserts after the test that no forward ran and the weights and hooks are unchanged."""
    forwards = []
    handle = lm.model.register_forward_pre_hook(lambda *a: forwards.append(1))
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    yield lm
    handle.remove()
    assert forwards == [], "a forward pass ran before the error"
    assert lm.hook_count() == 0
    after = lm.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def ok_vector(lm):
    return torch.ones(lm.d_model)


CASES = {
    "unknown site": (lambda lm: dict(steer=sl.Steer("blocks.1.hook_resid_pree", ok_vector(lm))),
                     sl.SiteError, "Did you mean 'blocks.1.hook_resid_pre'"),
    "layer out of range": (lambda lm: dict(steer=sl.Steer("blocks.99.hook_resid_pre", ok_vector(lm))),
                           sl.SiteError, "out of range"),
    "wrong vector size": (lambda lm: dict(steer=sl.Steer(SITE, torch.ones(lm.d_model + 1))),
                          sl.SteerError, "d_model"),
    "empty prompt list": (lambda lm: dict(prompts=[]), ValueError, "empty"),
    "max_new_tokens < 1": (lambda lm: dict(max_new_tokens=0), ValueError, "max_new_tokens"),
    "negative temperature": (lambda lm: dict(temperature=-0.5), ValueError, "temperature"),
    "top_p zero": (lambda lm: dict(top_p=0.0), ValueError, "top_p"),
    "top_p above one": (lambda lm: dict(top_p=1.5), ValueError, "top_p"),
    "prompt beyond context": (lambda lm: dict(prompts=["x" * 200]), ValueError, "context window"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_bad_generate_input(untouched, case):
    make, error, message = CASES[case]
    kwargs = {"prompts": PROMPTS, "max_new_tokens": 4, **make(untouched)}
    with pytest.raises(error, match=message):
        untouched.generate(**kwargs)
    with pytest.raises(error, match=message):
        untouched.stream(**kwargs)  # raised on the call, not at the first step


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_vector_or_alpha(bad):
    with pytest.raises(sl.SteerError, match="NaN or inf"):
        sl.Steer(SITE, torch.tensor([1.0, bad]))
    with pytest.raises(sl.SteerError, match="finite"):
        sl.Steer(SITE, torch.ones(2), alpha=[1.0, bad])


def test_bad_positions_and_shapes():
    with pytest.raises(sl.SteerError, match="positions"):
        sl.Steer(SITE, torch.ones(4), positions="middle")
    with pytest.raises(sl.SteerError, match="1-D"):
        sl.Steer(SITE, torch.ones(2, 4))
    with pytest.raises(sl.SteerError, match="non-zero"):
        sl.Steer(SITE, torch.zeros(4), op=sl.Ablate())


def test_bad_backend_name_and_unknown_model_type(tiny_dirs):
    with pytest.raises(ValueError, match="backend must be one of"):
        sl.load(tiny_dirs["gpt2"], backend="vllm")
    with pytest.raises(TypeError, match="PreTrainedModel"):
        sl.wrap(torch.nn.Linear(2, 2), tokenizer=object())
