"""SAE features as steering directions: SAELens-format SAEs and their activations.

An ``SAE`` is a value read from a SAELens folder (``cfg.json`` + ``sae_weights.safetensors``);
``sae.feature(i)`` is a ``SteeringVector`` at ``sae.site``. ``features(lm, prompts, sae)``
reads what the SAE sees in a model's residual stream. Reading needs no sae-lens; only
``load_sae(release, sae_id)`` (SAELens's pretrained registry) does.

>>> sae = load_sae("steerlab-tiny-sae")
>>> lm.generate("The day was", steer=sae.feature(112) * 8, max_new_tokens=8).text
[' the cat went for a walk. The']
"""

from steerlab.features.activations import FeatureActivations, TopFeatures
from steerlab.features.collect import features
from steerlab.features.errors import SAEError, SAEUnavailableError
from steerlab.features.load import TOY_SAES, load_sae
from steerlab.features.sae import ARCHITECTURES, SAE
from steerlab.model import provide

provide("features", features)  # lm.features(...), without the facade importing this package

__all__ = [
    "ARCHITECTURES",
    "SAE",
    "TOY_SAES",
    "FeatureActivations",
    "SAEError",
    "SAEUnavailableError",
    "TopFeatures",
    "features",
    "load_sae",
]
