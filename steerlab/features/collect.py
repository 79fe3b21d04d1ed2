"""``features(lm, prompts, sae)``: read a model's residual stream through an SAE."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from steerlab.core.identity import ModelId
from steerlab.core.sites import resolve
from steerlab.core.steer import warn_made_elsewhere
from steerlab.features.activations import FeatureActivations, check_k
from steerlab.features.errors import SAEError
from steerlab.features.sae import SAE

if TYPE_CHECKING:
    from steerlab.model import SteerableModel


def features(
    lm: SteerableModel,
    prompts: Any,
    sae: SAE,
    *,
    k: int = 16,
    dense: bool = False,
    steer: Any = None,
    chat: bool = False,
) -> FeatureActivations:
    """One forward pass over ``prompts``; the SAE encodes the residual at ``sae.site``.

    Args:
        lm: the model (``sae.site`` must be one of its sites, ``d_model == sae.d_in``).
        prompts: a string or a list of them (message lists with ``chat=True``).
        sae: the SAE.
        k: features kept per token (``acts.top(k)`` up to this).
        dense: also keep ``acts.values``, ``[batch, pos, d_sae]``: ``batch * pos * d_sae * 4``
            bytes in float32, which for real SAEs (16k-131k features) is large.
        steer: steering during the pass, as for ``lm.run_with_cache``: the features of a
            steered model, for a steered-against-baseline trace.
        chat: apply the chat template.

    Raises:
        SiteError: the model has no site ``sae.site``.
        SAEError: the model's width is not the SAE's ``d_in``; a bad ``k``.

    >>> acts = features(lm, ["Once upon a time"], sl.load_sae("steerlab-tiny-sae"))
    >>> acts.top(3).indices.shape  # [batch, pos, k]
    torch.Size([1, 5, 3])
    """
    check_model(lm, sae)
    check_k(k, sae)
    acts = lm.run_with_cache(prompts, sites=[sae.site], steer=steer, chat=chat)
    return FeatureActivations.from_residual(
        sae, acts[sae.site], acts.attention_mask, acts.tokens, acts.str_tokens, k=k, dense=dense,
        bos_token_id=getattr(lm.tokenizer, "bos_token_id", None),
    )  # fmt: skip


def check_model(lm: SteerableModel, sae: SAE) -> None:
    """Refuse an SAE the model cannot feed; warn when it was trained on another model.

    Raises:
        SiteError: the model has no site ``sae.site``.
        SAEError: ``lm.d_model != sae.d_in``.

    >>> check_model(lm, sl.load_sae("steerlab-tiny-sae"))
    """
    resolve(sae.site, lm.sites())
    if lm.d_model != sae.d_in:
        raise SAEError(
            f"This SAE reads {sae.d_in}-wide activations at {sae.site}; the model's are "
            f"{lm.d_model}-wide. It was trained on {sae.model_name or 'another model'!r}."
        )
    made_for = ModelId(sae.model_name, sae.model_config_sha256)
    warn_made_elsewhere(made_for, lm, "This SAE", verb="trained")
