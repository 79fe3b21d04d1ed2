"""Rows of one prompt feed it once; on_token callbacks; a call cut short keeps a valid cache."""

from __future__ import annotations

import pytest
import torch
from test_sessions import Counter

import steerlab as sl
from steerlab.core.request import Request, Steer
from steerlab.engine.local import prefix

ALPHAS = [0.0, 2.0, -2.0, 4.0]


def run(lm, steer, prompts, shared: bool, **options):
    lm.engine.share_prefix = shared
    try:
        return lm.generate(prompts, steer, max_new_tokens=6, stop_at_eos=False, **options)
    finally:
        lm.engine.share_prefix = True


@pytest.mark.parametrize("positions", ["generated", 30])
def test_a_shared_prompt_is_fed_once_and_changes_nothing(lm, direction, positions):
    steer = sl.Steer("blocks.1.hook_resid_pre", direction, alpha=ALPHAS, positions=positions)
    prompts = ["The quick brown fox jumps", "Hi"]
    counter = Counter(lm)
    try:
        alone = run(lm, steer, prompts, shared=False, temperature=1.0, seed=3)
        fed_alone = counter.take()
        together = run(lm, steer, prompts, shared=True, temperature=1.0, seed=3)
        fed_together = counter.take()
    finally:
        counter.close()
    assert together.tokens == alone.tokens
    for a, b in zip(together.logprobs, alone.logprobs):
        assert a == pytest.approx(b, abs=1e-4)
    width = max(len(p) for p in together.prompt_tokens)
    assert fed_alone[0] == width  # every row fed its whole (padded) prompt
    assert fed_together[:2] == [width - 1, 1]  # each prompt once, then each row's last token
    assert lm.hook_count() == 0


def test_rows_share_only_where_exact(direction):
    def rows(positions, alphas, prompt=(5, 6, 7, 8)):
        return [Request(prompt, (Steer("blocks.0.hook_resid_pre", direction, a, positions,
                                           sl.Add()),)) for a in alphas]  # fmt: skip

    assert prefix.group_size(rows("generated", [0, 1, 2])) == 3
    assert prefix.group_size(rows(3, [0, 1])) == 2  # from the last prompt token on
    assert prefix.group_size(rows(2, [0, 1])) is None  # touches the shared part
    assert prefix.group_size(rows("all", [1, 1])) == 2  # the same alpha on every row
    assert prefix.group_size(rows("all", [1, 2])) is None
    assert prefix.group_size(rows("prompt", [0, 1])) is None
    assert prefix.group_size(rows("generated", [1])) is None  # nothing to share
    assert prefix.group_size(rows("generated", [0, 1], prompt=(5,))) is None
    mixed = rows("generated", [0, 1]) + rows("generated", [0, 1], prompt=(9, 9, 9))
    assert prefix.group_size(mixed) == 2


def test_on_token_sees_every_step(lm):
    seen = []
    out = lm.generate(["Hi", "Hello"], max_new_tokens=5, stop_at_eos=False,
                      on_token=lambda step: seen.append((step.index, step.text)))  # fmt: skip
    assert [i for i, _ in seen] == list(range(5)) and seen[-1][1] == out.text


def test_an_exception_in_on_token_stops_cleanly_and_the_cache_stays_valid(lm, direction):
    steer = sl.Steer("blocks.1.hook_resid_pre", direction, alpha=3.0)
    first = lm.generate("Hello", steer, max_new_tokens=4, stop_at_eos=False, keep_cache=True)
    cache, length = first.cache, first.cache.length

    def stop(step):
        if step.index == 2:
            raise RuntimeError("enough")

    with pytest.raises(RuntimeError, match="enough"):
        lm.generate(" there", steer, max_new_tokens=6, stop_at_eos=False, cache=cache,
                    on_token=stop)  # fmt: skip
    assert lm.hook_count() == 0
    added = len(lm.tokenizer(" there", add_special_tokens=False).input_ids)
    assert cache.length == length + added + 2  # up to the last token fed
    ids = cache.row_tokens(0)
    more = lm.generate(None, steer, max_new_tokens=3, stop_at_eos=False, cache=cache)
    whole = lm.generate(lm.tokenizer.decode(ids), steer, max_new_tokens=3, stop_at_eos=False)
    assert whole.prompt_tokens[0] == ids and more.tokens == whole.tokens


def test_continuing_a_real_cache_with_none(lm):
    """The cache ops crop real backend caches (a fake backend stands in elsewhere)."""
    first = lm.generate("Hello", max_new_tokens=4, stop_at_eos=False, keep_cache=True)
    rest = lm.generate(None, max_new_tokens=4, stop_at_eos=False, cache=first.cache)
    whole = lm.generate("Hello", max_new_tokens=8, stop_at_eos=False)
    assert first.tokens[0] + rest.tokens[0] == whole.tokens[0]
    assert torch.equal(first.cache.tokens[0, -8:], torch.tensor(whole.tokens[0]))
