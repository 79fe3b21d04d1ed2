"""Batched generation equals one prompt at a time, under left padding and steering."""

import pytest
from helpers import PROMPTS

import steerlab as sl


@pytest.mark.parametrize("steered", [False, True])
def test_batched_equals_one_at_a_time(lm, direction, steered):
    steer = (
        sl.Steer("blocks.1.hook_resid_pre", direction, alpha=4.0, positions=1) if steered else None
    )
    batched = lm.generate(PROMPTS, steer, max_new_tokens=10, stop_at_eos=False)
    for i, prompt in enumerate(PROMPTS):
        single = lm.generate(prompt, steer, max_new_tokens=10, stop_at_eos=False)
        assert batched.tokens[i] == single.tokens[0]
        assert batched.prompt_tokens[i] == single.prompt_tokens[0]


def test_each_row_of_an_alpha_batch_equals_its_own_run(lm, direction):
    alphas = [0.0, 3.0, -5.0]
    grid = lm.generate(PROMPTS[:2], sl.Steer("blocks.1.hook_resid_pre", direction, alpha=alphas),
                       max_new_tokens=8, stop_at_eos=False)  # fmt: skip
    assert grid.prompt_index == [0, 0, 0, 1, 1, 1]
    assert [a[0] for a in grid.alphas] == alphas * 2
    for row in range(6):
        prompt, alpha = PROMPTS[grid.prompt_index[row]], grid.alphas[row][0]
        single = lm.generate(prompt, sl.Steer("blocks.1.hook_resid_pre", direction, alpha=alpha),
                             max_new_tokens=8, stop_at_eos=False)  # fmt: skip
        assert grid.tokens[row] == single.tokens[0]


def test_sampled_rows_of_one_prompt_share_random_numbers(lm, direction):
    """Same seed: the alpha-0 row of a batch is the plain sampled run of that prompt."""
    kwargs = dict(max_new_tokens=12, temperature=1.0, seed=7, stop_at_eos=False)
    plain = lm.generate(PROMPTS[1], **kwargs)
    grid = lm.generate(PROMPTS[1], sl.Steer("blocks.1.hook_resid_pre", direction, alpha=[0.0, 9.0]),
                       **kwargs)  # fmt: skip
    assert grid.tokens[0] == plain.tokens[0]
    assert grid.tokens[1] != plain.tokens[0]
    assert lm.generate(PROMPTS[1], **kwargs).tokens == plain.tokens  # reproducible


def test_rows_stop_independently_at_eos_and_stop_strings(lm):
    eos = lm.tokenizer.eos_token_id
    free = lm.generate(PROMPTS, max_new_tokens=12, stop_at_eos=False)
    assert all(len(t) == 12 for t in free.tokens)
    stop = free.text[0][3:5]
    out = lm.generate(PROMPTS, max_new_tokens=12, stop=stop, stop_at_eos=False)
    assert out.finish_reasons[0] == "stop"
    assert out.text[0] == free.text[0][: free.text[0].find(stop)]
    assert all(eos not in t for t in out.tokens)


def test_sampled_batch_equals_each_prompt_alone(lm):
    kwargs = dict(max_new_tokens=10, temperature=1.0, seed=3, stop_at_eos=False)
    batched = lm.generate(PROMPTS, **kwargs)
    assert batched.seed == 3
    for i, prompt in enumerate(PROMPTS):
        assert lm.generate(prompt, **kwargs).tokens[0] == batched.tokens[i]


def test_no_seed_draws_a_fresh_one_and_records_it(lm):
    first = lm.generate(PROMPTS[0], max_new_tokens=12, temperature=1.0)
    second = lm.generate(PROMPTS[0], max_new_tokens=12, temperature=1.0)
    assert first.seed != second.seed
    again = lm.generate(PROMPTS[0], max_new_tokens=12, temperature=1.0, seed=first.seed)
    assert again.tokens == first.tokens


def _unembedding_row(lm, token: int):
    if lm.backend.kind == "hooked":
        return lm.model.W_U[:, token].detach()
    hf = lm.model.original_model if lm.backend.kind == "bridge" else lm.model
    return hf.get_output_embeddings().weight[token].detach()


def test_rows_finish_independently_at_eos(lm):
    """A huge steer along EOS's unembedding sends one row to EOS at once; the other goes on."""
    eos = lm.tokenizer.eos_token_id
    last = f"blocks.{lm.n_layers - 1}.hook_resid_post"
    steer = sl.Steer(last, _unembedding_row(lm, eos), alpha=[0.0, 1e3])
    out = lm.generate(PROMPTS[1], steer, max_new_tokens=6)
    assert out.finish_reasons == ["length", "eos"]
    assert len(out.tokens[0]) == 6 and out.tokens[1] == []
    fixed = lm.generate(PROMPTS[1], steer, max_new_tokens=6, stop_at_eos=False)
    assert fixed.tokens[1] == [eos] * 6 and fixed.tokens[0] == out.tokens[0]
