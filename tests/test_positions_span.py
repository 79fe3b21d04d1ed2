"""Spans of the prompt ("first:k", "last:k", "first:k+last:k") in the one position rule.

Each engine's parity with plain hooks is in ``engine_parity.py`` (cases ``*-span``,
``*-last``, ``loreft-*``); here: the rule's text, its data forms, prefix sharing, the chat
cache key and vLLM's salt.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import steerlab as sl
from steerlab.chat.key import touches
from steerlab.core.positions import position_form, position_mask, prompt_span
from steerlab.core.request import Request, Sampling, Steer
from steerlab.engine.local import prefix
from steerlab.engine.vllm.params import cache_salt, expected_tokens

SITE = "blocks.1.hook_resid_pre"


@pytest.mark.parametrize(
    ("given", "canonical"),
    [("first:3+last:3", "first:3+last:3"), ("last:2+first:1", "first:1+last:2"),
     ("last:4", "last:4"), ("first:1", "first:1"), ("first:2 + last:2", "first:2+last:2")],
)  # fmt: skip
def test_a_span_is_spelt_one_way(given, canonical):
    assert sl.Steer(SITE, torch.ones(4), positions=given).positions == canonical


@pytest.mark.parametrize("bad", ["first:0", "first:2+first:3", "middle:2", "first:", "f3+l3",
                                 "last:-1", "first:1+last:1+last:2", "first:1.5"])  # fmt: skip
def test_a_bad_span_is_refused_by_name(bad):
    with pytest.raises(sl.SteerError, match="first:3\\+last:3"):
        sl.Steer(SITE, torch.ones(4), positions=bad)


def test_the_mask_is_the_first_and_last_prompt_tokens_pads_and_generated_excluded():
    pos = torch.tensor([[-1, -1, 0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5, 6, 7]])
    prompt_len = torch.tensor([[4], [7]])
    got = position_mask("first:1+last:2", pos, pos >= prompt_len, prompt_len)
    want = torch.tensor([[0, 0, 1, 0, 1, 1, 0, 0], [1, 0, 0, 0, 0, 1, 1, 0]], dtype=torch.bool)
    assert torch.equal(got, want)
    short = position_mask("first:3+last:3", torch.arange(4), None, 2)  # overlapping sides
    assert short.tolist() == [True, True, False, False]
    as_numpy = position_mask("first:1+last:2", pos.numpy(), None, prompt_len.numpy())
    assert np.array_equal(as_numpy, want.numpy())  # vLLM's worker reads numpy
    with pytest.raises(sl.SteerError, match="prompt length"):
        position_mask("last:2", pos, pos >= 0)


def test_the_data_form_never_touches_generated_tokens():
    assert prompt_span("first:3+last:3") == (3, 3) and prompt_span(3) is None
    assert position_form("last:2") == (True, False, 0)  # the compiled decode step's view


ALPHAS = [3.0, 0.0, -3.0]  # the first row of a group feeds the shared prefix


@pytest.mark.parametrize("positions", ["last:1", "first:1+last:1"])
def test_rows_sharing_a_prompt_see_the_whole_prompts_length(toy_lm, positions):
    """Sharing feeds the prompt minus its last token first: a span must still count the
    whole prompt, so shared and unshared rows agree token for token."""
    steer = sl.Steer("blocks.2.hook_resid_post", 30 * torch.randn(128), alpha=ALPHAS,
                     positions=positions)  # fmt: skip
    prompts = ["Once upon a time", "The happy fox"]
    toy_lm.engine.share_prefix = False
    try:
        alone = toy_lm.generate(prompts, steer, max_new_tokens=6, stop_at_eos=False)
    finally:
        toy_lm.engine.share_prefix = True
    together = toy_lm.generate(prompts, steer, max_new_tokens=6, stop_at_eos=False)
    assert together.tokens == alone.tokens
    assert len(set(map(tuple, alone.tokens))) > 2  # the steer changes the text
    shared = prefix.group_size(
        [
            Request((5, 6, 7), (Steer(SITE, torch.ones(128), a, positions, sl.Add()),))
            for a in ALPHAS
        ]  # fmt: skip
    )
    assert shared == (3 if positions == "last:1" else None)  # "first:1" touches the prefix


def test_the_chat_key_marks_the_turns_prompt_span():
    steer = Steer(SITE, torch.ones(4), 1.0, "first:1+last:2", sl.Add())
    flags = [False] * 6 + [True] * 2  # a six-token prompt, then two generated tokens
    marks = touches([steer], flags, prompt_len=6)
    assert [bool(m) for m in marks] == [True, False, False, False, True, True, False, False]
    longer = touches([steer], flags + [False] * 3, prompt_len=11)  # the next turn's prompt
    assert [bool(m) for m in longer][:6] == [True, False, False, False, False, False]


def test_vllms_salt_and_count_follow_the_prompt_length():
    def request(prompt):
        steer = Steer(SITE, torch.ones(4), 2.0, "last:2", sl.Add())
        return Request(prompt, (steer,), Sampling(max_new_tokens=4), "s")

    assert cache_salt(request((5, 6, 7)), "") != cache_salt(request((5, 6, 7, 8)), "")
    assert expected_tokens(request((5, 6, 7, 8)), cached=0, generated=3) == 2
