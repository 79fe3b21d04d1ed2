"""HTTP requests whose timeout is a whole-request deadline, for the judge.

A per-read timeout (httpx's, requests') lets a server that trickles its reply a few bytes at
a time hold a request for ever: each read returns in time. Here every socket operation of a
request (connect, TLS, each write and read, headers and body alike) waits at most what is
left of the request's deadline, and none starts once it has passed. The pool is httpcore's
(httpx's own engine), with a network backend that bounds each operation so.

>>> pool = DeadlinePool()
>>> pool.send("GET", "http://127.0.0.1:1/v1/models", timeout=1.0)  # nothing there
Traceback (most recent call last):
...
steerlab.evals.http.HTTPFailure: ...
"""

from __future__ import annotations

import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import httpcore

MAX_BODY = 16 * 2**20  # bytes: far above any chat completion, far below trouble

_FAILURES = (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError,
             httpcore.UnsupportedProtocol, httpcore.ProxyError, OSError)  # fmt: skip


class HTTPFailure(ConnectionError):
    """A request that got no whole reply: refused, reset, malformed, or past its deadline."""


@dataclass(frozen=True)
class Reply:
    """A whole HTTP reply: its status, its headers (names lowercased) and its body."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class DeadlinePool:
    """Keep-alive connections, each request under one deadline of ``timeout`` seconds.

    Args:
        headers: sent with every request (an ``Authorization`` header, say).
        proxy: an ``http://`` or ``https://`` proxy every request goes through
            (``proxy_for(url)`` reads the environment's, as httpx does); None: none.
    """

    def __init__(self, headers: dict[str, str] | None = None, proxy: str | None = None) -> None:
        self._headers = [(k.encode("ascii"), v.encode("ascii")) for k, v in (headers or {}).items()]
        self._deadline = threading.local()  # each thread's request has its own
        backend = _Backend(self._deadline)
        self._pool: httpcore.ConnectionPool
        if proxy is None:
            self._pool = httpcore.ConnectionPool(max_connections=None, keepalive_expiry=5.0,
                                                 network_backend=backend)  # fmt: skip
        else:
            parts = urllib.parse.urlsplit(proxy)
            auth = (urllib.parse.unquote(parts.username or ""),
                    urllib.parse.unquote(parts.password or "")) if parts.username else None  # fmt: skip
            plain = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
            self._pool = httpcore.HTTPProxy(plain, proxy_auth=auth, max_connections=None,
                                            keepalive_expiry=5.0, network_backend=backend)  # fmt: skip

    def send(self, method: str, url: str, body: bytes = b"", *, timeout: float,
             content_type: str = "application/json") -> Reply:  # fmt: skip
        """The reply to one request, read whole within ``timeout`` seconds of now.

        Raises:
            HTTPFailure: no whole reply by the deadline, a connection that failed, a
                malformed reply, or a body past ``MAX_BODY`` bytes.
        """
        headers = [*self._headers]
        if body:
            headers.append((b"Content-Type", content_type.encode("ascii")))
        self._deadline.end = time.monotonic() + timeout
        try:
            with self._pool.stream(method, url, headers=headers, content=body or None) as reply:
                chunks, size = [], 0
                for chunk in reply.iter_stream():
                    size += len(chunk)
                    if size > MAX_BODY:
                        raise HTTPFailure(f"the reply is larger than {MAX_BODY} bytes")
                    chunks.append(chunk)
                names = {k.decode("latin-1").lower(): v.decode("latin-1")
                         for k, v in reply.headers}  # fmt: skip
                return Reply(reply.status, names, b"".join(chunks))
        except _FAILURES as error:
            raise HTTPFailure(str(error) or type(error).__name__) from error
        finally:
            self._deadline.end = None


def proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTPS_PROXY``, ``HTTP_PROXY``,
    ``ALL_PROXY``; none for a host in ``NO_PROXY``), as httpx reads them; None: go direct.

    Raises:
        HTTPFailure: the proxy named is not an ``http://`` or ``https://`` one (SOCKS).
    """
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(parts.netloc):
        return None
    proxies = urllib.request.getproxies()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if proxy and not proxy.startswith(("http://", "https://")):
        raise HTTPFailure(f"the proxy the environment names for {url} is {proxy!r:.60}; only "
                          "http:// and https:// proxies are supported")  # fmt: skip
    return proxy or None


class _Backend(httpcore.NetworkBackend):
    """httpcore's own sockets, each operation bounded by what is left of the deadline."""

    def __init__(self, deadline: threading.local) -> None:
        self._sync = httpcore.SyncBackend()
        self._deadline = deadline

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None, socket_options: Any = None
                    ) -> httpcore.NetworkStream:  # fmt: skip
        wait = _left(self._deadline, timeout, httpcore.ConnectTimeout)
        stream = self._sync.connect_tcp(host, port, wait, local_address, socket_options)
        return _Stream(stream, self._deadline)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> httpcore.NetworkStream:  # fmt: skip
        wait = _left(self._deadline, timeout, httpcore.ConnectTimeout)
        return _Stream(self._sync.connect_unix_socket(path, wait, socket_options), self._deadline)

    def sleep(self, seconds: float) -> None:
        self._sync.sleep(seconds)


class _Stream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream, deadline: threading.local) -> None:
        self._stream, self._deadline = stream, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(self._deadline, timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _left(self._deadline, timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:  # fmt: skip
        wait = _left(self._deadline, timeout, httpcore.ConnectTimeout)
        return _Stream(self._stream.start_tls(ssl_context, server_hostname, wait), self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


def _left(deadline: threading.local, timeout: float | None, late: type[Exception]) -> float | None:
    """The seconds one socket operation may wait: what is left of this thread's request's
    deadline (or ``timeout``, if sooner); ``late`` is raised once it has passed."""
    end = getattr(deadline, "end", None)
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise late("the request's deadline passed")
    return left if timeout is None else min(timeout, left)
