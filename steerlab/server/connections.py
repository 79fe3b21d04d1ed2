"""Connections that send nothing are closed: uvicorn's HTTP/1.1 protocol with idle deadlines.

uvicorn (its h11 protocol) closes a kept-alive connection ``timeout_keep_alive`` seconds
after its last response, and refuses a request head over ``h11_max_incomplete_event_size``
bytes (16 KiB) with a 400. It sets no deadline for a client that opens a connection and
sends nothing, or sends part of a request head and stalls (slowloris), or stops halfway
through a body. ``IdleTimeoutH11`` adds them, all with one timeout:

- a request's head (request line and headers) must be whole within ``idle_timeout``
  seconds of when the server began waiting for it (the connection opened, or the response
  before it ended); bytes trickled in do not extend it;
- while a body arrives, ``idle_timeout`` seconds without a byte close the connection.

A connection closed mid-request is one line in uvicorn's log (``_expire``); the request it
carried ends quietly (``app._gone``), with no traceback.

Not covered: a body trickled in without such a pause (bounded by the body limit, not by
time), and a client that reads a streamed response slowly (writes wait on it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_IDLE_TIMEOUT = 5.0  # seconds: uvicorn's own keep-alive default


class IdleTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol, closing connections idle past ``idle_timeout`` seconds."""

    idle_timeout = DEFAULT_IDLE_TIMEOUT

    _timer: asyncio.TimerHandle | None = None
    _waiting_since: float | None = None  # when the server began waiting for a request head

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        _no_delay(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def _waiting(self) -> str | None:
        """What the server waits on the client for: a request's ``"head"``, its ``"body"``."""
        state = self.conn.their_state
        if state is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
            return "head"
        return "body" if state is h11.SEND_BODY else None

    def _arm(self) -> None:
        self._cancel()
        waiting, now = self._waiting(), self.loop.time()
        if waiting != "head":
            self._waiting_since = None
        if waiting is None or self.transport.is_closing():
            return
        if waiting == "head" and self._waiting_since is None:
            self._waiting_since = now
        start = self._waiting_since if waiting == "head" else now
        assert start is not None
        self._timer = self.loop.call_later(max(start + self.idle_timeout - now, 0), self._expire)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        waiting = self._waiting()
        if waiting == "body" or self.conn.trailing_data[0]:  # mid-request, not a quiet keep-alive
            host = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
            self.logger.info("Closed the connection from %s: its request's %s stalled past "
                             "the idle timeout (%g s).", host, waiting or "head",
                             self.idle_timeout)  # fmt: skip
        self.transport.close()


def _no_delay(transport: asyncio.Transport) -> None:
    """Send each write at once (TCP_NODELAY). uvicorn writes a response's head and body
    separately; with Nagle's algorithm on, the body waits for the client to acknowledge the
    head, which a client delays by up to 40 ms: every small response took 40+ ms."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port=0``: a free one), as uvicorn binds its
    own; bound before a model loads, a port in use fails at once.

    Raises:
        OSError: the address cannot be bound (in use, not this machine's, no permission).

    >>> sock = bound_socket("127.0.0.1", 0)
    >>> sock.getsockname()[1] > 0
    True
    >>> sock.close()
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class BoundServer(uvicorn.Server):
    """uvicorn's server on a socket bound beforehand (``bound_socket``), saying where it
    listens once started, as uvicorn says it for a socket of its own binding."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and sockets:
            host, port = sockets[0].getsockname()[:2]
            where = f"[{host}]" if ":" in host else host
            logging.getLogger("uvicorn.error").info(
                "Uvicorn running on http://%s:%d (Press CTRL+C to quit)", where, port
            )


def uvicorn_config(app: Any, *, host: str = "127.0.0.1", port: int = 8000,
                   idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
                   log_level: str = "info") -> uvicorn.Config:  # fmt: skip
    """A ``uvicorn.Config`` serving ``app`` over ``IdleTimeoutH11`` with ``idle_timeout``
    (uvicorn's keep-alive timer, a whole number of seconds, is set at or just past it).

    >>> config = uvicorn_config(object(), port=8000, idle_timeout=5)
    >>> config.port, config.timeout_keep_alive
    (8000, 5)
    """
    if not (math.isfinite(idle_timeout) and idle_timeout > 0):
        raise ValueError(f"The idle timeout must be a positive number of seconds; got "
                         f"{idle_timeout!r}.")  # fmt: skip
    protocol = type("IdleTimeoutH11", (IdleTimeoutH11,), {"idle_timeout": float(idle_timeout)})
    return uvicorn.Config(app, host=host, port=port, http=protocol, lifespan="on",
                          timeout_keep_alive=math.ceil(idle_timeout), log_level=log_level)  # fmt: skip
