"""A checked request laid out as rows: prompts x alphas, prompt-major, as engine requests.

Everything here runs before the model is touched, so bad input fails before any compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from steerlab.core.monitors import Monitor, as_monitors
from steerlab.core.ops import SteerError
from steerlab.core.prompts import Prompt, PromptError, encode, normalise
from steerlab.core.request import Request, Sampling
from steerlab.core.scalars import as_int, flag
from steerlab.core.steer import Steer, warn_other_model
from steerlab.core.window import check_text_window, check_window


class ModelLike(Protocol):
    """What laying out rows reads of a model: its tokenizer, sites, width, window and name.

    ``SteerableModel`` is one; the checks here need nothing else of it.
    """

    name: str
    tokenizer: Any

    @property
    def d_model(self) -> int: ...

    @property
    def n_ctx(self) -> int | None: ...

    def sites(self) -> list[str]: ...


class SteersLike(Protocol):
    """Anything that turns into steers, such as a ``SteeringVector`` times an alpha."""

    def steers(self) -> list[Steer]: ...


SteerArg = Steer | SteersLike | Sequence[Steer] | None


def as_steers(steer: Any) -> list[Steer]:
    """``steer=`` as a flat list of ``Steer``; anything else is refused by type."""
    if steer is None:
        return []
    if isinstance(steer, Steer) or hasattr(steer, "steers"):
        return steer.steers()
    if isinstance(steer, (list, tuple)):
        return [s for item in steer for s in as_steers(item)]
    raise SteerError(
        f"steer must be a Steer, a steering vector times alpha, or a list of them; got "
        f"{type(steer).__name__} {steer!r:.60}."
    )


def expand_rows(
    n_prompts: int, steers: Sequence[Steer]
) -> tuple[list[int], list[tuple[float, ...]]]:
    """Rows for prompts x alphas, prompt-major: ``(prompt index, alpha per steer)`` per row.

    Every steer's alpha list must have the same length k, or length 1.
    """
    lengths = {len(s.alpha) for s in steers} - {1}
    if len(lengths) > 1:
        raise SteerError(f"Steers have alpha lists of different lengths: {sorted(lengths)}.")
    k = lengths.pop() if lengths else 1
    prompt_index, alphas = [], []
    for p in range(n_prompts):
        for j in range(k):
            prompt_index.append(p)
            alphas.append(tuple(s.alpha[j if len(s.alpha) > 1 else 0] for s in steers))
    return prompt_index, alphas


@dataclass(frozen=True)
class Rows:
    """Checked prompts laid out as rows (prompt x alpha, prompt-major), with their steers."""

    prompts: list[Prompt]
    encoded: list[list[int]]  # per row: the token ids fed
    steers: list[Steer]
    prompt_index: list[int]
    alphas: list[tuple[float, ...]]

    def requests(self, sampling: Sampling, monitors: Sequence[Monitor] = ()) -> list[Request]:
        """One engine request per row; rows of one prompt share a random stream; every row
        reads ``monitors``."""
        seen: dict[str, int] = {}
        streams = []
        for prompt in self.prompts:  # repeats of one text get different streams
            text = repr(prompt)
            seen[text] = seen.get(text, -1) + 1
            streams.append(f"{seen[text]}|{text}")
        return [
            Request(
                tuple(ids),
                tuple(Steer.of(s, a) for s, a in zip(self.steers, alphas)),
                sampling,
                streams[p],
                monitors=tuple(monitors),
            )  # fmt: skip
            for ids, p, alphas in zip(self.encoded, self.prompt_index, self.alphas)
        ]


def lay_out(
    lm: ModelLike,
    prompts: Prompt | Sequence[Prompt],
    steer: SteerArg,
    *,
    chat: bool,
    new_tokens: int,
    continuing: int = 0,
) -> Rows:
    """Check prompts and steers against ``lm`` and lay out the rows; nothing runs.

    ``continuing`` is the length of a cache the rows continue: their prompts are then
    encoded as continuation text (no BOS), and may be empty.

    >>> v = torch.ones(lm.d_model)
    >>> steer = Steer("blocks.1.hook_resid_pre", v, alpha=[0, 4])
    >>> lay_out(lm, ["Hi"], steer, chat=False, new_tokens=8).alphas
    [(0.0,), (4.0,)]
    """
    chat = flag(chat, "chat")
    prompts = normalise(prompts)
    steers = checked_steers(lm, steer)
    prompt_index, alphas = expand_rows(len(prompts), steers)
    room = None if lm.n_ctx is None else lm.n_ctx - continuing
    for i, p in enumerate(prompts):  # a text far past the window is refused untokenized
        text = p if isinstance(p, str) else "".join(str(m.get("content", "")) for m in p)
        check_text_window(lm.tokenizer, text, room, prompt=f"Prompt {i}")
    if continuing:
        encoded = [_continuation(lm.tokenizer, p) for p in prompts]
    else:
        encoded = [encode(lm.tokenizer, p, chat=chat) for p in prompts]
        for i, row in enumerate(encoded):
            if not row:
                raise PromptError(f"Prompt {i} encodes to no tokens.")
    check_window(lm.n_ctx, max(len(r) for r in encoded) + continuing, new_tokens)
    return Rows(prompts, [encoded[p] for p in prompt_index], steers, prompt_index, alphas)


def checked_steers(lm: ModelLike, steer: SteerArg) -> list[Steer]:
    """``steer`` as a list of steers, each checked against ``lm`` (and warned about when it
    was made on another model)."""
    steers = as_steers(steer)
    for s in steers:
        s.check(lm.sites(), lm.d_model)
        warn_other_model(s, lm)
    return steers


def checked_monitors(lm: ModelLike, monitor: object) -> tuple[Monitor, ...]:
    """``monitor=`` as monitors (``core.reads.as_monitors``), each checked against ``lm``."""
    monitors = as_monitors(monitor)
    for m in monitors:
        m.check(lm.sites(), lm.d_model)
    return monitors


def lay_out_ids(lm: ModelLike, prompts: Sequence[Sequence[int]], steer: SteerArg, *,
                new_tokens: int) -> Rows:  # fmt: skip
    """``lay_out`` for prompts given as token ids (fed as they are, no BOS added).

    >>> lay_out_ids(lm, [[0, 5, 9]], None, new_tokens=1).encoded
    [[0, 5, 9]]
    """
    vocab = len(lm.tokenizer)
    given = [list(p) for p in prompts]
    if not given:
        raise PromptError("The prompt list is empty: give at least one prompt.")
    listed: list[list[int]] = []
    for i, ids in enumerate(given):
        if not ids:
            raise PromptError(f"prompt {i} has no token ids.")
        plain = [n for n in map(as_int, ids) if n is not None and 0 <= n < vocab]
        if len(plain) < len(ids):  # numpy's integers and 0-d int tensors are ints too
            bad = next(t for t in ids if (n := as_int(t)) is None or not 0 <= n < vocab)
            raise PromptError(f"prompt {i} holds {bad!r}: token ids are ints in [0, {vocab}).")
        listed.append(plain)
    steers = checked_steers(lm, steer)
    prompt_index, alphas = expand_rows(len(listed), steers)
    check_window(lm.n_ctx, max(len(ids) for ids in listed), new_tokens)
    return Rows(listed, [listed[p] for p in prompt_index], steers, prompt_index, alphas)  # type: ignore[arg-type]


def _continuation(tokenizer: Any, prompt: Prompt) -> list[int]:
    if not isinstance(prompt, str):
        raise PromptError("Continuing a cache takes text (or None), not a list of messages.")
    return tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else []
