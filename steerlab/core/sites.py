"""Canonical hook-site names, shared by every backend.

Sites use TransformerLens names so that a vector extracted on one backend steers
any other: ``blocks.{L}.hook_resid_pre``, ``hook_resid_mid``, ``hook_resid_post``,
``hook_attn_out``, ``hook_mlp_out``, plus ``hook_embed``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from steerlab.core.errors import SiteError

BLOCK_KINDS = (
    "hook_resid_pre",
    "hook_resid_mid",
    "hook_resid_post",
    "hook_attn_out",
    "hook_mlp_out",
)
EMBED = "hook_embed"
# Within a block: input, attention written, mid, MLP written, output.
# The kinds of a block in the order a forward pass computes them.
FORWARD_KINDS = (
    "hook_resid_pre",
    "hook_attn_out",
    "hook_resid_mid",
    "hook_mlp_out",
    "hook_resid_post",
)
_BLOCK_RE = re.compile(r"^blocks\.(\d+)\.(hook_\w+)\Z")
# Why a model may lack a whole kind of block site.
WHY_ABSENT = {
    "hook_resid_mid": "Its blocks have no residual stream between attention and MLP: in a "
    "parallel block (GPT-J, GPT-NeoX, Phi-2, Falcon, Cohere) both read the block input. "
    "Steer hook_resid_pre, hook_attn_out or hook_resid_post instead.",
}


@dataclass(frozen=True, order=True)
class Site:
    """A parsed canonical site: ``layer`` is None for ``hook_embed``.

    >>> Site.parse("blocks.2.hook_resid_pre")
    Site(layer=2, kind='hook_resid_pre')
    """

    layer: int | None
    kind: str

    @classmethod
    def parse(cls, name: str) -> Site:
        if name == EMBED:
            return cls(None, EMBED)
        match = _BLOCK_RE.match(name)
        if match is None or match.group(2) not in BLOCK_KINDS:
            raise SiteError(f"{name!r} is not a steerlab site name.")
        return cls(int(match.group(1)), match.group(2))

    @property
    def forward_order(self) -> tuple[int, int]:
        """Sort key for the order activations are computed in a forward pass."""
        if self.layer is None:
            return (-1, 0)
        return (self.layer, FORWARD_KINDS.index(self.kind))

    @property
    def name(self) -> str:
        return self.kind if self.layer is None else f"blocks.{self.layer}.{self.kind}"

    def __str__(self) -> str:
        return self.name


def all_sites(
    n_layers: int, *, embed: bool = True, kinds: Collection[str] = BLOCK_KINDS
) -> list[str]:
    """Every canonical site of a model with ``n_layers`` blocks, in forward order.

    ``kinds`` leaves out block sites the model does not have, such as ``hook_resid_mid``
    in a parallel-residual block.
    """
    names = [EMBED] if embed else []
    for layer in range(n_layers):
        names += [f"blocks.{layer}.{kind}" for kind in BLOCK_KINDS if kind in kinds]
    return names


def site_names(sites: str | Sequence[str], what: str = "sites") -> list[str]:
    """Site names as a list: one name alone is one site (never its characters); ``what``
    names the argument in a refusal.

    >>> site_names("blocks.1.hook_resid_pre")
    ['blocks.1.hook_resid_pre']
    """
    if not isinstance(sites, str) and (isinstance(sites, bytes) or not hasattr(sites, "__iter__")):
        raise SiteError(f"{what} must be a site name or a list of them; got "
                        f"{type(sites).__name__} {sites!r:.40}.")  # fmt: skip
    names = [sites] if isinstance(sites, str) else list(sites)
    for name in names:
        if not isinstance(name, str):
            raise SiteError(f"{what} must be site names; got {type(name).__name__} {name!r:.40}.")
    return names


def resolve(name: str, valid: list[str]) -> Site:
    """Parse ``name`` and check it against the model's ``valid`` sites.

    Raises:
        SiteError: naming the closest valid sites, the valid layer range, or why the
            model has no site of that kind.
    """
    if name in valid:
        return Site.parse(name)
    if not isinstance(name, str):
        raise SiteError(f"A site name is a string such as 'blocks.0.hook_resid_pre'; got {name!r}.")
    if name != name.strip():
        raise SiteError(
            f"Site name {name!r} has leading or trailing whitespace; use {name.strip()!r}."
        )
    match = _BLOCK_RE.match(name)
    if match and match.group(1) != str(int(match.group(1))):
        fixed = f"blocks.{int(match.group(1))}.{match.group(2)}"
        raise SiteError(f"Site name {name!r} writes its layer with a leading zero; use {fixed!r}.")
    layers = sorted({layer for v in valid if (layer := Site.parse(v).layer) is not None})
    kind = match.group(2) if match else ""
    if kind in BLOCK_KINDS and not any(v.endswith(kind) for v in valid):
        why = WHY_ABSENT.get(kind, "")
        raise SiteError(f"This model has no {kind} sites, so not {name!r}. {why}".rstrip())
    if match and kind in BLOCK_KINDS and layers:
        raise SiteError(
            f"Layer {match.group(1)} is out of range in {name!r}: this model has layers "
            f"0..{layers[-1]}."
        )
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise SiteError(f"Unknown site {name!r}.{hint} `lm.sites()` lists all {len(valid)}.")
