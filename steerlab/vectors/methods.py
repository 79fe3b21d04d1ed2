"""Extraction methods: typed callables from contrastive activations to one direction.

Each method takes ``positive [n_pos, d]`` and ``negative [n_neg, d]`` activations at
one site and returns a direction ``[d]``. ``check`` validates the counts before any
forward pass runs. Methods other than ``mean_diff`` are scaled to the mean
difference's projection on their direction, so one alpha means roughly the same
push whichever method found the direction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class Method(Protocol):
    @property
    def name(self) -> str: ...

    def check(self, n_positive: int, n_negative: int) -> None: ...

    def __call__(
        self,
        positive: torch.Tensor,  # [n_pos, d_model]
        negative: torch.Tensor,  # [n_neg, d_model]
    ) -> torch.Tensor:  # [d_model]
        ...


def _need_pairs(name: str, n_positive: int, n_negative: int) -> None:
    if n_positive != n_negative:
        raise ValueError(
            f"{name} pairs positive[i] with negative[i]: got {n_positive} positive and "
            f"{n_negative} negative prompts."
        )


def _aligned(unit: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
    """``unit`` flipped towards the mean difference and scaled to its projection on it."""
    projection = (positive.mean(0) - negative.mean(0)) @ unit
    return unit * projection.abs() * (1.0 if projection >= 0 else -1.0)


@dataclass(frozen=True)
class MeanDiff:
    """Difference of class means (CAA): ``mean(positive) - mean(negative)``.

    >>> MeanDiff()(torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 0.0]]))
    tensor([2., 0.])
    """

    name: str = "mean_diff"

    def check(self, n_positive: int, n_negative: int) -> None:
        pass

    def __call__(self, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        return positive.mean(0) - negative.mean(0)


@dataclass(frozen=True)
class PCADiff:
    """First principal direction of the paired differences ``positive[i] - negative[i]``.

    Uncentred (the top right singular vector of the difference matrix), so one pair
    reduces to that pair's difference; sign and length follow the mean difference.

    >>> PCADiff()(torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 0.0]]))
    tensor([2., 0.])
    """

    name: str = "pca_diff"

    def check(self, n_positive: int, n_negative: int) -> None:
        _need_pairs(self.name, n_positive, n_negative)

    def __call__(self, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        diffs = (positive - negative).double()  # [n, d]
        _, _, vh = torch.linalg.svd(diffs, full_matrices=False)
        return _aligned(vh[0], positive.double(), negative.double()).to(positive.dtype)


@dataclass(frozen=True)
class SinglePair:
    """ActAdd: the difference of exactly one positive and one negative prompt.

    >>> SinglePair()(torch.tensor([[2.0, 1.0]]), torch.tensor([[0.0, 1.0]]))
    tensor([2., 0.])
    """

    name: str = "single_pair"

    def check(self, n_positive: int, n_negative: int) -> None:
        if (n_positive, n_negative) != (1, 1):
            raise ValueError(
                f"single_pair takes exactly one positive and one negative prompt; got "
                f"{n_positive} and {n_negative}. Use mean_diff for several pairs."
            )

    def __call__(self, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        return positive[0] - negative[0]


@dataclass(frozen=True)
class Probe:
    """Logistic-regression direction separating positive from negative activations.

    Fitted full-batch with L-BFGS from zero weights in float64, so the result is
    deterministic. Activations are centred on the midpoint of the class means and
    divided by their mean norm (a uniform rescale, which leaves the direction alone).

    >>> Probe()(torch.tensor([[2.0, 0.0], [3.0, 0.1]]), torch.tensor([[0.0, 0.0], [-1.0, 0.1]]))[0] > 0
    tensor(True)
    """

    steps: int = 200
    l2: float = 1e-2
    name: str = "probe"

    def check(self, n_positive: int, n_negative: int) -> None:
        pass

    def __call__(self, positive: torch.Tensor, negative: torch.Tensor) -> torch.Tensor:
        pos, neg = positive.double(), negative.double()
        centre = (pos.mean(0) + neg.mean(0)) / 2
        x = torch.cat([pos, neg]) - centre  # [n, d]
        x = x / x.norm(dim=-1).mean().clamp_min(1e-12)
        y = torch.cat([torch.ones(len(pos)), torch.zeros(len(neg))]).double()
        w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
        b = torch.zeros((), dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS([w, b], max_iter=self.steps, line_search_fn="strong_wolfe")

        def loss() -> torch.Tensor:
            optimizer.zero_grad()
            value = torch.nn.functional.binary_cross_entropy_with_logits(x @ w + b, y)
            value = value + self.l2 * (w @ w)
            value.backward()
            return value

        with torch.enable_grad():
            optimizer.step(loss)
        unit = w.detach() / w.detach().norm().clamp_min(1e-12)
        return _aligned(unit, pos, neg).to(positive.dtype)


mean_diff = MeanDiff()
pca_diff = PCADiff()
single_pair = SinglePair()
probe = Probe()
