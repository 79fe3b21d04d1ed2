"""The sampler is a pure function of logits and one uniform number per row."""

import torch

from steerlab.core.sampling import sample_next

LOGITS = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 0.0]])


def test_greedy_is_argmax_whatever_the_random_number():
    for u in (0.0, 0.5, 0.999):
        assert sample_next(LOGITS, torch.full((2,), u), temperature=0).tolist() == [1, 2]


def test_inverse_cdf_follows_the_distribution():
    probs = LOGITS[0].softmax(-1)
    cdf = probs.cumsum(-1)
    for u in torch.linspace(0.01, 0.99, 25):
        expected = int((cdf <= u).sum())  # the first index whose cdf exceeds u
        got = sample_next(LOGITS[:1], u[None], temperature=1.0)
        assert got.item() == expected


def test_top_k_and_top_p_restrict_the_support():
    uniform = torch.linspace(0, 0.999, 200)
    logits = LOGITS[:1].expand(200, 4)
    assert set(sample_next(logits, uniform, temperature=1.0, top_k=2).tolist()) == {1, 2}
    # p = [0.087, 0.644, 0.237, 0.032]: top_p 0.5 keeps token 1, 0.85 adds token 2
    assert set(sample_next(logits, uniform, temperature=1.0, top_p=0.5).tolist()) == {1}
    assert set(sample_next(logits, uniform, temperature=1.0, top_p=0.85).tolist()) == {1, 2}


def test_low_temperature_sharpens():
    uniform = torch.linspace(0.001, 0.999, 100)
    hot = sample_next(LOGITS[:1].expand(100, 4), uniform, temperature=5.0)
    cold = sample_next(LOGITS[:1].expand(100, 4), uniform, temperature=0.05)
    assert set(cold.tolist()) == {1}
    assert len(set(hot.tolist())) == 4


def _float64_pick(logits: torch.Tensor, u: float, temperature: float) -> int:
    """Inverse-CDF on the float64 softmax, where logits near 1e34 over 2e-5 do not overflow."""
    cdf = (logits.double() / temperature).softmax(-1).cumsum(-1)
    return int((cdf <= u * cdf[-1]).sum())


def test_a_temperature_that_overflows_finite_logits_samples_their_distribution():
    # 3e34 / 2e-5 is inf in float32: dividing first gave a NaN softmax and token 3 every time
    rows = torch.tensor([[2.9e34, 3e34, 1.0, 2.0], [0.0, 1.0, 3e34, 3e34], [1.0, 3.0, 2.0, 0.0]])
    for u in (0.0, 0.3, 0.7, 0.999):
        got = sample_next(rows, torch.full((3,), u), temperature=2e-5).tolist()
        assert got == [_float64_pick(row, u, 2e-5) for row in rows]
    assert sample_next(rows[1:2], torch.tensor([0.3]), temperature=2e-5).item() == 2  # a tie
    assert sample_next(rows[1:2], torch.tensor([0.7]), temperature=2e-5).item() == 3
