"""SteeringVector: an immutable value whose algebra agrees with its behaviour."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from steerlab.core import Ablate, Steer
from steerlab.vectors import Provenance, SteeringVector

S1, S2 = "blocks.1.hook_resid_pre", "blocks.2.hook_resid_pre"


@pytest.fixture
def vec() -> SteeringVector:
    g = torch.Generator().manual_seed(0)
    provenance = Provenance(method="mean_diff", residual_norms={S1: 3.0, S2: 5.0})
    return SteeringVector({S2: torch.randn(64, generator=g), S1: torch.randn(64, generator=g)},
                          provenance=provenance)  # fmt: skip


def test_sites_are_canonical_and_ordered(vec):
    assert vec.sites == [S1, S2]
    assert vec.layers == [1, 2]
    assert vec.d_model == 64
    with pytest.raises(ValueError, match="not a steerlab site"):
        SteeringVector({"layer2": torch.ones(4)})
    with pytest.raises(ValueError, match="different sizes"):
        SteeringVector({S1: torch.ones(4), S2: torch.ones(5)})
    with pytest.raises(ValueError, match="at least one"):
        SteeringVector({})


def test_is_immutable_and_owns_its_tensors(vec):
    source = torch.ones(64)
    v = SteeringVector({S1: source})
    source += 1
    assert torch.equal(v.directions[S1], torch.ones(64))
    with pytest.raises(dataclasses.FrozenInstanceError):
        vec.scale = 2.0
    with pytest.raises(TypeError):
        vec.directions[S1] = torch.zeros(64)
    clone = copy.deepcopy(vec * 2)
    assert clone.scale == 2.0 and torch.equal(clone.directions[S1], vec.directions[S1])


def test_scalar_algebra_only_moves_the_scale(vec):
    assert (vec * 4).scale == (4 * vec).scale == 4.0
    assert (-vec).scale == -1.0
    assert ((-vec) * -3).scale == (vec * 3).scale == 3.0
    assert (vec / 4).scale == 0.25
    assert (vec * np.float64(2.5)).scale == 2.5
    with pytest.raises(TypeError):
        vec * vec
    for v in (vec * 4, -vec, vec / 4):
        assert all(torch.equal(v.directions[s], vec.directions[s]) for s in vec.sites)
    assert torch.equal((vec * 4)[S1], 4 * vec.directions[S1])
    assert (vec * 4).norms()[S1] == pytest.approx(4 * float(vec.directions[S1].norm()))


def test_vector_sum_and_difference(vec):
    other = SteeringVector({S2: torch.ones(64), "blocks.3.hook_resid_pre": torch.ones(64)})
    total = vec * 2 + other
    assert total.sites == [S1, S2, "blocks.3.hook_resid_pre"]
    assert torch.equal(total[S1], 2 * vec.directions[S1])
    assert torch.equal(total[S2], 2 * vec.directions[S2] + 1)
    assert torch.equal((vec - vec)[S1], torch.zeros(64))
    with pytest.raises(ValueError, match="size"):
        vec + SteeringVector({S1: torch.ones(8)})


def test_steers_fold_scale_into_alpha(vec):
    two_v, v = (2 * vec).steers(alpha=1), vec.steers(alpha=2)
    assert [(s.site, s.alpha) for s in two_v] == [(s.site, s.alpha) for s in v]
    assert all(torch.equal(a.vector, b.vector) for a, b in zip(two_v, v))
    assert [s.alpha for s in ((-vec) * -3).steers()] == [s.alpha for s in (vec * 3).steers()]
    rows = (vec * 2).at(S1).steer(alpha=[0, 2, 4], positions="prompt", op=Ablate())
    assert isinstance(rows, Steer)
    assert rows.alpha == (0.0, 4.0, 8.0) and rows.positions == "prompt"
    assert isinstance(rows.op, Ablate)
    with pytest.raises(ValueError, match="2 sites"):
        vec.steer()


def test_to_normalized_relative(vec):
    assert vec.to(dtype=torch.float64).directions[S1].dtype == torch.float64
    unit = (vec * 7).normalized()
    assert unit.scale == 1.0
    assert all(n == pytest.approx(1.0) for n in unit.norms().values())
    rel = (vec * 0.5).relative()
    assert rel.norms() == pytest.approx({S1: 1.5, S2: 2.5})
    assert rel.cosine(vec) == pytest.approx({S1: 1.0, S2: 1.0})
    with pytest.raises(ValueError, match="residual norm"):
        SteeringVector({S1: torch.ones(4)}).relative()


def test_cosines(vec):
    assert vec.cosine(-vec) == pytest.approx({S1: -1.0, S2: -1.0})
    assert list(vec.cosine(SteeringVector({S2: torch.ones(64)}))) == [S2]
    matrix = vec.cosine_matrix()
    assert matrix.shape == (2, 2)
    torch.testing.assert_close(matrix.diagonal(), torch.ones(2))
    torch.testing.assert_close(matrix, matrix.T)
    expected = torch.nn.functional.cosine_similarity(vec[S1], vec[S2], dim=0)
    torch.testing.assert_close(matrix[0, 1], expected)


def test_reprs_name_sites_norms_method(vec):
    text, page = repr(vec * 2), (vec * 2)._repr_html_()
    for needle in (S1, S2, "mean_diff", f"{2 * float(vec.directions[S1].norm()):.4g}"):
        assert needle in text and needle in page


# --- behaviour on every backend ---------------------------------------------------------


def _greedy(lm, steer):
    return lm.generate(["Hi", "The fox"], steer=steer, max_new_tokens=6, stop_at_eos=False).tokens


def test_algebra_agrees_with_behaviour(lm, direction):
    v = SteeringVector({S1: direction})
    # rows: prompt-major, alpha-minor -> [Hi@0, Hi@x, fox@0, fox@x]; same batch shapes on both sides
    two_v_at_1 = _greedy(lm, (2 * v).steer(alpha=[0, 1]))
    v_at_2 = _greedy(lm, v.steer(alpha=[0, 2]))
    assert two_v_at_1 == v_at_2
    assert two_v_at_1[1] != two_v_at_1[0]  # the steer really changes the output
    minus_v_times_minus_3 = _greedy(lm, (-v) * -3)
    assert minus_v_times_minus_3 == _greedy(lm, v * 3)
    assert minus_v_times_minus_3[0] != two_v_at_1[0]  # and differs from unsteered
    assert lm.hook_count() == 0
