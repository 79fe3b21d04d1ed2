"""The core's checks of a steer's inputs, and the stable unit direction the projection ops
share: each bad input is refused by type and name before any compute."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import steerlab as sl
from steerlab.core.ops import unit

SITE = "blocks.0.hook_resid_pre"


@pytest.mark.parametrize(
    ("vector", "words"),
    [
        (torch.ones(4, device="meta"), "meta device"),
        (torch.ones(4).to_sparse(), "dense"),
        (torch.ones(4).to(torch.float8_e4m3fn), "float8"),
        (torch.ones(4, dtype=torch.bool), "real numbers"),
        (torch.ones(2, 2), "1-D"),
    ],
)
def test_vectors_steerlab_cannot_steer_with_are_refused_by_name(vector, words):
    with pytest.raises(sl.SteerError, match=words):
        sl.Steer(SITE, vector)


def test_an_integer_vector_steers_as_its_float32_value():
    steer = sl.Steer(SITE, torch.tensor([1, -2, 3]))
    assert steer.vector.dtype == torch.float32
    assert steer == sl.Steer(SITE, torch.tensor([1.0, -2.0, 3.0]))


def test_numpy_numbers_are_numbers_and_a_huge_alpha_is_refused():
    steer = sl.Steer(SITE, torch.ones(3), alpha=np.float32(2.5), positions=np.int64(3))
    assert steer.alpha == (2.5,) and steer.positions == 3 and type(steer.positions) is int
    assert sl.Steer(SITE, torch.ones(3), alpha=[np.int64(1), 2.0]).alpha == (1.0, 2.0)
    with pytest.raises(sl.SteerError, match="alpha is too large"):
        sl.Steer(SITE, torch.ones(3), alpha=10**400)


@pytest.mark.parametrize("scale", [1e20, 1e-20, 1e30, 1e-30])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ablate_removes_the_projection_whatever_the_direction_norm(scale, dtype):
    torch.manual_seed(0)
    base = torch.randn(16, dtype=torch.float64)
    direction = (base * scale).to(dtype)
    act = torch.randn(5, 16, dtype=dtype)
    out = sl.Ablate()(act, direction, torch.ones(5, 1, dtype=dtype))
    along = out.double() @ (base / base.norm())
    assert torch.isfinite(out).all()
    assert along.abs().max() < 1e-5  # the component along v is gone, not left or NaN


def test_unit_is_stable_in_float16_too():
    direction = torch.tensor([3.0, 4.0], dtype=torch.float16) * 1e-4  # its norm underflows
    assert unit(direction).tolist() == pytest.approx([0.6, 0.8], abs=1e-3)
    assert unit(direction).dtype == torch.float16


def test_cap_clips_the_projection_and_alpha_zero_is_bit_identical():
    direction = torch.tensor([2.0, 0.0, 0.0])
    act = torch.tensor([[5.0, 1.0, 1.0], [-7.0, 2.0, 0.0], [0.5, 0.0, 3.0]])
    out = sl.Cap(low=-1.0, high=1.0)(act, direction, torch.ones(3, 1))
    assert out.tolist() == [[1.0, 1.0, 1.0], [-1.0, 2.0, 0.0], [0.5, 0.0, 3.0]]
    assert torch.equal(sl.Cap(high=0.0)(act, direction, torch.zeros(3, 1)), act)
    with pytest.raises(sl.SteerError, match="low bound, a high bound"):
        sl.Cap()
    with pytest.raises(sl.SteerError, match="above high"):
        sl.Cap(low=2.0, high=1.0)
