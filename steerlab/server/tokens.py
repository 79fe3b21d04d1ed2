"""``/tokenize``, ``/detokenize`` and ``/tokenizer_info``, shaped as vLLM's server has them.

With them a client needs no tokenizer of its own: lm-evaluation-harness's remote tokenizer
(``local-completions`` with ``tokenizer_backend=remote``, or ``auto``) uses exactly these.
Each parses its body and runs in a worker thread, so a long text never holds up the event
loop.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from pydantic import Field

from steerlab.core.prompts import PromptError, encode
from steerlab.server.bodies import body_of
from steerlab.server.errors import ApiError
from steerlab.server.schemas import Body, Message

router = APIRouter()

_PRIVATE = ("vocab_file", "merges_file", "name_or_path", "tokenizer_file")  # server paths


class TokenizeRequest(Body):
    """Text (``prompt``) or a chat (``messages``, rendered by the model's template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(Body):
    """Token ids to decode (JSON integers: ``true`` is no token id)."""

    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


def _tokenizer(request: Request) -> Any:
    state = request.app.state.steerlab
    return state.models.lm.tokenizer


def _check_model(request: Request, model: str | None) -> None:
    if model is not None:
        request.app.state.steerlab.check_model(model)


@router.post("/tokenize")
def tokenize(body: Annotated[TokenizeRequest, Depends(body_of(TokenizeRequest))],
             request: Request) -> dict[str, Any]:  # fmt: skip
    """``{"count", "max_model_len", "tokens"}`` (and ``token_strs`` when asked)."""
    _check_model(request, body.model)
    tokenizer, lm = _tokenizer(request), request.app.state.steerlab.models.lm
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(400, "Give exactly one of prompt and messages.", "prompt")
    if body.messages is not None:
        messages = [m.model_dump() for m in body.messages]
        try:
            ids = encode(tokenizer, messages, chat=True)  # type: ignore[arg-type]
        except (PromptError, ValueError) as error:
            raise ApiError(400, str(error), "messages") from None
    else:
        ids = tokenizer(body.prompt, add_special_tokens=body.add_special_tokens)["input_ids"]
    out: dict[str, Any] = {"count": len(ids), "max_model_len": lm.n_ctx, "tokens": ids}
    if body.return_token_strs:
        out["token_strs"] = tokenizer.convert_ids_to_tokens(ids)
    return out


@router.post("/detokenize")
def detokenize(body: Annotated[DetokenizeRequest, Depends(body_of(DetokenizeRequest))],
               request: Request) -> dict[str, Any]:  # fmt: skip
    """``{"prompt": text}``, special tokens included, as vLLM decodes them."""
    _check_model(request, body.model)
    tokenizer = _tokenizer(request)
    vocab = len(tokenizer)
    bad = [t for t in body.tokens if t >= vocab]
    if bad:
        raise ApiError(400, f"Token ids outside this tokenizer's vocabulary [0, {vocab}): "
                            f"{bad[:5]}.", "tokens")  # fmt: skip
    return {"prompt": tokenizer.decode(body.tokens)}


@router.get("/tokenizer_info")
def tokenizer_info(request: Request) -> dict[str, Any]:
    """The tokenizer's configuration, as ``tokenizer_config.json`` holds it, with its class,
    special tokens and chat template; file paths on the server are left out."""
    tokenizer = _tokenizer(request)
    info = {k: _plain(v) for k, v in (getattr(tokenizer, "init_kwargs", None) or {}).items()
            if k not in _PRIVATE}  # fmt: skip
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            info[name] = str(value)
    info["tokenizer_class"] = type(tokenizer).__name__
    template = getattr(tokenizer, "chat_template", None)
    if template:
        info["chat_template"] = template
    return info


def _plain(value: Any) -> Any:
    """JSON-ready: an added token as its text, containers element by element."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
