"""A stop string is cut from ``token_ids`` as from ``text`` (issue 21): the tokens kept are
those wholly before the stop string; one that runs into it is dropped, though its text before
the stop string stays in ``text``. Logprobs, usage and the stream agree, in-process too."""

from __future__ import annotations

import pytest
from server_helpers import post, served, sse

import steerlab as sl

MODEL = "steerlab-tiny"
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def url(toy_lm):
    with served(toy_lm) as address:
        yield address


@pytest.fixture(scope="module")
def free(url):
    """The greedy completion with no stop, and where each of its tokens' text begins."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    choice = post(url, "/v1/completions", body).json()["choices"][0]
    return body, choice["text"], choice["token_ids"]


def _pieces(lm, ids):
    return [lm.tokenizer.decode([t], skip_special_tokens=True) for t in ids]


def _case(lm, text, ids, straddle):
    """A stop string beginning at a token's first character (or its second, ``straddle``),
    its first occurrence in the text: (stop, the token's index, where the stop begins)."""
    pieces, at = _pieces(lm, ids), 0
    for k, piece in enumerate(pieces):
        start = at + (1 if straddle else 0)
        stop = text[start : at + len(piece) + 2]
        if len(piece) >= 3 and k > 0 and text.find(stop) == start:
            return stop, k, start
        at += len(piece)
    raise AssertionError(f"no token to stop at in {text!r}")


@pytest.mark.parametrize("straddle", [False, True], ids=["at a token", "inside a token"])
def test_token_ids_end_before_the_stop_string(url, free, toy_lm, straddle):
    body, text, ids = free
    stop, k, start = _case(toy_lm, text, ids, straddle)
    reply = post(url, "/v1/completions", {**body, "stop": [stop], "logprobs": 2}).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["text"] == text[:start]
    assert choice["token_ids"] == ids[:k]  # a token running into the stop string is dropped
    decoded = toy_lm.tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert choice["text"].startswith(decoded)
    assert len(choice["text"]) - len(decoded) == (1 if straddle else 0)  # its text before the stop
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == k
    assert reply["usage"]["completion_tokens"] == k
    events = sse(post(url, "/v1/completions", {**body, "stop": [stop], "stream": True}))
    assert sum((e["choices"][0]["token_ids"] for e in events), []) == ids[:k]
    assert "".join(e["choices"][0]["text"] for e in events) == text[:start]


def test_in_process_generate_and_stream_cut_tokens_the_same_way(url, free, toy_lm):
    body, text, ids = free
    stop, k, start = _case(toy_lm, text, ids, straddle=True)
    local = toy_lm.generate(PROMPT, max_new_tokens=24, temperature=0, stop_at_eos=False, stop=stop)
    assert local.tokens[0] == ids[:k] and len(local.logprobs[0]) == k
    assert local.text[0] == text[:start] and local.finish_reasons[0] == "stop"
    steps = list(toy_lm.stream(PROMPT, max_new_tokens=24, temperature=0, stop_at_eos=False,
                               stop=stop))  # fmt: skip
    assert steps[-1].result().tokens == local.tokens
    remote = sl.connect(url, api_key="test-key").generate(
        PROMPT, max_new_tokens=24, temperature=0, stop_at_eos=False, stop=stop)  # fmt: skip
    assert remote.tokens == local.tokens and remote.text == local.text


def test_chat_token_ids_and_logprobs_end_before_the_stop_string(url, toy_lm):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
            "max_tokens": 24, "temperature": 0, "ignore_eos": True, "logprobs": True}  # fmt: skip
    whole = post(url, "/v1/chat/completions", body).json()["choices"][0]
    stop, k, start = _case(toy_lm, whole["message"]["content"], whole["token_ids"], True)
    reply = post(url, "/v1/chat/completions", {**body, "stop": stop}).json()
    choice = reply["choices"][0]
    assert choice["token_ids"] == whole["token_ids"][:k]
    assert len(choice["logprobs"]["content"]) == k == reply["usage"]["completion_tokens"]
    assert choice["message"]["content"] == whole["message"]["content"][:start]
