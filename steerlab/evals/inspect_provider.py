"""The ``steerlab`` model provider for Inspect AI: a steered model, evaluated in-process.

``inspect eval task.py --model steerlab/steerlab-tiny -M steer=happy.safetensors@4`` finds
this module through the ``inspect_ai`` entry point in ``pyproject.toml``;
``sl.evals.inspect_model(lm, steer=vec, alpha=4)`` builds the same provider around a model
already loaded. Inspect calls ``generate`` once per sample, many at once: the calls that
arrive within ``window_ms`` of each other decode as one engine call, on the scheduler's
engine thread (``engine/scheduler.py``, as the server batches), so Inspect's event loop
never waits on the model. A call is ``lm.generate(messages, steer, chat=True, ...)``: the
same rows, the same tokens.
"""

from __future__ import annotations

from typing import Any

import anyio
from inspect_ai.model import (
    ChatCompletionChoice,
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageTool,
    ContentText,
    GenerateConfig,
    ModelAPI,
    ModelOutput,
    ModelUsage,
    StopReason,
    modelapi,
)
from inspect_ai.tool import ToolChoice, ToolInfo

from steerlab.core.errors import SamplingError
from steerlab.core.request import Sampling
from steerlab.core.rows import checked_steers, lay_out
from steerlab.engine.scheduler import Scheduler
from steerlab.evals.inspect_steering import InspectArgError, parse_args
from steerlab.model import SteerableModel

# GenerateConfig fields steerlab decodes with, as Sampling's options.
_HONOURED = {"max_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p",
             "top_k": "top_k", "seed": "seed", "stop_seqs": "stop",
             "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
             "logit_bias": "logit_bias"}  # fmt: skip
# Fields that would change what comes back, which this provider cannot do: refused by name.
# (The rest, such as max_connections, timeout, cache or system_message, are Inspect's own.)
_REFUSED = {
    "num_choices": "one choice per call",
    "best_of": "one sample per call",
    "logprobs": "no logprobs in its output",
    "top_logprobs": "no logprobs in its output",
    "prompt_logprobs": "no logprobs in its output",
    "response_schema": "no structured output",
    "reasoning_effort": "no reasoning settings",
    "reasoning_tokens": "no reasoning settings",
    "reasoning_summary": "no reasoning settings",
    "reasoning_mode": "no reasoning settings",
    "effort": "no reasoning settings",
    "verbosity": "no verbosity setting",
    "modalities": "text output only",
    "extra_body": "no HTTP request to add fields to",
    "extra_headers": "no HTTP request to add headers to",
}
_STOP_REASONS: dict[str, StopReason] = {"eos": "stop", "stop": "stop", "length": "max_tokens"}


def check_config(config: GenerateConfig) -> None:
    """Refuse, by name, a generation setting steerlab would otherwise ignore."""
    for name, why in _REFUSED.items():
        value = getattr(config, name, None)
        if _asks(name, value):
            raise SamplingError(name, f"GenerateConfig.{name}={value!r}: the steerlab "
                                      f"provider has {why}.")  # fmt: skip


def _asks(name: str, value: Any) -> bool:
    """Whether a refused field asks for something (num_choices=1, logprobs=False do not)."""
    if name in ("num_choices", "best_of"):
        return value not in (None, 1)
    if name == "logprobs":
        return value is True
    return value is not None


def sampling_of(config: GenerateConfig) -> Sampling:
    """``config``'s decoding settings as steerlab's ``Sampling`` (unset ones: steerlab's
    defaults, greedy; no seed: a fresh one)."""
    check_config(config)
    options: dict[str, Any] = {"seed": None}
    for name, option in _HONOURED.items():
        value = getattr(config, name, None)
        if value is not None:
            options[option] = tuple(value) if name == "stop_seqs" else value
    return Sampling.of(options, where="GenerateConfig")


def messages_of(input: list[ChatMessage], tools: list[ToolInfo]) -> list[dict[str, str]]:
    """Inspect's messages as steerlab's (role, text); tools and non-text content refused."""
    if tools:
        raise SamplingError("tools", f"The steerlab provider calls no tools; got "
                                     f"{[t.name for t in tools]}.")  # fmt: skip
    out = []
    for i, message in enumerate(input):
        if isinstance(message, ChatMessageTool) or (
            isinstance(message, ChatMessageAssistant) and message.tool_calls
        ):
            raise SamplingError("tools", f"Message {i} is a tool call or result; the steerlab "
                                         "provider calls no tools.")  # fmt: skip
        if not isinstance(message.content, str):
            other = [type(c).__name__ for c in message.content
                     if not isinstance(c, ContentText) and c.type != "reasoning"]  # fmt: skip
            if other:
                raise SamplingError("content", f"Message {i} holds {other[0]}; the steerlab "
                                               "provider reads text only.")  # fmt: skip
        out.append({"role": message.role, "content": message.text})
    return out


class SteerlabAPI(ModelAPI):
    """A steerlab model as an Inspect model: ``steerlab/NAME``, where NAME is what
    ``sl.load`` takes (``steerlab-tiny``, a folder, a hub id).

    Model arguments (``-M``): ``steer=FILE@ALPHA`` (repeatable), ``backend`` (``hf``),
    ``device``, ``dtype``, ``window_ms`` (how long a call waits for others to batch with),
    ``batch_size`` (rows per engine call). In-process: ``lm`` (a loaded model) and
    ``steer`` given as vectors or steers, with ``alpha``.
    """

    def __init__(self, model_name: str, base_url: str | None = None,
                 api_key: str | None = None, config: GenerateConfig | None = None,
                 **model_args: Any) -> None:  # fmt: skip
        config = config or GenerateConfig()
        super().__init__(model_name=model_name, base_url=base_url, api_key=api_key,
                         config=config)  # fmt: skip
        if base_url is not None:
            raise InspectArgError("--model-base-url: the steerlab provider runs the model "
                                  "in this process; there is no server to reach.")  # fmt: skip
        args = parse_args(model_args, _command_line_steers())  # before any load
        check_config(config)
        self.lm = args.model(model_name)
        self.steers, self.steered = [], []
        for source in args.steer:
            steers, line = source.load(self.lm)
            self.steers += steers
            self.steered.append(line)
        checked_steers(self.lm, self.steers)  # sites and widths, before any sample runs
        self.batch_size = args.batch_size
        lm = self.lm
        self.scheduler = Scheduler(lambda _: lm.engine, window_s=args.window_ms / 1000,
                                   max_rows=args.batch_size).start()  # fmt: skip
        self._limiter = anyio.CapacityLimiter(args.batch_size)
        if config.max_connections is None and config.adaptive_connections is None:
            # Inspect's adaptive concurrency paces a rate-limited API (it starts at 20 calls
            # and ignores max_connections()); here every call waiting is a row for the batch.
            config.max_connections = args.batch_size

    async def generate(self, input: list[ChatMessage], tools: list[ToolInfo],
                       tool_choice: ToolChoice, config: GenerateConfig) -> ModelOutput:  # fmt: skip
        sampling = sampling_of(config)
        rows = lay_out(self.lm, [messages_of(input, tools)], self.steers, chat=True,
                       new_tokens=sampling.max_new_tokens)  # fmt: skip
        requests = rows.requests(sampling)
        if not self.scheduler.running:  # closed (Inspect's `with model:`), or its thread died
            raise RuntimeError(f"The steerlab model {self.model_name!r} is closed; get a new one.")
        (done,) = await anyio.to_thread.run_sync(self.scheduler.run, requests,
                                                 limiter=self._limiter)  # fmt: skip
        prompt, new = len(requests[0].prompt), len(done.tokens)
        choice = ChatCompletionChoice(
            message=ChatMessageAssistant(
                content=done.text, model=self.model_name, source="generate"
            ),  # fmt: skip
            stop_reason=_STOP_REASONS.get(done.finish_reason, "unknown"),
        )
        return ModelOutput(model=self.model_name, choices=[choice],
                           usage=ModelUsage(input_tokens=prompt, output_tokens=new,
                                            total_tokens=prompt + new),
                           metadata={"steer": list(self.steered)})  # fmt: skip

    def max_connections(self) -> int:
        """As many concurrent calls as one engine call decodes."""
        return self.batch_size

    def close(self) -> None:
        self.scheduler.stop()


@modelapi(name="steerlab")
def steerlab() -> type[ModelAPI]:
    """Registers ``SteerlabAPI`` as Inspect's ``steerlab`` provider (``steerlab/NAME``)."""
    return SteerlabAPI


def inspect_model(lm: SteerableModel, steer: Any = None, alpha: float | None = None, *,
                  window_ms: float | None = None, batch_size: int | None = None,
                  config: GenerateConfig | None = None) -> Any:  # fmt: skip
    """``lm``, steered by ``steer`` at ``alpha``, as an Inspect model for ``eval``.

    Args:
        lm: a loaded model.
        steer: a steering vector, a ``Steer`` or a list of them (None: unsteered).
        alpha: multiplies ``steer`` (a vector's scale included); 1 when None.
        window_ms: how long a call waits for others to share its engine call.
        batch_size: rows per engine call, and Inspect's concurrent calls.
        config: Inspect's ``GenerateConfig`` for every call.

    Returns:
        An ``inspect_ai.model.Model``; its ``model_args`` say what steers it (the log's).

    >>> import asyncio
    >>> model = sl.evals.inspect_model(lm, config=GenerateConfig(max_tokens=6))
    >>> asyncio.run(model.generate("Tell me a story.")).completion
    'Once upon a time, there'
    """
    given = {"lm": lm, "steer": steer, "alpha": alpha, "window_ms": window_ms,
             "batch_size": batch_size}  # fmt: skip
    from inspect_ai.model import get_model

    config = (config or GenerateConfig()).model_copy()  # the provider may set max_connections
    model = get_model(f"steerlab/{lm.name}", config=config, memoize=False,
                      **{k: v for k, v in given.items() if v is not None})  # fmt: skip
    api = model.api
    assert isinstance(api, SteerlabAPI)
    model.model_args = {"steer": list(api.steered), "backend": lm.engine.kind}
    return model


def _command_line_steers() -> list[str]:
    """Every ``-M steer=`` of the ``inspect`` command running now, in order (Inspect's own
    parsing keeps the last of a repeated key); none outside its command line."""
    try:
        import click
        from inspect_ai._util.config import parse_cli_args
    except ImportError:
        return []
    context = click.get_current_context(silent=True)
    given = context.params.get("m") if context is not None else None
    out: list[str] = []
    for arg in given or ():
        value = parse_cli_args([arg]).get("steer")
        if value is not None:
            out += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return out
