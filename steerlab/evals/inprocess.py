"""lm-eval's model for an in-process steerlab model: the engine's scoring, no HTTP.

``lm_eval_model(lm, steers)`` is an ``lm_eval.api.model.TemplateLM`` whose requests go
straight to ``lm.engine``:

- ``loglikelihood`` (multiple choice and the like): lm-eval's own encoding of each context
  and continuation (``TemplateLM``), then ``engine.scoring.score_continuations`` for all
  requests in one call, so the engine feeds each shared context once for all its choices;
- ``loglikelihood_rolling`` (perplexity): lm-eval's rolling windows, cut as its ``hf``
  model cuts them at the same ``max_length`` (``utils.get_rolling_token_windows`` with
  ``max_seq_len=max_length``, then each window its last ``max_length + 1`` tokens), every
  document's windows together, 16 a forward (they share no start, so no KV cache is kept);
  a document's loglikelihood is the sum of its windows';
- ``generate_until``: greedy (or the task's temperature) decoding to the task's stop
  strings, the context cut from the left to leave room for the new tokens, as ``hf`` does;
  requests of the same settings decode together, ``ROWS`` a call, each row stopping at its
  own ``until`` strings.

Every request is steered by the same steers (a vector's scale and the call's alpha
included), as a served preset is. ``max_length`` is the model's window (``n_ctx``), as
lm-eval's ``hf`` model reads it from the config, so per-sample values equal ``hf``'s.
Tokens are the model's own tokenizer's, without special tokens (``hf`` with
``add_bos_token=False``); a rolling window starts from the BOS, else the EOS.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from steerlab.core.request import Request, Sampling
from steerlab.core.steer import Steer
from steerlab.engine.scoring import score_continuations

if TYPE_CHECKING:
    from steerlab.model import SteerableModel

MAX_GEN_TOKS = 256  # lm-eval's hf model's default for generate_until
ROWS = 64  # generate_until rows a call at most (the server scheduler's max_rows too)
# lm-eval's generation settings that steerlab's sampling honours (the rest are refused)
_GEN_KWARGS = {"until", "max_gen_toks", "do_sample", "temperature", "top_p", "top_k"}


def lm_eval_model(lm: SteerableModel, steers: Sequence[Steer] = (), *, name: str = "") -> Any:
    """lm-eval's model scoring ``lm`` in this process, steered by ``steers`` (one alpha each).

    >>> model = lm_eval_model(lm)  # then lm_eval.simple_evaluate(model=model, tasks=[...])
    >>> model.max_length, model.prefix_token_id  # steerlab-tiny's window and its BOS
    (128, 0)
    """
    if lm.n_ctx is None:
        raise ValueError("lm-eval needs the model's context window; this model has no n_ctx.")
    for steer in steers:
        if len(steer.alpha) != 1:
            raise ValueError(f"A steer for lm-eval has one alpha; got {steer.alpha}.")
    return _model_class()(lm, steers, name or lm.name)


@functools.cache
def _model_class() -> type:
    from lm_eval.api.model import TemplateLM

    class SteerlabLM(TemplateLM):  # type: ignore[misc]
        """lm-eval's model over a steerlab model's engine, in this process."""

        def __init__(self, lm: SteerableModel, steers: Sequence[Steer], name: str) -> None:
            super().__init__()
            self.lm, self.name, self.tokenizer = lm, name, lm.tokenizer
            self.row_steers = tuple(Steer.of(s, s.alpha[0]) for s in steers)

        @property
        def max_length(self) -> int:
            return int(self.lm.n_ctx)  # type: ignore[arg-type]  # checked in lm_eval_model

        @property
        def eot_token_id(self) -> int:
            return int(self.tokenizer.eos_token_id)

        @property
        def prefix_token_id(self) -> int:
            bos = self.tokenizer.bos_token_id
            return int(bos if bos is not None else self.tokenizer.eos_token_id)

        def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                       **kwargs: Any) -> list[int]:  # fmt: skip
            return list(self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens)))

        def loglikelihood(self, requests: list[Any],
                          disable_tqdm: bool = False) -> list[tuple[float, bool]]:  # fmt: skip
            return super().loglikelihood(requests, disable_tqdm=True)  # no tokenizing bar

        def tok_decode(self, tokens: Sequence[int]) -> str:
            return str(self.tokenizer.decode(tokens))

        def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False,
                                  shared: bool = True, **kwargs: Any) -> list[tuple[float, bool]]:  # fmt: skip
            pairs = [(list(context) + list(cont), len(cont)) for _, context, cont in requests]
            out = score_continuations(self.lm.engine, pairs, window=self.max_length,
                                      steers=self.row_steers, shared=shared)  # fmt: skip
            for (key, _, _), answer in zip(requests, out):
                if key is not None:
                    self.cache_hook.add_partial("loglikelihood", key, answer)
            return out

        def loglikelihood_rolling(self, requests: list[Any],
                                  disable_tqdm: bool = False) -> list[float]:  # fmt: skip
            # hf's windows: max_seq_len is max_length itself; the windows are disjoint
            return rolling_loglikelihoods(
                self, requests, self.max_length,
                lambda windows: self._loglikelihood_tokens(windows, shared=False))  # fmt: skip

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            return generate_until(self, requests)

        def get_model_info(self) -> dict[str, Any]:
            """What lm-eval records as the run's model (``results["config"]``)."""
            return {"model": self.name, "steerlab_path": "in-process",
                    "steered": bool(self.row_steers)}  # fmt: skip

    return SteerlabLM


def rolling_loglikelihoods(model: Any, requests: list[Any], max_seq_len: int,
                           score: Any) -> list[float]:  # fmt: skip
    """lm-eval's rolling loglikelihood for every document, all documents' windows scored in
    one ``score(windows)`` call: each document cut as lm-eval cuts it (its
    ``get_rolling_token_windows`` at ``max_seq_len``), its value the sum of its windows'."""
    from lm_eval import utils

    texts = [request.args[0] for request in requests]
    windows: list[tuple[Any, ...]] = []
    counts = []
    for text in texts:
        split = utils.get_rolling_token_windows(
            token_list=model.tok_encode(text), prefix_token=model.prefix_token_id,
            max_seq_len=max_seq_len, context_len=1,
        )  # fmt: skip
        doc = [(None, *utils.make_disjoint_window(w)) for w in split]
        windows += doc
        counts.append(len(doc))
    scores = iter(score(windows))
    out = []
    for text, n in zip(texts, counts):
        total = sum(next(scores)[0] for _ in range(n))
        model.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
        out.append(total)
    return out


def generate_until(model: Any, requests: list[Any]) -> list[str]:
    """lm-eval's ``generate_until`` requests with the model's steers, batched: the requests
    that share their settings (everything but the stop strings) run together, longest
    prompt first (as ``hf`` sorts them), ``ROWS`` a call; each row stops at its own
    ``until`` strings (``Sampling.stop``), at EOS or after ``max_gen_toks`` tokens.

    The text is ``hf``'s: the continuation decoded without special tokens, cut at the
    first ``until`` string. A row stops once its text holds one (``hf`` goes on to the
    batch's end, then cuts), so the two agree except where two ``until`` strings overlap in
    the text (``hf`` cuts at each string in turn, ours at the earliest start)."""
    rows = [generation(model, request.args) for request in requests]
    groups: dict[Sampling, list[int]] = {}
    for i, (_, sampling) in enumerate(rows):
        groups.setdefault(replace(sampling, stop=()), []).append(i)
    texts: dict[int, str] = {}
    for members in groups.values():
        members.sort(key=lambda i: -len(rows[i][0]))  # hf's order: the least padding
        for start in range(0, len(members), ROWS):
            part = members[start : start + ROWS]
            calls = [Request(rows[i][0], model.row_steers, rows[i][1], stream=str(i))
                     for i in part]  # fmt: skip
            for i, done in zip(part, model.lm.engine.run(calls)):
                texts[i] = done.text
    out = [texts[i] for i in range(len(requests))]
    for request, text in zip(requests, out):
        model.cache_hook.add_partial("generate_until", request.args, text)
    return out


def generation(model: Any, args: tuple[str, dict[str, Any]]) -> tuple[tuple[int, ...], Sampling]:
    """One ``generate_until`` request's prompt and sampling, read as ``hf`` reads it: lm-eval's
    ``normalize_gen_kwargs`` (``max_gen_toks`` and its aliases, ``do_sample`` against
    ``temperature``), the prompt's last ``max_length - max_gen_toks`` tokens. A setting
    steerlab's sampling has no equal for is refused by name, not ignored."""
    from lm_eval.models.utils import normalize_gen_kwargs

    context, given = args
    kwargs = dict(normalize_gen_kwargs(dict(given), MAX_GEN_TOKS))
    unknown = sorted(set(kwargs) - _GEN_KWARGS)
    if unknown:
        raise ValueError(f"generate_until's {unknown[0]}={kwargs[unknown[0]]!r} (task setting) "
                         f"has no equal in steerlab's sampling; it takes {sorted(_GEN_KWARGS)}.")  # fmt: skip
    until = kwargs["until"]
    stops = tuple(s for s in ([until] if isinstance(until, str) else until) if s)
    new = int(kwargs["max_gen_toks"])
    sampled = bool(kwargs.get("do_sample")) and float(kwargs.get("temperature") or 0.0) > 0
    # one seed for the call, so requests of the same settings share it (a row's own random
    # stream is its ``Request.stream``)
    options: dict[str, Any] = {"max_new_tokens": new, "stop": stops, "seed": 0}
    if sampled:
        options["temperature"] = float(kwargs["temperature"])
        for name in ("top_p", "top_k"):
            if kwargs.get(name) is not None:
                options[name] = kwargs[name]
    prompt = tuple(model.tok_encode(context)[-max(model.max_length - new, 1) :])
    return prompt, Sampling.of(options, where="generate_until")
