"""Exact invariants of steering, on every backend."""

import pytest
import torch
from helpers import PROMPTS

import steerlab as sl
from steerlab.core.sites import Site

SITE = "blocks.1.hook_resid_pre"


def test_alpha_zero_is_bit_identical(lm, direction):
    plain = lm.generate(PROMPTS, max_new_tokens=8, stop_at_eos=False)
    zero = lm.generate(PROMPTS, sl.Steer(SITE, direction, alpha=0.0), max_new_tokens=8,
                       stop_at_eos=False)  # fmt: skip
    assert zero.tokens == plain.tokens
    assert zero.logprobs == plain.logprobs  # floats compared exactly
    acts = lm.run_with_cache(PROMPTS, steer=sl.Steer(SITE, direction, alpha=0.0))
    base = lm.run_with_cache(PROMPTS)
    for site in base:
        assert torch.equal(acts[site], base[site]), site


def test_steering_at_layer_leaves_earlier_activations_untouched(lm, direction):
    layer = 2
    steer = sl.Steer(f"blocks.{layer}.hook_resid_pre", direction, alpha=10.0)
    base, steered = lm.run_with_cache(PROMPTS), lm.run_with_cache(PROMPTS, steer=steer)
    for site in base:
        parsed = Site.parse(site)
        earlier = parsed.layer is None or parsed.layer < layer
        assert torch.equal(steered[site], base[site]) == earlier, site


def test_add_adds_exactly_at_real_tokens_and_never_at_pads(lm, direction):
    site = "blocks.1.hook_resid_post"
    base = lm.run_with_cache(PROMPTS, sites=[site])
    steered = lm.run_with_cache(PROMPTS, sites=[site], steer=sl.Steer(site, direction, alpha=3.0))
    real = base.attention_mask.bool()
    torch.testing.assert_close(steered[site][real], base[site][real] + 3.0 * direction)
    assert torch.equal(steered[site][~real], base[site][~real])


def test_ablate_and_clamp_set_the_projection(lm, direction):
    site = "blocks.1.hook_resid_mid"
    unit = direction / direction.norm()
    real = lm.run_with_cache(PROMPTS, sites=[site]).attention_mask.bool()
    ablated = lm.run_with_cache(
        PROMPTS, sites=[site], steer=sl.Steer(site, direction, op=sl.Ablate())
    )
    clamped = lm.run_with_cache(PROMPTS, sites=[site],
                                steer=sl.Steer(site, direction, op=sl.Clamp(5.0)))  # fmt: skip
    proj_ablated = ablated[site][real] @ unit
    proj_clamped = clamped[site][real] @ unit
    torch.testing.assert_close(proj_ablated, torch.zeros_like(proj_ablated), atol=1e-4, rtol=0)
    torch.testing.assert_close(proj_clamped, torch.full_like(proj_clamped, 5.0), atol=1e-4, rtol=0)


def test_generated_positions_leave_prompt_logits_unchanged(lm, direction):
    steer = sl.Steer(SITE, direction, alpha=20.0, positions="generated")
    base = lm.generate(PROMPTS, max_new_tokens=6, stop_at_eos=False)
    steered = lm.generate(PROMPTS, steer, max_new_tokens=6, stop_at_eos=False)
    # The first new token is predicted from prompt positions only.
    assert [r[0] for r in steered.logprobs] == [r[0] for r in base.logprobs]
    assert [t[0] for t in steered.tokens] == [t[0] for t in base.tokens]
    assert steered.tokens != base.tokens  # and the steer does act on generated tokens


def test_prompt_positions_and_index_k_count_from_first_real_token(lm, direction):
    site = "blocks.0.hook_resid_post"
    base = lm.run_with_cache(PROMPTS, sites=[site])
    from_k = lm.run_with_cache(PROMPTS, sites=[site], steer=sl.Steer(site, direction, positions=3))
    changed = (from_k[site] != base[site]).any(-1)  # [batch, pos]
    pos = base.attention_mask.cumsum(-1) - 1
    assert torch.equal(changed, (pos >= 3) & base.attention_mask.bool())


def test_several_steers_at_several_sites(lm, direction):
    a = sl.Steer("blocks.0.hook_resid_post", direction, alpha=2.0)
    b = sl.Steer("blocks.2.hook_mlp_out", -direction, alpha=1.0, op=sl.Add())
    both = lm.generate(PROMPTS, [a, b], max_new_tokens=6, stop_at_eos=False)
    only_a = lm.generate(PROMPTS, a, max_new_tokens=6, stop_at_eos=False)
    assert len(both) == 3 and both.alphas[0] == (2.0, 1.0)
    assert both.logprobs != only_a.logprobs


@pytest.mark.parametrize("positions", ["all", "generated", 2])
def test_cache_equals_recompute_when_steered(lm, direction, positions):
    steer = sl.Steer("blocks.1.hook_resid_mid", direction, alpha=[0.0, 6.0], positions=positions)
    cached = lm.generate(PROMPTS, steer, max_new_tokens=10, stop_at_eos=False)
    recomputed = lm.generate(PROMPTS, steer, max_new_tokens=10, stop_at_eos=False, use_cache=False)
    assert cached.tokens == recomputed.tokens


def test_logits_rows_follow_generate_order_and_alpha_zero_is_plain(lm, direction):
    steer = sl.Steer(SITE, direction, alpha=[0.0, 5.0])
    plain = lm.logits(PROMPTS[:2], last_only=True)
    rows = lm.logits(PROMPTS[:2], steer, last_only=True)
    assert rows.shape[0] == 4 and plain.shape[1] == 1
    # Batches of different sizes may round differently (~1e-7), hence a tolerance here.
    torch.testing.assert_close(rows[[0, 2]], plain)
    assert not torch.allclose(rows[1], plain[0])
    out = lm.generate(PROMPTS[:2], steer, max_new_tokens=1)
    assert [t[0] for t in out.tokens] == rows[:, -1].argmax(-1).tolist()


def test_run_with_cache_takes_an_alpha_list(lm, direction):
    site = "blocks.1.hook_resid_post"
    acts = lm.run_with_cache(
        PROMPTS[0], sites=[site], steer=sl.Steer(site, direction, alpha=[0, 2])
    )
    torch.testing.assert_close(acts[site][1], acts[site][0] + 2 * direction)


def test_capture_during_generation_covers_prompt_and_new_tokens(lm, direction):
    site = "blocks.1.hook_resid_post"
    steer = sl.Steer(SITE, direction, alpha=2.0)
    out = lm.generate(PROMPTS, steer, max_new_tokens=5, stop_at_eos=False, capture=[site])
    acts = out.activations[site]
    prompt = lm.run_with_cache(PROMPTS, sites=[site], steer=steer)
    width = prompt[site].shape[1]
    assert acts.shape == (3, width + 4, lm.d_model)  # the last new token is never fed
    real = prompt.attention_mask.bool()
    torch.testing.assert_close(acts[:, :width][real], prompt[site][real])


def test_alpha_zero_rows_are_bit_identical_through_the_hook(lm, direction):
    """A mixed batch runs the hook; its alpha-0 row must still equal an unsteered row."""
    site = "blocks.2.hook_resid_post"
    mixed = lm.run_with_cache(
        PROMPTS[1], sites=[site], steer=sl.Steer(SITE, direction, alpha=[0, 5])
    )
    plain = lm.run_with_cache([PROMPTS[1]] * 2, sites=[site])
    assert torch.equal(mixed[site][0], plain[site][0])
    assert not torch.equal(mixed[site][1], plain[site][1])


def test_steers_apply_in_forward_order_whatever_the_list_order(lm, direction):
    mid = sl.Steer("blocks.1.hook_resid_mid", direction, op=sl.Clamp(5.0))
    pre = sl.Steer("blocks.1.hook_resid_pre", torch.randn(lm.d_model), alpha=3.0)
    site = "blocks.1.hook_resid_mid"
    one = lm.run_with_cache(PROMPTS, sites=[site], steer=[mid, pre])
    other = lm.run_with_cache(PROMPTS, sites=[site], steer=[pre, mid])
    real = one.attention_mask.bool()
    unit = direction / direction.norm()
    torch.testing.assert_close(one[site][real] @ unit, torch.full((int(real.sum()),), 5.0),
                               atol=1e-4, rtol=0)  # fmt: skip
    torch.testing.assert_close(one[site], other[site])
