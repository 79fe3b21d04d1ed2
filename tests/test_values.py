"""Values behave like values: equality, files from any backend, Steer from a vector, arithmetic."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from helpers import PROMPTS, load_tiny

import steerlab as sl
from steerlab.core import Steer, SteerError
from steerlab.testing import save_tiny
from steerlab.vectors import Provenance, SteeringVector, SweepResult, VectorFileError

S1, S2 = "blocks.1.hook_resid_pre", "blocks.2.hook_resid_pre"


@pytest.fixture
def vec() -> SteeringVector:
    g = torch.Generator().manual_seed(0)
    provenance = Provenance(method="mean_diff", residual_norms={S1: 3.0, S2: 5.0})
    return SteeringVector({S1: torch.randn(64, generator=g), S2: torch.randn(64, generator=g)},
                          provenance=provenance)  # fmt: skip


def rebuilt(v: SteeringVector, **changes) -> SteeringVector:
    """A new vector with fresh tensors: equal contents, different objects."""
    fields = {"directions": {s: d.clone() for s, d in v.directions.items()},
              "scale": v.scale, "provenance": v.provenance, **changes}  # fmt: skip
    return SteeringVector(**fields)


# --- equality -----------------------------------------------------------------------------


def test_equal_contents_are_equal_vectors(vec):
    assert vec == rebuilt(vec)
    assert vec == copy.deepcopy(vec)
    assert vec * 2 == 2 * vec == rebuilt(vec, scale=2.0)
    assert (vec != rebuilt(vec)) is False  # != is the negation, not identity


def test_any_difference_in_contents_makes_them_unequal(vec):
    nudged = vec.directions[S1].clone()
    nudged[3] = torch.nextafter(nudged[3], torch.tensor(math.inf))  # one ulp
    assert vec != rebuilt(vec, directions={S1: nudged, S2: vec.directions[S2]})
    assert vec != rebuilt(vec, scale=1.5)
    assert vec != vec.to(dtype=torch.float64)  # same numbers, another dtype
    assert vec != vec.at(S1)
    assert vec != rebuilt(vec, provenance=Provenance(method="probe"))
    assert vec != vec.directions[S1] and vec != 1.0


def test_vectors_are_deliberately_unhashable(vec):
    with pytest.raises(TypeError, match="unhashable"):
        hash(vec)


def test_a_saved_vector_loads_back_equal(vec, tmp_path):
    assert SteeringVector.load(vec.save(tmp_path / "v.safetensors")) == vec
    assert SteeringVector.load((vec * -3).save(tmp_path / "w.safetensors")) == vec * -3


# --- files from an amplified model ----------------------------------------------------------


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    after = sl.load(save_tiny(root / "a", "gpt2", seed=1), backend="hf")
    before = sl.load(save_tiny(root / "b", "gpt2", seed=2), backend="hf")
    return after, before


def test_a_vector_from_an_amplified_model_saves_and_loads_checked(pair, tmp_path):
    after, before = pair
    lda = sl.amplify(after, before, beta=2.0)
    vec = sl.extract(lda, ["I love it"], ["I hate it"], [S1, S2], progress=False)
    assert vec.provenance.backend == "amplified"
    loaded = SteeringVector.load(vec.save(tmp_path / "lda.safetensors"), model=lda)
    assert loaded == vec
    assert loaded.provenance.model == lda.name  # names both models
    # Steering acts on `after`, so the activations read are `after`'s own.
    plain = sl.extract(after, ["I love it"], ["I hate it"], [S1, S2], progress=False)
    assert all(torch.equal(vec.directions[s], plain.directions[s]) for s in vec.sites)
    # The load-time model checks still run.
    small = SteeringVector({S1: torch.ones(32)}, provenance=Provenance(backend="amplified"))
    with pytest.raises(VectorFileError, match="d_model=32"):
        SteeringVector.load(small.save(tmp_path / "small.safetensors"), model=lda)


# --- Steer(site, SteeringVector) ------------------------------------------------------------


def test_steer_takes_a_vector_at_one_of_its_sites(vec):
    steer = Steer(S2, vec * 2, alpha=[0.0, 4.0], positions="prompt")
    assert torch.equal(steer.vector, vec.directions[S2])
    assert steer.alpha == (0.0, 8.0)  # the vector's scale joins alpha, as in vec.steers()
    (expected,) = (vec * 2).at(S2).steers(alpha=[0.0, 4.0], positions="prompt")
    assert (steer.site, steer.alpha, steer.positions) == (
        expected.site,
        expected.alpha,
        expected.positions,
    )
    assert torch.equal(steer.vector, expected.vector)


def test_steer_with_a_vector_steers_like_the_tensor_it_holds(tiny_dirs):
    lm = load_tiny(tiny_dirs, "gpt2", "hf")
    vec = sl.extract(lm, ["I love it"], ["I hate it"], [S1, S2], progress=False)
    by_vector = lm.generate(PROMPTS, Steer(S1, vec, alpha=3.0), max_new_tokens=6)
    by_tensor = lm.generate(PROMPTS, Steer(S1, vec[S1] * 3.0), max_new_tokens=6)
    plain = lm.generate(PROMPTS, max_new_tokens=6)
    assert by_vector.tokens == by_tensor.tokens
    assert by_vector.tokens != plain.tokens  # it did steer


def test_steer_at_a_site_the_vector_lacks_names_its_sites(vec):
    with pytest.raises(SteerError, match=r"no direction at 'blocks.3.hook_resid_pre'.*resid_pre"):
        Steer("blocks.3.hook_resid_pre", vec)


def test_steer_with_a_numpy_vector_names_the_fix():
    with pytest.raises(SteerError, match=r"torch.as_tensor"):
        Steer(S1, np.ones(64, dtype=np.float32))


# --- arithmetic with lists and numpy ----------------------------------------------------------


@pytest.mark.parametrize(
    "alphas",
    [[0, 4], (0.0, 4.0), np.array([0.0, 4.0]), torch.tensor([0.0, 4.0]), np.array([4.0])],
    ids=["list", "tuple", "ndarray", "tensor", "one-element"],
)
def test_a_list_of_alphas_is_refused_with_the_fix(vec, alphas):
    for product in (lambda: vec * alphas, lambda: alphas * vec, lambda: vec / alphas):
        with pytest.raises(TypeError, match=r"vec\.steers\(alpha=\[\.\.\.\]\)"):
            product()


@pytest.mark.parametrize(
    "k",
    [np.float32(2.0), np.float64(2.0), np.int64(2), np.array(2.0), torch.tensor(2.0)],
    ids=["float32", "float64", "int64", "0-d ndarray", "0-d tensor"],
)
def test_one_number_of_any_kind_scales(vec, k):
    assert (vec * k).scale == (k * vec).scale == 2.0
    assert (vec / k).scale == 0.5
    assert isinstance(k * vec, SteeringVector)


def test_non_numbers_are_refused(vec):
    for bad in ("4", None, True):
        with pytest.raises(TypeError, match="one number"):
            vec * bad


def test_numpy_directions_become_tensors():
    v = SteeringVector({S1: np.arange(4, dtype=np.float32)})
    assert isinstance(v.directions[S1], torch.Tensor)
    assert torch.equal(v.directions[S1], torch.arange(4, dtype=torch.float32))


# --- SweepResult.best without a score ---------------------------------------------------------


def _record(alpha: float, score: float, perplexity: float) -> dict:
    return {"site": S1, "layer": 1, "alpha": alpha, "score": score,
            "perplexity": perplexity, "kl": 0.0, "n": 1}  # fmt: skip


def test_best_without_a_score_asks_for_one():
    result = SweepResult(
        [_record(a, math.nan, 2.0) for a in (-1.0, 0.0, 1.0)],
        {"score": math.nan, "perplexity": 2.0},
    )
    with pytest.raises(ValueError, match=r"score=") as error:
        result.best()
    assert "fluent" not in str(error.value)  # every cell is fluent here


def test_best_says_when_fluent_cells_have_no_score():
    result = SweepResult(
        [_record(0.0, math.nan, 2.0), _record(8.0, 1.0, 900.0)],
        {"score": math.nan, "perplexity": 2.0},
    )
    with pytest.raises(ValueError, match="no fluent cell has a score"):
        result.best()


def test_a_real_sweep_without_a_score_asks_for_one(tiny_dirs):
    lm = load_tiny(tiny_dirs, "gpt2", "hf")
    vec = sl.extract(lm, ["I love it"], ["I hate it"], [S1], progress=False)
    result = sl.sweep(lm, vec, ["Hi"], alphas=[0.0, 1.0], max_new_tokens=4, progress=False)
    with pytest.raises(ValueError, match=r"score="):
        result.best()
