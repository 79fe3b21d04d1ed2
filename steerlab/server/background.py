"""Run a server on loopback in a background thread: for notebooks, tests and benchmarks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import FastAPI

from steerlab.server.connections import DEFAULT_IDLE_TIMEOUT, bound_socket, uvicorn_config


@contextmanager
def serve_in_background(app: FastAPI, host: str = "127.0.0.1", port: int = 0,
                        timeout: float = 30.0,
                        idle_timeout: float = DEFAULT_IDLE_TIMEOUT) -> Iterator[str]:  # fmt: skip
    """Serve ``app`` with uvicorn in a thread; yields its base URL, and stops it on exit.

    ``port=0`` picks a free port. Connections idle past ``idle_timeout`` seconds are closed,
    as ``steerlab serve --idle-timeout`` closes them (``connections.IdleTimeoutH11``).

    >>> with serve_in_background(create_app(ServedModels(lm))) as url:  # starts a server  # doctest: +SKIP
    ...     sl.connect(url).generate("Once", max_new_tokens=5)
    """
    import uvicorn

    sock = bound_socket(host, port)
    config = uvicorn_config(app, host=host, port=sock.getsockname()[1], idle_timeout=idle_timeout,
                            log_level="warning")  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("The server did not start.")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()
