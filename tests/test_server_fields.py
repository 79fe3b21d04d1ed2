"""Every request field is honoured or refused with a 400 that names it: a typo never
silently changes what runs (issue 21, section 1, the refusal half)."""

from __future__ import annotations

import pytest
from server_helpers import post, served

import steerlab as sl

BODY = {"model": "steerlab-tiny", "prompt": "Once upon a time", "max_tokens": 4,
        "temperature": 0}  # fmt: skip
CHAT = {"model": "steerlab-tiny", "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4, "temperature": 0}  # fmt: skip


@pytest.fixture(scope="module")
def url():
    with served(sl.load("steerlab-tiny", backend="hf")) as address:
        yield address


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("steer", [{"site": "blocks.2.hook_resid_pre", "vector": [0.0] * 128}]),  # a typo
        ("best_of", 2), ("suffix", "!"), ("presence_penalty", 0.5), ("frequency_penalty", 0.5),
        ("repetition_penalty", 1.2), ("logit_bias", {"5": 10}), ("min_tokens", 3),
        ("response_format", {"type": "json_object"}), ("tools", []),
        ("chat_template_kwargs", {}),
    ],
)  # fmt: skip
def test_fields_steerlab_does_not_do_exactly_are_a_400_naming_them(url, field, value):
    for path, body in (("/v1/completions", BODY), ("/v1/chat/completions", CHAT)):
        response = post(url, path, {**body, field: value})
        assert response.status_code == 400, (path, field, response.text)
        assert response.json()["error"]["param"] == field


def test_echo_is_honoured_not_ignored(url):
    plain = post(url, "/v1/completions", BODY).json()["choices"][0]["text"]
    echoed = post(url, "/v1/completions", {**BODY, "echo": True}).json()["choices"][0]["text"]
    assert echoed == BODY["prompt"] + plain


def test_user_and_metadata_are_accepted_and_change_nothing(url):
    plain = post(url, "/v1/completions", BODY).json()["choices"][0]["text"]
    tagged = post(url, "/v1/completions", {**BODY, "user": "me", "metadata": {"run": "1"}})
    assert tagged.status_code == 200 and tagged.json()["choices"][0]["text"] == plain


def test_chat_content_as_text_parts_equals_the_joined_text(url):
    parts = {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "H"}, {"type": "text", "text": "i"}]}]}  # fmt: skip
    got = post(url, "/v1/chat/completions", parts)
    assert got.status_code == 200, got.text
    want = post(url, "/v1/chat/completions", CHAT).json()["choices"][0]["message"]["content"]
    assert got.json()["choices"][0]["message"]["content"] == want
    image = {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
    refused = post(url, "/v1/chat/completions", image)
    assert refused.status_code == 400 and "'image_url'" in refused.json()["error"]["message"]
