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
