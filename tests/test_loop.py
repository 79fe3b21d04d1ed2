"""The decode loop on a fake backend: cache continuation, compaction, mixed rows, positions.

The fake model's next token depends on the current token, its position and what a steer
added, so wrong positions, a stale cache or a row mixed up with another all change tokens.
It runs in milliseconds.
"""

from __future__ import annotations

import pytest
import torch

import steerlab as sl
from steerlab.engine import Request, Sampling, Steer
from steerlab.testing import FakeBackend, char_tokenizer

VOCAB = FakeBackend.d_model
SITE = FakeBackend.site


@pytest.fixture
def fake():
    backend = FakeBackend()
    return sl.SteerableModel(backend, char_tokenizer()), backend


PROMPTS = ["ab", "hello there", "xyz!"]


@pytest.mark.parametrize("steered", [False, True])
def test_continuing_a_cache_equals_one_long_run(fake, steered):
    lm, backend = fake
    steer = sl.Steer(SITE, torch.eye(VOCAB)[7] * 20, alpha=1.0, positions=5) if steered else None
    whole = lm.generate(PROMPTS, steer, max_new_tokens=20, stop_at_eos=False)
    first = lm.generate(PROMPTS, steer, max_new_tokens=10, stop_at_eos=False, keep_cache=True)
    rest = lm.generate(None, steer, max_new_tokens=10, stop_at_eos=False, cache=first.cache)
    assert [a + b for a, b in zip(first.tokens, rest.tokens)] == whole.tokens
    assert rest.cache is first.cache and first.cache.length == whole_length(whole)


def whole_length(gen) -> int:
    return max(len(p) for p in gen.prompt_tokens) + len(gen.tokens[0])


def test_the_cache_ends_at_the_end_of_the_text(fake):
    lm, _ = fake
    out = lm.generate(PROMPTS, max_new_tokens=6, stop_at_eos=False, keep_cache=True)
    for row in range(len(PROMPTS)):
        assert out.cache.row_tokens(row) == out.prompt_tokens[row] + out.tokens[row]
        assert out.cache.generated[row].sum() == 6
    assert out.cache.mask.shape == out.cache.tokens.shape


def test_positions_continue_across_calls_and_new_text_follows_the_cache(fake):
    lm, backend = fake
    first = lm.generate(["ab", "hello"], max_new_tokens=3, stop_at_eos=False, keep_cache=True)
    backend.positions.clear()
    lm.generate([" more", "!"], max_new_tokens=2, stop_at_eos=False, cache=first.cache)
    new_prefill = backend.positions[0]
    # row 0: "ab" = BOS a b (3) + 3 generated = 6 real tokens before " more" (5 chars)
    assert new_prefill[0].tolist() == [6, 7, 8, 9, 10]
    assert new_prefill[1, -1].item() == 6 + 3  # BOS h e l l o + 3 generated, then "!"
    assert (
        first.cache.row_tokens(0)[-7:-2]
        == lm.tokenizer(" more", add_special_tokens=False)["input_ids"]
    )


def test_generated_steering_touches_only_generated_tokens_across_calls(fake):
    lm, _ = fake
    target = 50
    steer = sl.Steer(SITE, torch.eye(VOCAB)[target] * 20, alpha=1.0, positions="generated")

    def continued(steer):
        first = lm.generate(["ab"], steer, max_new_tokens=2, stop_at_eos=False, keep_cache=True)
        return lm.generate(["cd"], steer, max_new_tokens=3, stop_at_eos=False, cache=first.cache)

    plain, steered = continued(None).tokens[0], continued(steer).tokens[0]
    # The first new token comes from the user's text "cd" (prompt tokens): not steered.
    # Later ones come from generated tokens: steered to the target.
    assert steered[0] == plain[0] != target
    assert steered[1:] == [target, target]


def test_finished_rows_leave_the_batch_and_results_do_not_change(fake):
    lm, backend = fake
    short, long = (
        Sampling(max_new_tokens=4, stop_at_eos=False),
        Sampling(max_new_tokens=30, stop_at_eos=False),
    )
    ids = [tuple(lm.tokenizer(p)["input_ids"]) for p in ["ab", "cd", "ef", "gh"]]
    requests = [Request(ids[0], (), short), Request(ids[1], (), long),
                Request(ids[2], (), short), Request(ids[3], (), long)]  # fmt: skip
    backend.forwards.clear()
    mixed = lm.engine.run(requests)
    batches = [b for b, _ in backend.forwards]
    assert batches[0] == 4 and batches[-1] == 2, batches  # compacted once half had finished
    assert len(batches) == 30
    for request, got in zip(requests, mixed):
        assert lm.engine.run([request])[0].tokens == got.tokens
    assert [len(c.tokens) for c in mixed] == [4, 30, 4, 30]


def test_mixed_steers_and_sampling_per_row_equal_each_row_alone(fake):
    lm, _ = fake
    enc = lambda p: tuple(lm.tokenizer(p)["input_ids"])  # noqa: E731
    v1, v2 = torch.eye(VOCAB)[10] * 6, torch.eye(VOCAB)[20] * 6
    requests = [
        Request(enc("ab"), (Steer(SITE, v1, 1.0, "all", sl.Add()),), Sampling(max_new_tokens=5)),
        Request(enc("hello"), (), Sampling(max_new_tokens=9, temperature=1.0, seed=3), "s1"),
        Request(
            enc("ab"),
            (Steer(SITE, v2, 2.0, "generated", sl.Add()),),
            Sampling(max_new_tokens=7, temperature=0.7, top_k=5, seed=1),
            "s2",
        ),
        Request(
            enc("xyz"),
            (Steer(SITE, v1, 1.0, "prompt", sl.Clamp(3.0)),),
            Sampling(max_new_tokens=6, top_p=0.5, temperature=2.0, stop=("q",)),
            "s3",
        ),
    ]
    mixed = lm.engine.run(requests)
    for request, got in zip(requests, mixed):
        alone = lm.engine.run([request])[0]
        assert (alone.tokens, alone.finish_reason) == (got.tokens, got.finish_reason)
    assert (
        mixed[0].tokens
        != lm.engine.run([Request(enc("ab"), (), Sampling(max_new_tokens=5))])[0].tokens
    )
    assert lm.hook_count() == 0


def test_a_cancelled_row_leaves_and_the_others_go_on(fake):
    lm, backend = fake
    ids = tuple(lm.tokenizer("ab")["input_ids"])
    requests = [
        Request(ids, (), Sampling(max_new_tokens=20, stop_at_eos=False), str(i)) for i in range(2)
    ]
    stream = lm.engine.stream(requests)
    first = next(stream)
    first.states.cancel(0)
    last = list(stream)[-1]
    assert last.states.reasons == ["cancelled", "length"]
    assert len(last.states.tokens[0]) == 1 and len(last.states.tokens[1]) == 20


def test_steps_are_snapshots_with_new_text(fake):
    lm, _ = fake
    steps = list(lm.stream(["ab"], max_new_tokens=4, stop_at_eos=False))
    texts = [s.text[0] for s in steps]
    assert [len(t) for t in texts] == [1, 2, 3, 4]
    assert "".join(s.new_text[0] for s in steps) == texts[-1]
