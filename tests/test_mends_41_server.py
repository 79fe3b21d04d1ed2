"""Issue 41, the server's part: stalled uploads delay no one, the prompt store holds its
bound, malformed conditions are 400s naming their field, quiet idle closes, one-line CLI
failures."""

from __future__ import annotations

import gc
import json
import logging
import re
import socket
import sys
import time
from pathlib import Path
from types import FunctionType, ModuleType

import pytest
import torch
from fastapi.testclient import TestClient
from server_helpers import post, served

from steerlab import cli, loading
from steerlab.core.request import Request, Sampling
from steerlab.engine.local.prompt_store import PromptStore
from steerlab.server import ServedModels, create_app

MODEL = "steerlab-tiny"
SITE = "blocks.2.hook_resid_pre"
COND_SITE = "blocks.1.hook_resid_pre"


def _bodies(steer: dict) -> list[tuple[str, dict, str]]:
    """One request per endpoint that takes steering, and where its steering is."""
    chat = [{"role": "user", "content": "hi"}]
    return [("/v1/completions", {"model": MODEL, "prompt": "Once", "max_tokens": 2,
                                 "steering": [steer]}, "steering[0]"),
            ("/v1/chat/completions", {"model": MODEL, "messages": chat, "max_tokens": 2,
                                      "steering": [steer]}, "steering[0]"),
            ("/v1/batch", {"model": MODEL, "prompts": ["Once"], "max_tokens": 2,
                           "steering": [steer]}, "steering[0]"),
            ("/v1/batch", {"model": MODEL, "prompts": ["Hi", {"prompt": "Once",
                                                               "steering": [steer]}],
                           "max_tokens": 2}, "prompts[1].steering[0]")]  # fmt: skip


@pytest.fixture(scope="module")
def app_client(toy_lm):
    with TestClient(create_app(ServedModels(toy_lm)), raise_server_exceptions=False) as client:
        yield client


def _conditions(d: int) -> list[tuple[dict, str, str]]:
    """(condition, its param after ``.when``, a word of the message) for every malformed kind."""
    ok = {"site": COND_SITE, "vector": [0.1] * d, "threshold": 0.0}
    return [({**ok, "vector": []}, "vector", "empty"),
            ({**ok, "site": "resid"}, "site", "resid"),
            ({**ok, "site": "blocks.99.hook_resid_pre"}, "site", "blocks.99"),
            ({**ok, "vector": [0.1] * (d + 1)}, "vector", "d_model"),
            ({**ok, "vector": [0.1] * (d - 1)}, "vector", "d_model"),
            ({"any_of": [ok, {**ok, "site": "resid"}]}, "any_of[1].site", "resid"),
            ({"any_of": [{"all_of": [{**ok, "vector": [1.0] * 3}]}]},
             "any_of[0].all_of[0].vector", "d_model"),
            ({**ok, "threshold": "x"}, "threshold", "threshold"),
            ({**ok, "compare": "~"}, "compare", "compare"),
            ({**ok, "read": "zzz"}, "read", "read"),
            ({**ok, "zz": 1}, "zz", "zz")]  # fmt: skip


def test_a_malformed_condition_is_a_400_naming_its_field_on_every_endpoint(app_client, toy_lm):
    """A condition with an unknown site or a vector of the wrong width was a plain-text 500
    (``site: "resid"``), or a 400 blaming ``prompt`` (a width off by one)."""
    for condition, field, word in _conditions(toy_lm.d_model):
        steer = {"site": SITE, "vector": [0.1] * toy_lm.d_model, "alpha": 1.0, "when": condition}
        for path, body, where in _bodies(steer):
            reply = app_client.post(path, json=body)
            assert reply.status_code == 400, (path, condition, reply.text[:200])
            error = reply.json()["error"]
            assert error["param"] == f"{where}.when.{field}", (path, condition, error)
            assert word in error["message"], error


def test_a_malformed_steer_is_a_400_naming_its_field(app_client, toy_lm):
    d = toy_lm.d_model
    ok = {"site": SITE, "vector": [0.1] * d, "alpha": 1.0}
    for steer, field in [({**ok, "site": "resid"}, "site"), ({**ok, "vector": [0.1] * (d + 1)},
                         "vector"), ({**ok, "vector": []}, "vector"), ({**ok, "op": "zz"}, "op"),
                         ({**ok, "positions": "zz"}, "positions"), ({**ok, "alpha": []}, "alpha"),
                         ({"vector": [0.1] * d}, "site")]:  # fmt: skip
        for path, body, where in _bodies(steer):
            reply = app_client.post(path, json=body)
            assert reply.status_code == 400, (path, steer, reply.text[:200])
            assert reply.json()["error"]["param"] == f"{where}.{field}"


WINDOW_MS = 4000.0  # a long batching window: a request that waits it out is plain to see


def _stall(url: str, body: bytes, path: str = "/v1/completions") -> socket.socket:
    """A client that sends the headers and the first half of ``body``, then stalls."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer test-key\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body[: len(body) // 2])
    return sock


def test_clients_stalled_mid_body_keep_no_batch_waiting(toy_lm):
    """20 clients that send headers and half a body, then stall, were each announced to the
    batching window: every later batch waited the whole window out for them (2 s for a
    2-token completion). A request is announced once its body is whole; a stalled one, when
    it does finish, is still answered."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2, "temperature": 0}
    raw = json.dumps(body).encode()
    with served(toy_lm, window_ms=WINDOW_MS, idle_timeout=60) as url:
        assert post(url, "/v1/completions", body).status_code == 200  # warm
        stalled = [_stall(url, raw) for _ in range(20)]
        try:
            time.sleep(0.3)  # the server has read every head and half-body
            start = time.perf_counter()
            assert post(url, "/v1/completions", body).status_code == 200
            beside = time.perf_counter() - start
            stalled[0].sendall(raw[len(raw) // 2 :])  # one finishes its body: answered
            stalled[0].settimeout(60)
            assert stalled[0].recv(4096).startswith(b"HTTP/1.1 200")
        finally:
            for sock in stalled:
                sock.close()
    assert beside < WINDOW_MS / 1000 / 2, f"{beside:.2f} s: the request waited out the window"


def _true_bytes(root: object) -> int:
    """What ``root`` holds, found by the garbage collector's own references (not the store's
    measure): each object's ``sys.getsizeof`` once, and each tensor storage's bytes once."""
    seen, storages, total, todo = set(), set(), 0, [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (type, ModuleType, FunctionType)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, torch.Tensor) and obj.untyped_storage().data_ptr() not in storages:
            storages.add(obj.untyped_storage().data_ptr())
            total += obj.untyped_storage().nbytes()
        todo.extend(gc.get_referents(obj))
    return total


@pytest.mark.parametrize("top", [1, 20])
def test_the_prompt_store_holds_its_bound_counting_every_score(toy_lm, top):
    """PromptStore(8 MiB) after 24 prompts of 127 tokens scored with top=20 held 12.5 MiB:
    each token's alternatives (a tuple, an int and a float each) went uncounted."""
    bound = 8 << 20
    engine = toy_lm.engine
    kept, engine.prompt_store = engine.prompt_store, PromptStore(bound)
    try:
        g = torch.Generator().manual_seed(0)
        vocab = len(toy_lm.tokenizer)
        sampling = Sampling(max_new_tokens=1, temperature=0.0, prompt_logprobs=max(top, 1))
        for _ in range(24):  # each its own from the first token: nothing shared
            ids = torch.randint(3, vocab, (127,), generator=g).tolist()
            engine.run([Request(tuple(ids), (), sampling)])
        store = engine.prompt_store
        assert len(store) >= 4  # the store is in use, and full
        held = _true_bytes(list(store._entries.items()))
        assert held <= bound, f"{held / 2**20:.1f} MiB held by a store of {bound / 2**20:.0f}"
        assert held >= bound // 2  # and not starved by an over-count
    finally:
        engine.prompt_store = kept


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_client_closed_by_the_idle_timeout_mid_body_leaves_no_traceback(toy_lm):
    """Each request whose client the idle timeout closed mid-body logged "Exception in ASGI
    application" and a ClientDisconnect traceback, once per connection."""
    records = _Records()
    loggers = [logging.getLogger(name) for name in ("uvicorn.error", "steerlab.server")]
    with served(toy_lm, idle_timeout=0.5) as url:
        for logger in loggers:  # once uvicorn has set its logging up
            logger.addHandler(records)
        try:
            socks = [_stall(url, b'{"model": "steerlab-tiny", "prompt": "Once"}'),
                     _stall(url, b"x" * 64, "/v1/vectors?name=v")]  # fmt: skip
            for sock in socks:  # closed by the server
                sock.settimeout(30)
                assert sock.recv(4096) == b""
                sock.close()
            time.sleep(0.3)  # the request ends after its connection does
            assert post(url, "/v1/completions", {"model": MODEL, "prompt": "Once",
                                                 "max_tokens": 1}).status_code == 200  # fmt: skip
        finally:
            for logger in loggers:
                logger.removeHandler(records)
    loud = [r.getMessage() for r in records.records if r.levelno >= logging.WARNING or r.exc_info]
    assert loud == []


@pytest.mark.parametrize("argv", [["serve", "{missing}", "--backend", "vllm"],
                                  ["serve", "{missing}"],
                                  ["serve", "steerlab-tiny", "--amplify-before", "{missing}"],
                                  ["serve", "steerlab-tiny", "--dtype", "float7"],
                                  ["sleeper", "--after", "{missing}", "--n", "2"],
                                  ["sleeper", "--n", "0"],
                                  ["sleeper", "--server", "http://127.0.0.1:{closed}", "--n", "2",
                                   "--betas", "1"]])  # fmt: skip
def test_a_command_given_a_bad_path_or_setting_says_so_in_one_line(argv, tmp_path, capsys):
    """``steerlab serve ./llama-70b --backend vllm`` on a missing folder printed a 22-line
    traceback; so did every command for a path, setting or server that was not there."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused
    port = str(closed.getsockname()[1])
    filled = [a.format(missing=tmp_path / "llama-70b", closed=port) for a in argv]
    filled += ["--port", str(_free_port())] if argv[0] == "serve" else ["--out", str(tmp_path)]
    try:
        with pytest.raises(SystemExit) as exit_:  # its message to stderr, exit 1
            cli.main(filled)
    finally:
        closed.close()
    message = str(exit_.value.code)
    assert "\n" not in message and message.startswith(f"steerlab {argv[0]}: "), message
    assert "Traceback" not in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _no_load(monkeypatch) -> None:
    def load(*args, **kwargs):
        raise AssertionError("a model was loaded before the address was checked")

    monkeypatch.setattr(loading, "load", load)


def test_a_port_in_use_is_one_line_and_exit_1_before_the_model_loads(monkeypatch):
    _no_load(monkeypatch)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as exit_:
            cli.main(["serve", "steerlab-tiny", "--port", str(port)])
    message = str(exit_.value.code)
    assert message.startswith(f"steerlab serve: cannot listen on 127.0.0.1:{port}")
    assert "another --port" in message and "\n" not in message


@pytest.mark.parametrize("device", ["zz", "cuda:99"])
def test_a_device_the_machine_lacks_is_one_line_before_the_model_loads(device, monkeypatch):
    _no_load(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "steerlab-tiny", "--device", device, "--port", str(_free_port())])
    assert str(exit_.value.code).startswith(f"steerlab serve: --device {device}".replace(
        "zz", "'zz'"))  # fmt: skip


README = Path(__file__).parents[1] / "README.md"


def test_each_readme_server_recipe_stands_alone():
    """The README's two lm-eval recipes both served on port 8000: run in order in one shell,
    the second server failed to bind and lm-eval reached the first one. Each recipe that
    starts a server in the background now has a port of its own, which its requests use,
    waits for it to load, and stops it."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    recipes = [b for b in blocks if re.search(r"^\s*steerlab serve .*&", b, flags=re.M)]
    assert len(recipes) >= 2
    ports = []
    for block in recipes:
        (serve,) = re.findall(r"^\s*steerlab serve (.*)&", block, flags=re.M)
        port = re.search(r"--port (\d+)", serve)
        assert port is not None, f"no --port of its own: {serve}"
        ports.append(port.group(1))
        used = set(re.findall(r"(?:localhost|127\.0\.0\.1):(\d+)", block))
        assert used == {port.group(1)}, (serve, used)
        assert "/health" in block and "kill $SERVER" in block, block
    assert len(set(ports)) == len(ports) and "8000" not in ports, ports


def test_steerlab_traceback_keeps_the_whole_error(tmp_path, monkeypatch):
    # one line is for users; STEERLAB_TRACEBACK=1 is for whoever debugs the command
    monkeypatch.setenv("STEERLAB_TRACEBACK", "1")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        cli.main(["serve", str(tmp_path / "llama-70b"), "--port", str(_free_port())])
