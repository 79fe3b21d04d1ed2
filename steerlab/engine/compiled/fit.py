"""Whether a call fits the compiled path, and if not, why (what ``lm.explain`` shows)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from steerlab.core.ops import OPS, Op, form_of
from steerlab.core.positions import touches_generated
from steerlab.core.request import Request
from steerlab.core.tagging import _TAG
from steerlab.engine.compiled.families import family_reason
from steerlab.engine.plan import Plan, PlanSteer

_RECORDERS = ("transformer_lens.model_bridge", "transformers.utils.output_capturing")


def foreign_hooks(model: nn.Module) -> bool:
    """Hooks on ``model`` that are not steerlab's: the compiled step would skip them.

    A TransformerBridge wires capture hooks of its own on its first forward, and
    transformers installs output-capturing hooks (for ``output_hidden_states`` and the
    like); they only record, for readers the compiled step does not serve, so they do not
    count.
    """
    for module in model.modules():
        for name in ("_forward_hooks", "_forward_pre_hooks"):
            for fn in getattr(module, name, {}).values():
                ours = getattr(fn, _TAG, False)
                module_name = getattr(fn, "__module__", "") or ""
                recorder = module_name.startswith(_RECORDERS)
                if not (ours or recorder):
                    return True
    return False


def decode_steers(plan: Plan, row: int) -> list[tuple[PlanSteer, float]]:
    """The steers of a row that the compiled decode step applies, with its alphas: those
    that can touch a generated token. The rest ("prompt", a span such as "first:3+last:3")
    act only in the prefill, which runs eagerly with hooks, so they fit whatever their
    operation."""
    return [(s, a) for s, a in plan.of_row(row) if touches_generated(s.positions)]


def steer_reason(plan: Plan) -> str | None:
    """Steers the compiled step cannot hold at generated tokens: custom operations,
    operations with no table form (a topk feature clamp reads the whole encoder, a LoReFT
    its matrices), two on one site of a row; per-token gates."""
    if any(s.gate is not None and s.gate.per_token for s in plan.steers):
        return ("a read='token' condition gates each position in the forward; the "
                "compiled table holds one decision per row")  # fmt: skip
    for i in range(plan.rows):
        steers = [s for s, _ in decode_steers(plan, i)]
        sites = [s.site for s in steers]
        if len(set(sites)) < len(sites):
            return f"row {i} has two steers at one site (the compiled table holds one per site)"
        for steer in steers:
            if form_of(steer.op) is None:
                table = sorted(OPS)
                kind = "custom operation" if not isinstance(steer.op, Op) else "operation"
                return (
                    f"{kind} {steer.op!r} at positions {steer.positions!r} has no table form "
                    f"(compiled: {', '.join(table)}; any operation at prompt-only positions)"
                )
    return None


def call_reason(requests: Sequence[Request], *, cache: object, keep_cache: bool,
                capture: Sequence[str], use_cache: bool) -> str | None:  # fmt: skip
    """Call options the compiled path does not take."""
    if cache is not None:
        return "continuing a cache (cache=)"
    if keep_cache:
        return "keep_cache=True"
    if capture:
        return "capturing activations (capture=)"
    if not use_cache:
        return "use_cache=False"
    if not all(r.prompt for r in requests):
        return "a request with no prompt tokens"
    return None


def model_reason(kind: str, model: nn.Module | None, length: int,
                 n_ctx: int | None) -> str | None:  # fmt: skip
    """What about the model (and the call's length) rules the compiled step out."""
    if model is None:
        return f"the {kind!r} backend has no compiled step (hf and bridge do)"
    why = family_reason(model, length)
    if why is not None:
        return why
    if n_ctx is not None and length > n_ctx:
        return f"{length} positions exceed the model's context of {n_ctx}"
    if len({p.device for p in model.parameters()}) > 1:
        return "the model is split over several devices"
    if foreign_hooks(model):
        return "the model has hooks of its own (the compiled step would bypass them)"
    return None
