"""Request bodies as pydantic models: the OpenAI fields, plus ``steering`` and ``amplify``.

Types are checked here, strictly: every model is a ``Body``, whose fields take JSON values
of their own type only (``"3"`` or ``true`` where an int belongs, ``3.0`` for an int, a
string for a bool are all a 400 naming the field; a JSON int is a float). What depends on
the model (sites, vector length, context window) is checked in ``plan``. Unknown fields
are refused by name (``extra="forbid"``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model

from steerlab.core.request import OPTIONS


class Body(BaseModel):
    """A request body, or a part of one: strict types, unknown fields refused.

    Lax mode would turn ``"3"`` into 3, ``true`` into 1 and ``[true, false]`` into token ids
    1 and 0: answers to questions nobody asked. Every request model derives from this one,
    so the rule lives here alone.
    """

    model_config = ConfigDict(extra="forbid", strict=True)


Positions = (
    Literal["all", "prompt", "generated"]
    | Annotated[int, Field(ge=0)]
    | Annotated[str, StringConstraints(pattern=r"^(first|last):[0-9]+(\+(first|last):[0-9]+)?$")]
)  # a span ("first:3+last:3") is checked again, and spelt canonically, by core's rule
# A vector's content fingerprint, as the upload answered it (``SteeringVector.sha256``).
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{64}$")]


class Steering(Body):
    """One steer: ``vector`` is the name of a vector the server holds, or the floats inline.

    ``site`` may be left out for a named vector: it then steers at every site it has.
    ``alpha`` is a number, or (in ``/v1/batch``) a list giving one row per alpha.
    """

    site: str | None = None
    vector: str | list[float]
    alpha: float | list[float] | None = None
    positions: Positions = "all"
    op: str | dict[str, Any] = "add"  # a name, or core's data form; checked by op_from_data
    sha256: Sha256 | None = None  # pins a named vector's content: a mismatch is a 409
    # steer only rows whose prompt fires this condition (core.reads.gate_from_data's form:
    # {"site", "vector" (a name or floats), "threshold", "compare", "read", "score"}, or
    # {"any_of": [...]} / {"all_of": [...]}, nested)
    when: dict[str, Any] | None = None


class MonitorSpec(Body):
    """A projection to read at every token (steerlab's extension): ``h·v/|v|`` at ``site``;
    ``vector`` is a named vector (its direction at ``site``) or the floats inline."""

    name: str
    site: str
    vector: str | list[float]


class Amplify(Body):
    """Logit-difference amplification: decode from ``after + beta * (after - before)``."""

    beta: float


# Every generation option (core.request.OPTIONS) by its wire name, in its JSON type; null (or
# left out) is the option's default, and its range is Sampling's, checked in ``plan``.
Options: type[Body] = create_model(  # type: ignore[call-overload]
    "Options", __base__=Body, __doc__="The generation options, by wire name.",
    **{o.wire: (o.wire_type | None, None) for o in OPTIONS},
)  # fmt: skip


class Sampled(Options):  # type: ignore[misc, valid-type]
    """Decoding settings shared by every generation endpoint.

    Every field is honoured or refused: an unknown field (a typo such as ``"steer"``, or an
    OpenAI field steerlab does not implement: ``best_of``, ``suffix``, ``response_format``,
    tools...) is a 400 naming it, never silently dropped. ``user`` and ``metadata`` are
    accepted: they never change output.

    The sampling fields are ``Options``: every generation option by its wire name
    (``core.request.OPTIONS``), with vLLM's ranges checked by ``core.request.Sampling``;
    null means the default. Penalties, ``logit_bias`` (token ids as JSON keys) and
    ``min_tokens`` adjust the logits a row samples from; reported logprobs stay the model's.
    """

    user: str | None = None
    metadata: dict[str, Any] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None  # the endpoint's default when null
    temperature: Annotated[float, Field(ge=0)] = 1.0  # OpenAI's default
    steering: list[Steering] = []
    amplify: Amplify | None = None
    monitor: list[MonitorSpec] = []  # answered in each choice's ``steerlab.monitors``


class StreamOptions(Body):
    """``stream_options`` (with ``stream: true`` only), as OpenAI and vLLM define it.

    ``include_usage`` (true when left out, as in vLLM): one more chunk before ``[DONE]``,
    with no choices and the request's ``usage``; every other chunk has ``"usage": null``.
    ``continuous_usage_stats`` (vLLM's; needs ``include_usage``): every chunk's ``usage`` is
    its row's so far instead.
    """

    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class CompletionRequest(Sampled):
    """``POST /v1/completions``."""

    model: str
    prompt: str | list[str] | list[int] | list[list[int]]  # text, or token ids (lm-eval's)
    max_tokens: Annotated[int, Field(ge=0)] | None = None  # 0 with echo: score the prompt only
    n: Annotated[int, Field(ge=1)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: bool = False


class Message(Body):
    """A chat message: text, or a list of text parts (``core.prompts.check_messages`` joins
    them and refuses other part types by name)."""

    role: str
    content: str | list[dict[str, Any]]


class ChatRequest(Sampled):
    """``POST /v1/chat/completions``."""

    model: str
    messages: list[Message]
    n: Annotated[int, Field(ge=1)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None


class BatchItem(Options):  # type: ignore[misc, valid-type]
    """One prompt of ``/v1/batch`` with its own settings (unset ones are the shared ones)."""

    prompt: str | list[Message]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    steering: list[Steering] | None = None
    alphas: list[float] | None = None


class BatchRequest(Sampled):
    """``POST /v1/batch``: many prompts in one request, one result per prompt.

    Shared settings apply to every prompt unless its item sets its own. ``alphas`` gives
    every steer without an ``alpha`` of its own that list: one prompt x k alphas = k rows.
    Rows are laid out and seeded as ``lm.generate(prompts, ...)`` lays them out.
    """

    model: str
    prompts: list[str | BatchItem]
    temperature: Annotated[float, Field(ge=0)] = 0.0
    alphas: list[float] | None = None
    chat: bool = False
    logprobs: bool = True
    stream: bool = False
