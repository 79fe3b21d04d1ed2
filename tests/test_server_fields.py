"""Every request field is honoured or refused with a 400 that names it: a typo never
silently changes what runs (issue 21). vLLM's penalties, ``logit_bias`` and ``min_tokens``
are honoured, each as ``lm.generate`` applies it (``test_penalties.py`` checks that against
HF's logits processors)."""

from __future__ import annotations

import pytest
from server_helpers import KEY, post, served, sse

import steerlab as sl

BODY = {"model": "steerlab-tiny", "prompt": "Once upon a time", "max_tokens": 4,
        "temperature": 0}  # fmt: skip
CHAT = {"model": "steerlab-tiny", "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4, "temperature": 0}  # fmt: skip


@pytest.fixture(scope="module")
def lm():
    return sl.load("steerlab-tiny", backend="hf")


@pytest.fixture(scope="module")
def url(lm):
    with served(lm) as address:
        yield address


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("steer", [{"site": "blocks.2.hook_resid_pre", "vector": [0.0] * 128}]),  # a typo
        ("best_of", 2), ("suffix", "!"), ("response_format", {"type": "json_object"}),
        ("tools", []), ("chat_template_kwargs", {}),
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


ENDS_EARLY = ("Once upon a time, there was a little cat called Finn. The sea was lovely and full "
              "of joy. The sail was bright, and Lily laughed.")  # fmt: skip
HONOURED = [  # a request's settings, and lm.generate's keywords for them
    ({"repetition_penalty": 1.5}, {"repetition_penalty": 1.5}),
    ({"frequency_penalty": 1.0, "presence_penalty": 0.5},
     {"frequency_penalty": 1.0, "presence_penalty": 0.5}),
    ({"presence_penalty": 2.0}, {"presence_penalty": 2.0}),
    ({"logit_bias": {"262": 100}}, {"logit_bias": {262: 100.0}}),
    ({"logit_bias": {"17": -100}}, {"logit_bias": {17: -100.0}}),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "keywords"), HONOURED)
def test_penalties_and_logit_bias_are_honoured_as_lm_generate(url, lm, fields, keywords):
    body = {**BODY, "max_tokens": 24}
    got = post(url, "/v1/completions", {**body, **fields})
    assert got.status_code == 200, got.text
    choice = got.json()["choices"][0]
    want = lm.generate(body["prompt"], max_new_tokens=24, **keywords)
    plain = lm.generate(body["prompt"], max_new_tokens=24)
    assert choice["token_ids"] == want.tokens[0] != plain.tokens[0]
    assert choice["text"] == want.text[0]


def test_logit_bias_100_forces_its_token_everywhere(url):
    got = post(url, "/v1/completions", {**BODY, "logit_bias": {"262": 100}}).json()
    assert got["choices"][0]["token_ids"] == [262] * BODY["max_tokens"]


def test_min_tokens_holds_eos_back(url, lm):
    body = {**BODY, "prompt": ENDS_EARLY, "max_tokens": 40}
    plain = post(url, "/v1/completions", body).json()["choices"][0]
    held = post(url, "/v1/completions", {**body, "min_tokens": 30}).json()["choices"][0]
    assert plain["finish_reason"] == "stop" and len(plain["token_ids"]) < 30
    assert len(held["token_ids"]) >= 30
    assert held["token_ids"] == lm.generate(ENDS_EARLY, max_new_tokens=40, min_tokens=30).tokens[0]


def test_a_stream_with_min_tokens_streams_past_a_stop_string_it_does_not_match(url, lm):
    body = {**BODY, "max_tokens": 30, "stop": ".", "min_tokens": 12}
    whole = post(url, "/v1/completions", body).json()["choices"][0]
    want = lm.generate(BODY["prompt"], max_new_tokens=30, stop=".", min_tokens=12)
    assert whole["text"] == want.text[0] and whole["text"].count(".") == 1
    events = sse(post(url, "/v1/completions", {**body, "stream": True}))
    texts = [e["choices"][0]["text"] for e in events]
    assert "".join(texts) == whole["text"]
    assert "." in "".join(texts[:-1])  # sent as it came, not held back to the end


def test_chat_and_batch_items_honour_them_too(url, lm):
    chat = post(url, "/v1/chat/completions", {**CHAT, "max_tokens": 16, "repetition_penalty": 1.5})
    messages = CHAT["messages"]
    want = lm.generate([messages], max_new_tokens=16, chat=True, repetition_penalty=1.5)
    assert chat.json()["choices"][0]["message"]["content"] == want.text[0]
    body = {"model": "steerlab-tiny", "max_tokens": 24, "prompts": [
        {"prompt": "Once upon a time", "presence_penalty": 2.0}, "Once upon a time"]}  # fmt: skip
    rows = [r["rows"][0]["token_ids"] for r in post(url, "/v1/batch", body).json()["results"]]
    assert rows[0] == lm.generate("Once upon a time", max_new_tokens=24,
                                  presence_penalty=2.0).tokens[0]  # fmt: skip
    assert rows[1] == lm.generate("Once upon a time", max_new_tokens=24).tokens[0] != rows[0]
    shared = post(url, "/v1/batch", {**body, "prompts": ["Hi"], "logit_bias": {"262": 100}})
    assert shared.json()["results"][0]["rows"][0]["token_ids"] == [262] * 24


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"presence_penalty": True}, "presence_penalty"),
        ({"frequency_penalty": "1"}, "frequency_penalty"),
        ({"logit_bias": {"99999": 1}}, "logit_bias"),
        ({"logit_bias": {"678": 1}}, "logit_bias"),  # the toy's vocabulary is [0, 678)
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"-5": 1}}, "logit_bias"),
        ({"logit_bias": {"5": True}}, "logit_bias"),
        ({"logit_bias": [5, 1]}, "logit_bias"),
        ({"min_tokens": 5}, "min_tokens"),  # max_tokens is 4
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 1.5}, "min_tokens"),
        ({"min_tokens": True}, "min_tokens"),
    ],
)
def test_bad_penalty_bias_and_min_tokens_values_are_a_400_naming_the_field(url, fields, param):
    for path, body in (("/v1/completions", BODY), ("/v1/chat/completions", CHAT)):
        response = post(url, path, {**body, **fields})
        assert response.status_code == 400, (path, fields, response.text)
        assert response.json()["error"]["param"].startswith(param), response.text


def test_connect_takes_them_as_lm_generate_does(url, lm):
    kwargs = dict(max_new_tokens=24, repetition_penalty=1.3, presence_penalty=0.5,
                  logit_bias={17: -100.0}, min_tokens=20)  # fmt: skip
    remote = sl.connect(url, api_key=KEY).generate(["Once upon a time", "Hi"], **kwargs)
    assert remote.tokens == lm.generate(["Once upon a time", "Hi"], **kwargs).tokens
