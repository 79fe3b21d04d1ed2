"""``steerlab serve --backend vllm``: the steering server decoding on vLLM (the session's toy
engine). Greedy rows equal plain HF with hooks; concurrent requests share vLLM's batch and
each still equals its own reference; bad requests fail before vLLM sees them."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import torch
from reference import RefSteer, greedy

import steerlab as sl
from steerlab import cli
from steerlab.server import Limits, ServedModels, create_app
from steerlab.server.background import serve_in_background

KEY = "vllm-test-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
MODEL = "steerlab-tiny"
SITE = "blocks.1.hook_resid_pre"


def _serve(lm):
    app = create_app(ServedModels(lm), name=MODEL, api_key=KEY,
                     limits=Limits(max_n=4, max_rows=32), window_ms=50)  # fmt: skip
    with serve_in_background(app) as url:
        yield url, app.state.steerlab.batcher


@pytest.fixture(scope="module")
def server(lm):
    yield from _serve(lm)


@pytest.fixture(scope="module")
def eager_server(eager):
    """The same server on the eager engine (conditions and monitors run eagerly only)."""
    yield from _serve(eager)


def _vec(seed: int, scale: float = 0.4) -> torch.Tensor:
    return torch.randn(128, generator=torch.Generator().manual_seed(seed)) * scale


def _post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, headers=HEADERS, timeout=120)


def _steering(vector, alpha, positions="all"):
    item = {"site": SITE, "vector": vector.tolist(), "positions": positions}
    return [item if alpha is None else {**item, "alpha": alpha}]


def test_steered_batch_rows_equal_hf_with_hooks(server, lm, hf):
    url, _ = server
    v = _vec(0)
    prompts = ["Once upon a time", "A cat"]
    body = {"model": MODEL, "prompts": prompts, "max_tokens": 12, "temperature": 0,
            "alphas": [0.0, 3.0], "steering": _steering(v, None, "generated")}  # fmt: skip
    reply = _post(url, "/v1/batch", body)
    assert reply.status_code == 200, reply.text
    results = reply.json()["results"]
    for prompt, result in zip(prompts, results):
        ids = lm.tokenizer(prompt)["input_ids"]
        tokens = [row["token_ids"] for row in result["rows"]]
        for alpha, got in zip((0.0, 3.0), tokens):
            ref = [RefSteer(SITE, v, alpha, "generated")]
            assert got == greedy(hf, ids, ref, 12, lm.eos_ids), (prompt, alpha)
        assert tokens[0] != tokens[1]  # the steer changes the text
    assert lm.hook_count() == 0


def test_streamed_text_joins_to_the_whole(server, lm):
    url, _ = server
    body = {"model": MODEL, "prompt": "The sea was", "max_tokens": 10, "temperature": 1.0,
            "seed": 3, "steering": _steering(_vec(1), 2.0)}  # fmt: skip
    whole = _post(url, "/v1/completions", body).json()["choices"][0]
    streamed = _post(url, "/v1/completions", {**body, "stream": True}).text
    events = [json.loads(line[6:]) for line in streamed.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]  # fmt: skip
    assert "".join(e["choices"][0]["text"] for e in events) == whole["text"]
    local = lm.generate("The sea was", sl.Steer(SITE, _vec(1), alpha=2.0), max_new_tokens=10,
                        temperature=1.0, seed=3)  # fmt: skip
    assert whole["token_ids"] == local.tokens[0]  # a seed reproduces vLLM's own sampling


def test_concurrent_requests_batch_together_and_each_equals_its_reference(server, lm, hf):
    url, batcher = server
    rows = [("Once upon a time", 0.0), ("A cat", 2.0), ("The sea was", -2.0),
            ("Tell me a story.", 4.0), ("A cat", 0.0), ("Once upon a time", 1.5)]  # fmt: skip
    v = _vec(2)
    replies: dict[int, httpx.Response] = {}

    def ask(i: int) -> None:
        prompt, alpha = rows[i]
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 10, "temperature": 0,
                "steering": _steering(v, alpha)}  # fmt: skip
        replies[i] = _post(url, "/v1/completions", body)

    before = batcher.batches
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(rows))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert batcher.batches - before < len(rows)  # at least two requests shared a batch
    for i, (prompt, alpha) in enumerate(rows):
        assert replies[i].status_code == 200, replies[i].text
        ids = lm.tokenizer(prompt)["input_ids"]
        expected = greedy(hf, ids, [RefSteer(SITE, v, alpha)], 10, lm.eos_ids)
        assert replies[i].json()["choices"][0]["token_ids"] == expected, i


def test_a_request_joins_a_running_batch_and_is_answered_first(server, lm, hf):
    url, batcher = server
    v, w = _vec(3), _vec(4)
    long = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 100, "temperature": 0,
            "ignore_eos": True, "steering": _steering(v, 2.0)}  # fmt: skip
    short = {"model": MODEL, "prompt": "A cat", "max_tokens": 4, "temperature": 0,
             "steering": [{"site": "blocks.2.hook_resid_post", "vector": w.tolist(),
                           "alpha": -2.0, "positions": "generated"}]}  # fmt: skip
    answered: dict[str, tuple[httpx.Response, float]] = {}

    def ask(name: str, body: dict) -> None:
        answered[name] = (_post(url, "/v1/completions", body), time.monotonic())

    before = batcher.batches
    first = threading.Thread(target=ask, args=("long", long))
    first.start()
    deadline = time.monotonic() + 30
    while batcher.batches == before and time.monotonic() < deadline:  # decoding has begun
        time.sleep(0.01)
    ask("short", short)
    first.join()
    assert batcher.batches - before == 1  # one batch: the short request joined the long one
    assert answered["short"][1] < answered["long"][1]
    got = {k: r.json()["choices"][0]["token_ids"] for k, (r, _) in answered.items()}
    ids = {k: lm.tokenizer(body["prompt"])["input_ids"] for k, body in (("long", long),
                                                                      ("short", short))}  # fmt: skip
    assert got["long"] == greedy(hf, ids["long"], [RefSteer(SITE, v, 2.0)], 100, set())
    ref = [RefSteer("blocks.2.hook_resid_post", w, -2.0, "generated")]
    assert got["short"] == greedy(hf, ids["short"], ref, 4, lm.eos_ids)
    assert lm.hook_count() == 0


def test_a_stop_string_never_reaches_the_stream(server, lm):
    """A steered row that ends at a stop string is held until checked; the stream must
    still end before the stop string, as the whole answer does."""
    url, _ = server
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0,
            "steering": _steering(_vec(5), 2.0)}  # fmt: skip
    free = _post(url, "/v1/completions", body).json()["choices"][0]["text"]
    stop = free.split()[len(free.split()) // 2]  # a word from the middle of the reply
    whole = _post(url, "/v1/completions", {**body, "stop": [stop]}).json()["choices"][0]
    assert whole["finish_reason"] == "stop" and stop not in whole["text"]
    streamed = _post(url, "/v1/completions", {**body, "stop": [stop], "stream": True}).text
    events = [json.loads(line[6:]) for line in streamed.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]  # fmt: skip
    assert "".join(e["choices"][0]["text"] for e in events) == whole["text"]
    steps = list(lm.stream("Once upon a time", sl.Steer(SITE, _vec(5), alpha=2.0),
                           max_new_tokens=24, stop=[stop]))  # fmt: skip
    assert "".join(s.new_text[0] for s in steps) == whole["text"]


def test_hooks_that_never_ran_are_a_500_not_unsteered_text(server, lm):
    url, _ = server
    lm.engine.rpc("steerlab_attach", False)  # as if the model had been compiled first
    try:
        body = {"model": MODEL, "prompt": "A cat", "max_tokens": 6, "temperature": 0,
                "steering": _steering(_vec(6), 2.0)}  # fmt: skip
        reply = _post(url, "/v1/completions", body)
        assert reply.status_code == 500 and "did not run" in reply.json()["error"]["message"]
        plain = _post(url, "/v1/completions", {**body, "steering": []})
        assert plain.status_code == 200  # an unsteered request still works
    finally:
        lm.engine.rpc("steerlab_attach")
    assert lm.hook_count() == 0


@pytest.mark.parametrize(
    ("steering", "field"),
    [
        ([{"site": "blocks.9.hook_resid_pre", "vector": [0.0] * 128}], "steering[0].site"),
        ([{"site": SITE, "vector": [0.0] * 7}], "steering[0].vector"),
        ([{"site": SITE, "vector": [0.0] * 128, "op": "rotate"}], "steering[0].op"),
    ],
)
def test_bad_steering_is_a_400_before_vllm_sees_it(server, lm, monkeypatch, steering, field):
    url, _ = server
    sent = []
    monkeypatch.setattr(lm.engine.llm.llm_engine, "add_request", lambda *a, **k: sent.append(a))
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 4, "steering": steering}
    reply = _post(url, "/v1/completions", body)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == field
    assert sent == []


def test_the_command_line_loads_vllm_and_serves(lm, monkeypatch):
    loads, apps = [], []

    def load(name, **options):
        loads.append((name, options))
        return lm

    monkeypatch.setattr("steerlab.loading.load", load)

    class Server:  # records what `steerlab serve` would run, instead of serving on a port
        def __init__(self, config):
            apps.append((config.app, {"host": config.host, "port": config.port}))

        def run(self, sockets=None):
            pass

    argv = ["serve", MODEL, "--backend", "vllm", "--tensor-parallel-size", "1",
            "--max-model-len", "128", "--api-key", KEY]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:  # the real Server again for serve_in_background
        # `steerlab serve` binds its port before loading the model, then runs uvicorn on that
        # socket through connections.BoundServer
        patch.setattr("steerlab.server.connections.BoundServer", Server)
        assert cli.main(argv) == 0
    assert loads == [(MODEL, {"backend": "vllm", "device": None, "dtype": None,
                              "tensor_parallel_size": 1, "max_model_len": 128})]  # fmt: skip
    ((app, kw),) = apps
    assert kw["host"] == "127.0.0.1"
    with serve_in_background(app) as url:
        body = {"model": MODEL, "prompt": "A cat", "max_tokens": 6, "temperature": 0}
        reply = _post(url, "/v1/completions", body)
    local = lm.generate("A cat", max_new_tokens=6)
    assert reply.json()["choices"][0]["token_ids"] == local.tokens[0]


def test_conditions_and_monitors_through_the_server_on_vllm(server, eager_server, lm, hf):
    """A conditioned steering entry and a monitor, answered from vLLM's workers, compiled
    and eager: the same decisions, scores and traces as the local engine gives, in full
    and streamed."""
    from reads_parity import PROMPTS, cast, condition, median_threshold, steer_of

    ref = cast(median_threshold(lm, hf))
    steer = steer_of(ref, condition(ref))
    m = _vec(61, 1.0)
    local = sl.load("steerlab-tiny", backend="hf").generate(
        PROMPTS[:4], steer=steer, max_new_tokens=6, stop_at_eos=False,
        monitor={"m": ("blocks.2.hook_resid_post", m)})  # fmt: skip
    body = {"model": MODEL, "prompt": PROMPTS[:4], "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "steering": [steer.to_data()],
            "monitor": [{"name": "m", "site": "blocks.2.hook_resid_post", "vector": m.tolist()}]}  # fmt: skip
    for url in (server[0], eager_server[0]):
        _same_reads(url, body, local)
    assert lm.hook_count() == 0


def _same_reads(url: str, body: dict, local) -> None:
    reply = _post(url, "/v1/completions", body)
    assert reply.status_code == 200, reply.text
    choices = reply.json()["choices"]
    assert [c["text"] for c in choices] == local.text
    assert [c["steerlab"]["fired"] for c in choices] == local.fired.tolist()
    torch.testing.assert_close(torch.tensor([c["steerlab"]["condition_score"] for c in choices]),
                               local.condition_scores)  # fmt: skip
    traces = torch.tensor([c["steerlab"]["monitors"]["m"]["generated"] for c in choices])
    torch.testing.assert_close(traces, local.monitors["m"].generated, atol=1e-4, rtol=1e-4)
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                      headers=HEADERS, timeout=120) as streamed:  # fmt: skip
        events = [json.loads(line[6:]) for line in streamed.iter_lines()
                  if line.startswith("data: {")]  # fmt: skip
    last = [e["choices"][0] for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
    assert sorted((c["index"], c["steerlab"]["fired"]) for c in last) == list(
        enumerate(local.fired.tolist()))  # fmt: skip


def _exact_answers(url: str, lm, hf) -> None:
    """Later requests, plain and steered, short and long prompts: each equal to plain HF."""
    from failures import ALPHA, LONG, NEW, PROMPTS, SITE, VECTOR

    for prompt in (PROMPTS[0], LONG[1]):
        ids = lm.tokenizer(prompt)["input_ids"]
        for steering, ref in (([], []), ([{"site": SITE, "vector": VECTOR.tolist(), "alpha": ALPHA}],
                                         [RefSteer(SITE, VECTOR, ALPHA)])):  # fmt: skip
            body = {"model": MODEL, "prompt": prompt, "max_tokens": NEW, "temperature": 0,
                    "steering": steering}  # fmt: skip
            reply = _post(url, "/v1/completions", body)
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["token_ids"] == greedy(hf, ids, ref, NEW,
                                                                    lm.eos_ids), (prompt, ref)  # fmt: skip
    assert lm.hook_count() == 0


def _began(batcher, before: int) -> None:
    """Wait until the engine thread has started a batch after ``before``."""
    deadline = time.monotonic() + 60
    while batcher.batches == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert batcher.batches > before


@pytest.mark.parametrize("which", ["server", "eager_server"])
def test_an_overflowing_request_between_two_clients_fails_alone(which, request, hf):
    """Issue 49: an overflowing steer sent while two other clients' requests decode (one
    steered, one not) joins their call in vLLM and fails it; the scheduler retries the
    others without it, so they get exact answers, it gets a 422 naming the overflow, and
    later requests are exact. Compiled and eager."""
    url, batcher = request.getfixturevalue(which)
    engine = request.getfixturevalue("lm" if which == "server" else "eager")
    v = _vec(7)
    others = {
        "steered": {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 40,
                    "temperature": 0, "ignore_eos": True, "steering": _steering(v, 2.0)},
        "plain": {"model": MODEL, "prompt": "The sea was", "max_tokens": 40, "temperature": 0,
                  "ignore_eos": True},
    }  # fmt: skip
    overflow = {"model": MODEL, "prompt": "A cat " * 12, "max_tokens": 8, "temperature": 0,
                "steering": [{"site": SITE, "vector": [1e30] * 128, "alpha": 1e8}]}  # fmt: skip
    replies: dict[str, httpx.Response] = {}

    def ask(name: str) -> None:
        replies[name] = _post(url, "/v1/completions", others[name])

    _exact_answers(url, engine, hf)
    before = batcher.batches
    threads = [threading.Thread(target=ask, args=(name,)) for name in others]
    for t in threads:
        t.start()
    _began(batcher, before)
    bad = _post(url, "/v1/completions", overflow)
    for t in threads:
        t.join()
    # It shared a call with them: that call failed, and the halves were retried (a call of
    # its own after theirs would make 2 batches in all).
    assert batcher.batches - before >= 3
    assert bad.status_code == 422, bad.text
    assert "overflows" in bad.json()["error"]["message"]
    assert bad.json()["error"]["param"] == "steering"
    for name, body in others.items():
        assert replies[name].status_code == 200, replies[name].text
        ids = engine.tokenizer(body["prompt"])["input_ids"]
        ref = [RefSteer(SITE, v, 2.0)] if "steering" in body else []
        assert replies[name].json()["choices"][0]["token_ids"] == greedy(hf, ids, ref, 40,
                                                                         set()), name  # fmt: skip
    _exact_answers(url, engine, hf)


@pytest.mark.parametrize("which", ["server", "eager_server"])
def test_a_client_that_leaves_mid_stream_leaves_later_requests_exact(which, request, hf):
    """A client closes a streamed, steered response after its first events: its rows are
    cancelled between steps (the scheduler counts it), and later requests are exact."""
    url, batcher = request.getfixturevalue(which)
    engine = request.getfixturevalue("lm" if which == "server" else "eager")
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 100, "temperature": 0,
            "ignore_eos": True, "stream": True, "steering": _steering(_vec(8), 2.0)}  # fmt: skip
    _exact_answers(url, engine, hf)
    cancelled = batcher.cancelled
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=HEADERS,
                      timeout=120) as streamed:  # fmt: skip
        for line in streamed.iter_lines():
            choices = json.loads(line[6:])["choices"] if line.startswith("data: {") else []
            if choices and choices[0]["text"]:
                break  # a token reached the client: it goes away now
        else:
            pytest.fail("the stream ended before the client could leave it")
    deadline = time.monotonic() + 60
    while batcher.cancelled == cancelled and time.monotonic() < deadline:
        time.sleep(0.05)
    assert batcher.cancelled == cancelled + 1
    _exact_answers(url, engine, hf)
