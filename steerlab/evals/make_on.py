"""``make_on``: the benchmark's steers made on one model and generated on another.

A vLLM engine generates fast but cannot read activations or train, so ``benchmark(vllm_lm,
..., make_on=hf_lm)`` makes every method's steer (and measures detection) on an in-process
model. That is exact only when both hold the same weights: their configs must have one
fingerprint, their tokenizers must cut a probe text alike, and the probe's per-token
log-probabilities (``engine.scoring.score_prompts``, which every engine answers) must agree
to the dtypes' rounding. Two models of one config with other weights differ by nats there.
"""

from __future__ import annotations

from typing import Any

from steerlab.core.errors import SteerError
from steerlab.engine.scoring import score_prompts

# Mixed topics and punctuation, so that most of the vocabulary's common paths are read.
PROBE = "The sea was calm at dawn; 3 boats left port, and the old keeper wrote: 'all clear.'"
# The largest mean |Δ log-probability| per probe token that still counts as the same weights:
# float32 on both sides agrees to ~1e-5 (kernels differ in summation order); bfloat16 on one
# side moves a log-probability by a few hundredths. Other weights of one config move it by
# whole nats.
TOLERANCE = {True: 1e-3, False: 0.25}


def check_make_on(lm: Any, make_on: Any) -> None:
    """Refuse a ``make_on`` that cannot make ``lm``'s steers exactly, naming why.

    >>> check_make_on(lm, lm)  # a model is its own maker
    """
    if make_on is lm:
        return
    engine = getattr(make_on, "engine", None)
    if engine is None or not callable(getattr(make_on, "sites", None)):
        raise SteerError(f"make_on must be an in-process sl.SteerableModel (sl.load(..., "
                         f"backend='hf')); got {type(make_on).__name__}.")  # fmt: skip
    if not engine.capabilities.capture:
        raise SteerError(f"make_on is a {engine.kind} model, which cannot read activations or "
                         "train: give an in-process model (backend 'hf', 'bridge' or 'hooked') "
                         "with the same weights.")  # fmt: skip
    mine, theirs = lm.config_sha256, make_on.config_sha256
    if mine and theirs and mine != theirs:
        raise SteerError(f"make_on has other weights than the model that generates: their "
                         f"configs differ (config sha256 {theirs} vs {mine}).")  # fmt: skip
    ids, other_ids = (m.tokenizer.encode(PROBE) for m in (lm, make_on))
    if list(ids) != list(other_ids):
        raise SteerError("make_on has another tokenizer than the model that generates: they cut "
                         "the same text into other tokens.")  # fmt: skip
    if sorted(lm.sites()) != sorted(make_on.sites()):
        raise SteerError("make_on has other sites than the model that generates (another "
                         "architecture or depth).")  # fmt: skip
    gap, float32 = weight_gap(lm, make_on, list(ids))
    if not gap <= TOLERANCE[float32]:
        raise SteerError(f"make_on has other weights than the model that generates: a probe "
                         f"text's log-probabilities differ by {gap:.3g} nats a token on "
                         f"average (at most {TOLERANCE[float32]:g} for the same weights"
                         f"{' in float32' if float32 else ''}).")  # fmt: skip


def weight_gap(lm: Any, make_on: Any, ids: list[int]) -> tuple[float, bool]:
    """The mean |Δ log-probability| of ``ids``'s tokens between the two models, and whether
    both run in float32 (where the tolerance is tight)."""
    [a], [b] = (score_prompts(m.engine, [ids]) for m in (lm, make_on))
    gaps = [abs(x.logprob - y.logprob) for x, y in zip(a[1:], b[1:]) if x and y]
    if not gaps:  # a one-token probe predicts nothing: nothing tells the weights apart
        return 0.0, True
    return sum(gaps) / len(gaps), all(_is_float32(m) for m in (lm, make_on))


def _is_float32(lm: Any) -> bool:
    dtype = getattr(lm.engine, "dtype", None)  # vLLM's engine knows it; in-process: the weights'
    if dtype is None and lm.backend is not None:
        dtype = next(lm.backend.model.parameters()).dtype
    return str(dtype).removeprefix("torch.") == "float32"
