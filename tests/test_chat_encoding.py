"""Encoding a conversation turn by turn gives the ids of rendering it whole.

Checked on the toy model's template and on two real templates saved in
``chat_templates.py`` (Llama-3 and ChatML), with each reply cached as the model would
produce it: its tokens, then EOS. Where a template rewrites a reply, the turn re-feeds
from the first differing token, and the session still equals recomputing.
"""

from __future__ import annotations

import pytest
from chat_templates import template_tokenizer
from transformers import AutoTokenizer

import steerlab as sl
from steerlab.chat.encoding import as_messages, common_prefix, render
from steerlab.core.prompts import PromptError, encode
from steerlab.toy import asset_path

EXCHANGES = [
    ("Tell me a story.", "Once upon a time, a fox found a boat."),
    ("What then?", "It sailed to the sea, and it was happy."),
    ("And the end?", "The fox slept under the stars."),
]


def tokenizer(style: str):
    if style == "toy":
        return AutoTokenizer.from_pretrained(asset_path("steerlab-tiny"))
    return template_tokenizer(style)


@pytest.mark.parametrize("style", ["toy", "llama3", "chatml"])
def test_turn_by_turn_equals_the_whole_rendering(style):
    tok = tokenizer(style)
    conversation = [{"role": "system", "content": "You are a storyteller."}]
    cached = render(tok, conversation, generation_prompt=False)
    for user, reply in EXCHANGES:
        conversation.append({"role": "user", "content": user})
        whole = render(tok, conversation, generation_prompt=True)
        assert whole == encode(tok, conversation, chat=True)  # what lm.generate(chat=True) feeds
        assert common_prefix(cached, whole) == len(cached)  # nothing cached is fed again
        added = tok.decode(whole[len(cached) :])
        assert user in added and reply not in added  # the turn adds only its own message
        cached = whole + tok(reply, add_special_tokens=False).input_ids + [tok.eos_token_id]
        conversation.append({"role": "assistant", "content": reply})
    assert whole.count(tok.bos_token_id) == (0 if style == "chatml" else 1)


def test_a_template_that_trims_replies_differs_from_the_reply_as_generated():
    tok = tokenizer("llama3")  # its template applies `| trim` to every message
    conversation = [{"role": "user", "content": "Hi"}]
    prompt = render(tok, conversation, generation_prompt=True)
    reply = " Hello! "  # as generated, with spaces the template will trim
    cached = prompt + tok(reply, add_special_tokens=False).input_ids + [tok.eos_token_id]
    conversation += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Bye"}]
    whole = render(tok, conversation, generation_prompt=True)
    assert common_prefix(cached, whole) == len(prompt)  # re-fed from the reply's first token


def test_a_reply_cut_at_a_stop_string_is_fed_again_from_the_cut():
    lm = sl.load("steerlab-tiny", backend="hf")
    chat = lm.chat(system="You are a storyteller.")
    first = chat.say("Tell me a story.", max_new_tokens=30, stop=".")
    assert first.finish_reasons == ["stop"]
    cached = chat.cache_length
    second = chat.say("What then?", max_new_tokens=8)
    assert chat.stats[-1].reused < cached  # the stop string's tokens were not in the text
    assert second.tokens == lm.generate(chat.history[:-1], chat=True, max_new_tokens=8).tokens


def test_messages_are_checked():
    assert as_messages("hi") == [{"role": "user", "content": "hi"}]
    assert as_messages({"role": "tool", "content": "42"}) == [{"role": "tool", "content": "42"}]
    for bad, match in [
        ({"content": "x"}, "no 'role'"),
        ({"role": "user"}, "no 'content'"),
        ({"role": "", "content": "x"}, "has role ''; roles are"),
        ({"role": "user", "content": ["x"]}, "content part 0 is 'str'"),
        ("", None),
        ([], "empty list of messages"),
        (["hi"], "must be a dict"),
    ]:
        if match is None:
            assert as_messages(bad) == [{"role": "user", "content": ""}]
            continue
        with pytest.raises(PromptError, match=match):
            as_messages(bad)
