"""What a client does to the server's connections and its event loop (issue 21): bodies are
parsed, and prompts tokenized, in worker threads, never on the loop every client shares;
connections that send nothing, or stall mid-request, are closed after the idle timeout."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from fastapi import FastAPI
from server_helpers import HEADERS, post, served

from steerlab import cli
from steerlab.server import bodies
from steerlab.server.background import serve_in_background
from steerlab.server.connections import uvicorn_config

MODEL = "steerlab-tiny"
IDLE = 0.5  # seconds


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_bodies_and_tokens_are_worked_on_off_the_event_loop(toy_lm, monkeypatch):
    seen: list[tuple[str, bool]] = []
    kind = type(toy_lm.tokenizer)

    def spy(name, original):
        def wrapped(*args, **kwargs):
            seen.append((name, _on_loop()))
            return original(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(bodies, "parse_body", spy("parse", bodies.parse_body))
    monkeypatch.setattr(kind, "__call__", spy("tokenize", kind.__call__))
    monkeypatch.setattr(kind, "decode", spy("decode", kind.decode))
    with served(toy_lm) as url:
        text = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3, "logprobs": 2,
                "echo": True}  # fmt: skip
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
        for path, body in [("/v1/completions", text), ("/v1/completions", {**text, "stream": True}),
                           ("/v1/chat/completions", chat), ("/tokenize", {"prompt": "Once"}),
                           ("/detokenize", {"tokens": [5, 6]})]:  # fmt: skip
            assert post(url, path, body).status_code == 200, path
    assert {name for name, _ in seen} == {"parse", "tokenize", "decode"}
    assert [name for name, on_loop in seen if on_loop] == []


@pytest.fixture(scope="module")
def url(toy_lm):
    with served(toy_lm) as address:
        yield address


def _raw(url: str, path: str, content: bytes, headers: dict | None = None) -> httpx.Response:
    headers = {"content-type": "application/json", **(HEADERS if headers is None else headers)}
    return httpx.post(url + path, content=content, headers=headers, timeout=60)


def test_bad_bodies_keep_their_errors(url):
    bad_json = _raw(url, "/v1/completions", b'{"model": "steerlab-tiny", "prompt": ')
    assert bad_json.status_code == 400 and bad_json.json()["error"]["param"] == "body"
    not_object = _raw(url, "/tokenize", b"[1, 2]")
    assert not_object.status_code == 400 and not_object.json()["error"]["param"] == "body"
    wrong = json.dumps({"model": MODEL, "messages": "hi"}).encode()
    field = _raw(url, "/v1/chat/completions", wrong)
    assert field.status_code == 400 and field.json()["error"]["param"] == "messages"
    big = b'{"prompt": "' + b"x" * (300 << 10)  # over the limit, and not JSON: never parsed
    assert _raw(url, "/v1/completions", big).status_code == 413
    assert _raw(url, "/v1/completions", b"{", headers={}).status_code == 401  # key first


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def _closed_after(sock: socket.socket, trickle: bytes = b"", every: float = 0.1) -> float:
    """Seconds until the server closes ``sock``, sending ``trickle`` (if any) every ``every``."""
    start = time.monotonic()
    sock.settimeout(every)
    while time.monotonic() - start < 10:
        try:
            if sock.recv(65536) == b"":
                return time.monotonic() - start
        except TimeoutError:
            if trickle:
                try:
                    sock.sendall(trickle)
                except OSError:  # closed while we were sending
                    return time.monotonic() - start
        except ConnectionResetError:
            return time.monotonic() - start
    raise AssertionError("the server kept the connection open")


@pytest.fixture(scope="module")
def slow_app_url():
    """A plain app with a slow endpoint, served as ``steerlab serve`` serves, idle after IDLE s."""
    app = FastAPI()

    @app.get("/slow")
    async def slow() -> dict:
        await asyncio.sleep(3 * IDLE)  # the request is whole: the server is the one working
        return {"ok": True}

    @app.post("/echo")
    async def echo(body: dict) -> dict:
        return body

    with serve_in_background(app, idle_timeout=IDLE) as address:
        yield address


def test_a_connection_that_sends_nothing_is_closed(slow_app_url):
    with _connect(slow_app_url) as sock:
        assert IDLE * 0.8 <= _closed_after(sock) < IDLE + 1.5


def test_a_request_head_trickled_in_is_closed_at_the_deadline(slow_app_url):
    with _connect(slow_app_url) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n")
        assert _closed_after(sock, trickle=b"X-A: 1\r\n", every=0.1) < IDLE + 1.5


def test_a_body_that_stops_arriving_is_closed(slow_app_url):
    with _connect(slow_app_url) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"a\": ")  # fmt: skip
        assert _closed_after(sock) < IDLE + 1.5
    reply = httpx.post(slow_app_url + "/echo", json={"a": 1}, timeout=10)
    assert reply.json() == {"a": 1}  # the server goes on


def test_a_kept_alive_connection_is_closed_once_idle_but_not_while_the_server_works(slow_app_url):
    with _connect(slow_app_url) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        start, reply = time.monotonic(), b""
        while b'{"ok":true}' not in reply:
            reply += sock.recv(65536)
        assert time.monotonic() - start >= 2 * IDLE  # outlived the idle timeout: not idle
        assert reply.startswith(b"HTTP/1.1 200")
        assert _closed_after(sock) < IDLE + 1.5


def test_a_request_head_past_h11s_size_bound_is_a_400(slow_app_url):
    with _connect(slow_app_url) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (20 << 10))
        sock.settimeout(10)
        assert sock.recv(65536).startswith(b"HTTP/1.1 400")


def test_the_idle_timeout_is_a_command_line_flag():
    args = cli.parser().parse_args(["serve", MODEL, "--idle-timeout", "2.5"])
    assert args.idle_timeout == 2.5
    assert cli.parser().parse_args(["serve", MODEL]).idle_timeout == 5.0
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["serve", MODEL, "--idle-timeout", "0"])
    config = uvicorn_config(FastAPI(), idle_timeout=2.5)
    assert config.http.idle_timeout == 2.5 and config.timeout_keep_alive == 3
    with pytest.raises(ValueError, match="positive"):
        uvicorn_config(FastAPI(), idle_timeout=float("nan"))


def test_the_served_steering_app_closes_idle_connections(toy_lm):
    with served(toy_lm, idle_timeout=IDLE) as address, _connect(address) as sock:
        assert _closed_after(sock) < IDLE + 1.5
        assert post(address, "/v1/completions", {"model": MODEL, "prompt": "Hi",
                                                 "max_tokens": 1}).status_code == 200  # fmt: skip


def test_responses_leave_at_once_without_waiting_for_the_clients_ack():
    """Nagle's algorithm held a response's body until the client acknowledged its head (up to
    40 ms per request): the server's connections send with TCP_NODELAY."""
    from steerlab.server.connections import _no_delay

    class Transport:
        def __init__(self, sock: socket.socket) -> None:
            self.sock = sock

        def get_extra_info(self, name: str) -> socket.socket | None:
            return self.sock if name == "socket" else None

    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname()),
        listener.accept()[0] as conn,
    ):
        assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        _no_delay(Transport(conn))  # type: ignore[arg-type]
        assert conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
