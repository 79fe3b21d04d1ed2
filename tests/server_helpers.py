"""Servers on loopback for the server tests, and plain-HTTP helpers (imported by name)."""

from __future__ import annotations

import json
from contextlib import contextmanager

import httpx

import steerlab as sl
from steerlab.server import Limits, ServedModels, create_app
from steerlab.server.background import serve_in_background

KEY = "test-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}


@contextmanager
def served(lm: sl.SteerableModel, before: sl.SteerableModel | None = None,
           beta: float | None = None, idle_timeout: float = 5.0, **options):  # fmt: skip
    """A server for ``lm`` on 127.0.0.1 with ``KEY``; yields its URL."""
    options.setdefault("limits", Limits(max_n=4, max_rows=32, max_body_bytes=256 << 10))
    app = create_app(ServedModels(lm, before, beta), api_key=KEY, **options)
    with serve_in_background(app, idle_timeout=idle_timeout) as url:
        yield url


def post(url: str, path: str, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(url + path, json=body, headers=HEADERS, timeout=120, **kwargs)


def sse(response: httpx.Response) -> list[dict]:
    """The JSON events of a server-sent-events body, without ``[DONE]``."""
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]
