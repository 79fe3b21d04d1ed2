"""Streams say what the whole response says (issue 21): echo and logprobs streamed chunk by
chunk join to the non-streaming logprobs object, and ``stream_options`` adds usage as OpenAI
and vLLM do."""

from __future__ import annotations

import pytest
from server_helpers import KEY, post, served, sse

MODEL = "steerlab-tiny"
TEXT = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 1.0,
        "seed": 3, "n": 2}  # fmt: skip
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 8, "temperature": 1.0, "seed": 3, "n": 2}  # fmt: skip
LEGACY = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


@pytest.fixture(scope="module")
def url(toy_lm):
    with served(toy_lm) as address:
        yield address


def _rows(events: list[dict]) -> dict[int, list[dict]]:
    rows: dict[int, list[dict]] = {}
    for event in events:
        for choice in event["choices"]:
            rows.setdefault(choice["index"], []).append(choice)
    return rows


@pytest.mark.parametrize(
    "change",
    [{"logprobs": 2}, {"echo": True}, {"echo": True, "logprobs": 3}, {"logprobs": 0, "stop": " "},
     {"echo": True, "logprobs": 1, "max_tokens": 0, "n": 1}],
    ids=["logprobs", "echo", "echo+logprobs", "stop", "score only"],
)  # fmt: skip
def test_streamed_echo_and_logprobs_join_to_the_whole_response(url, change):
    body = {**TEXT, **change}
    whole = post(url, "/v1/completions", body).json()["choices"]
    rows = _rows(sse(post(url, "/v1/completions", {**body, "stream": True})))
    assert len(rows) == len(whole)
    for k, choice in enumerate(whole):
        chunks = rows[k]
        assert "".join(c["text"] for c in chunks) == choice["text"]
        assert sum((c["token_ids"] for c in chunks), []) == choice["token_ids"]
        assert chunks[-1]["finish_reason"] == choice["finish_reason"]
        if body.get("logprobs") is None:
            assert all(c["logprobs"] is None for c in chunks)
            continue
        joined = {key: sum((c["logprobs"][key] for c in chunks), []) for key in LEGACY}
        assert joined == choice["logprobs"]
        if body.get("echo"):  # the prompt comes first, whole, in the first chunk
            assert chunks[0]["text"].startswith(body["prompt"])
            assert chunks[0]["logprobs"]["token_logprobs"][0] is None


def test_streamed_chat_logprobs_with_alternatives_join_to_the_whole_response(url):
    body = {**CHAT, "logprobs": True, "top_logprobs": 3}
    whole = post(url, "/v1/chat/completions", body).json()["choices"]
    rows = _rows(sse(post(url, "/v1/chat/completions", {**body, "stream": True})))
    for k, choice in enumerate(whole):
        chunks = rows[k][1:]  # after the role chunk
        content = sum((c["logprobs"]["content"] for c in chunks if c["logprobs"]), [])
        assert content == choice["logprobs"]["content"]
        assert all(len(e["top_logprobs"]) == 3 for e in content)


BOTH = [("/v1/completions", TEXT), ("/v1/chat/completions", CHAT)]


@pytest.mark.parametrize(("path", "body"), BOTH)
def test_include_usage_adds_a_last_chunk_with_the_whole_usage(url, path, body):
    whole = post(url, path, body).json()
    usage = {"include_usage": True}
    events = sse(post(url, path, {**body, "stream": True, "stream_options": usage}))
    *chunks, last = events
    assert last["choices"] == [] and last["usage"] == whole["usage"]
    assert all("usage" in c and c["usage"] is None for c in chunks)
    plain = sse(post(url, path, {**body, "stream": True}))
    assert all("usage" not in c for c in plain) and plain[-1]["choices"]
    default = sse(post(url, path, {**body, "stream": True, "stream_options": {}}))
    assert default[-1]["choices"] == [] and default[-1]["usage"] == whole["usage"]  # vLLM's default


def test_continuous_usage_stats_give_each_rows_usage_so_far(url):
    options = {"include_usage": True, "continuous_usage_stats": True}
    whole = post(url, "/v1/completions", TEXT).json()
    events = sse(post(url, "/v1/completions", {**TEXT, "stream": True, "stream_options": options}))
    *chunks, last = events
    assert last["usage"] == whole["usage"]
    counts: dict[int, int] = {}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        counts[choice["index"]] = counts.get(choice["index"], 0) + len(choice["token_ids"])
        usage = chunk["usage"]
        assert usage["completion_tokens"] == counts[choice["index"]]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert sum(counts.values()) == whole["usage"]["completion_tokens"]


@pytest.mark.parametrize(
    ("options", "stream", "param"),
    [
        ({"include_usage": True}, False, "stream_options"),
        ({"continuous_usage_stats": True, "include_usage": False}, True,
         "stream_options.continuous_usage_stats"),
        ({"include_usage": True, "usage_every": 2}, True, "stream_options.usage_every"),
    ],
)  # fmt: skip
def test_stream_options_that_cannot_be_honoured_are_a_400_naming_them(url, options, stream, param):
    for path, body in BOTH:
        reply = post(url, path, {**body, "stream": stream, "stream_options": options})
        assert reply.status_code == 400, (path, reply.text)
        assert reply.json()["error"]["param"] == param


def test_the_openai_client_reads_a_streamed_echo_with_logprobs_and_usage(url):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    whole = post(url, "/v1/completions", {**TEXT, "n": 1, "echo": True, "logprobs": 2}).json()
    chunks = list(client.completions.create(model=MODEL, prompt=TEXT["prompt"], max_tokens=8,
                                            temperature=1.0, seed=3, echo=True, logprobs=2,
                                            stream=True, stream_options={"include_usage": True}))  # fmt: skip
    *texts, last = chunks
    assert "".join(c.choices[0].text for c in texts) == whole["choices"][0]["text"]
    tokens = sum((c.choices[0].logprobs.tokens for c in texts), [])
    assert tokens == whole["choices"][0]["logprobs"]["tokens"]
    assert last.choices == [] and last.usage.total_tokens == whole["usage"]["total_tokens"]
