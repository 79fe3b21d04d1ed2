"""Errors a client sees: OpenAI's JSON error shape, with ``param`` naming the field."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from steerlab.engine.guard import CallInFlightError
from steerlab.engine.scheduler import EngineStopped, Job

log = logging.getLogger("steerlab.server")


class ApiError(Exception):
    """A request the server refuses (4xx) or a computation that failed for one request.

    Attributes:
        status: the HTTP status code.
        message: what went wrong, for a person.
        param: the request field at fault, as ``steering[0].vector``; None when no one field is.
        kind: OpenAI's error ``type`` (``invalid_request_error``, ``authentication_error`` ...).
    """

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.status}}  # fmt: skip


def field_name(loc: tuple[Any, ...] | list[Any]) -> str:
    """A pydantic location as a field path: ``("body", "steering", 0, "alpha")`` -> ``steering[0].alpha``.

    >>> field_name(("body", "steering", 0, "alpha"))
    'steering[0].alpha'
    """
    out = ""
    for part in loc:
        if part == "body" and not out:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _type_tag(str(part)):
            out += f".{part}" if out else str(part)
    return out


def invalid(errors: Sequence[Mapping[str, Any]]) -> ApiError:
    """A 400 for the first field pydantic refused, named (``body`` when the body as a whole
    is wrong: not JSON, or not an object). Where an object fits none of a union's types, the
    model's error is the one told: a batch item is told its bad field, not that it is no
    string."""
    first = next((e for e in errors if any(_model_tag(p) for p in e.get("loc", ()))), errors[0])
    param = field_name(first.get("loc", ())) or "body"
    return ApiError(400, f"{param}: {first.get('msg', 'invalid')}", param)


def _model_tag(part: object) -> bool:
    """Pydantic names a union's model member by its class (``BatchItem``); fields are lower case."""
    return isinstance(part, str) and part[:1].isupper()


def _type_tag(part: str) -> bool:
    """Pydantic names the member of a union that failed (``float``, ``list[float]``, a model
    class such as ``BatchItem``); field names are lower case."""
    return ("[" in part or "-" in part or _model_tag(part)
            or part in {"float", "int", "str", "bool", "dict", "list"})  # fmt: skip


def api_error(error: Exception, job: Job) -> ApiError:
    """What a client is told of the exception a job failed with."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, FloatingPointError):
        param = "steering" if any(r.steers for r in job.requests) else "amplify"
        return ApiError(422, str(error), param)
    if isinstance(error, CallInFlightError):
        return ApiError(503, f"The model is busy: {error}", None, "server_busy")
    if isinstance(error, EngineStopped):
        return ApiError(503, str(error), None, "engine_stopped")
    if isinstance(error, ValueError):
        return ApiError(400, str(error))
    log.exception("request failed", exc_info=error)
    return ApiError(500, f"{type(error).__name__}: {error}", None, "server_error")
