"""Reading a folder pyreft saved (``ReftModel.save``, which is pyvene's ``IntervenableModel.save``).

What pyvene 0.1.8 writes, read from its source (``intervenable_base.py``,
``configuration_intervenable_model.py``) and checked on folders pyreft 0.1.0 saved
(``scripts/make_pyreft_fixture.py``):

- ``config.json``: ``representations`` is a list of ``RepresentationConfig`` named tuples,
  which JSON writes as lists and pyvene reads back by position:
  ``[layer, component, unit, max_number_of_units, low_rank_dimension, ...]``;
  ``intervention_types`` names each one's class as ``str(type)``, such as
  ``"<class 'pyreft.interventions.LoreftIntervention'>"``. Some hand-written configs use
  dictionaries with the same field names; both are read.
- ``intkey_<key>.bin``: each trainable intervention's ``state_dict`` as a torch pickle. For
  LoReFT: ``rotate_layer`` ``[d_model, rank]`` (orthonormal columns), and its
  ``learned_source`` Linear's ``weight`` ``[rank, d_model]`` and ``bias`` ``[rank]``.

pyvene's ``block_output`` of layer L is the output of transformer block L: steerlab's
``blocks.L.hook_resid_post``. pyreft does not record the positions it trained on (they are
an argument of its data module), so the caller names them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from steerlab.core.errors import SteerError

# pyvene's RepresentationConfig fields, in the order a list form holds them
FIELDS = ("layer", "component", "unit", "max_number_of_units", "low_rank_dimension")
DEFAULTS: dict[str, Any] = {"layer": 0, "component": "block_output", "unit": "pos",
                            "max_number_of_units": 1, "low_rank_dimension": None}  # fmt: skip
SITES = {"block_output": "blocks.{}.hook_resid_post"}  # pyvene component -> steerlab site
LOREFT_TYPE = "LoreftIntervention"
_PYREFT_SPAN = re.compile(r"f(\d+)\+l(\d+)|f(\d+)()|()l(\d+)")  # f3+l3, f3, l3


def read_config(folder: Path) -> dict[str, Any] | None:
    """``config.json`` as a dictionary, or None where the folder has none."""
    path = folder / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except RecursionError:
        raise SteerError(f"{path} is nested too deeply to be a pyreft config.") from None
    except (OSError, ValueError) as error:
        raise SteerError(f"{path} is not readable JSON: {error}") from None
    if not isinstance(config, dict):
        raise SteerError(f"{path} must hold a JSON object; it holds {type(config).__name__}.")
    return config


def representation(entry: Any, where: str) -> dict[str, Any]:
    """One ``representations`` entry, list (pyvene's own) or dictionary, as named fields."""
    if isinstance(entry, list):
        named = dict(zip(FIELDS, entry))
    elif isinstance(entry, dict):
        named = {f: entry[f] for f in FIELDS if f in entry}
    else:
        raise SteerError(f"{where} must be a list (as pyvene writes it) or an object; got "
                         f"{type(entry).__name__}.")  # fmt: skip
    out = {**DEFAULTS, **{k: v for k, v in named.items() if v is not None}}
    layer = out["layer"]
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise SteerError(f"{where}'s layer must be an int >= 0; got {layer!r:.40}.")
    return out


def one_representation(config: dict[str, Any], where: str) -> dict[str, Any]:
    """The folder's one representation, checked to be a LoReFT at a position unit."""
    entries = config.get("representations")
    if not isinstance(entries, list) or len(entries) != 1:
        count = len(entries) if isinstance(entries, list) else "no"
        raise SteerError(f"{where} has {count} representations; from_pyreft reads a folder "
                         "with exactly one intervention.")  # fmt: skip
    rep = representation(entries[0], f"{where} representations[0]")
    if rep["unit"] != "pos":
        raise SteerError(f"{where} intervenes on unit {rep['unit']!r:.40}; steerlab reads "
                         "pyreft's per-position ('pos') interventions only.")  # fmt: skip
    types = config.get("intervention_types")
    if isinstance(types, list) and types and not all(
            isinstance(t, str) and t.rstrip("'>").endswith(LOREFT_TYPE) for t in types):  # fmt: skip
        raise SteerError(f"{where} intervention_types is {types!r:.120}; from_pyreft reads "
                         f"{LOREFT_TYPE} only (other ReFT forms have other parameters).")  # fmt: skip
    return rep


def site_of(rep: dict[str, Any], where: str) -> str:
    """steerlab's site for a pyvene component at a layer (``block_output`` only)."""
    component = rep["component"]
    if component not in SITES:
        raise SteerError(f"{where} intervenes at component {component!r:.40}; from_pyreft maps "
                         f"{sorted(SITES)} (give site= for another).")  # fmt: skip
    return SITES[component].format(rep["layer"])


def state_tensors(state: Any, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rotate_layer, weight, bias)`` from a LoReFT ``state_dict``, each a tensor."""
    if not isinstance(state, dict) or not {"rotate_layer", "weight", "bias"} <= set(state):
        raise SteerError(f"{name} is not a LoReFT intervention (it needs rotate_layer, weight "
                         "and bias).")  # fmt: skip
    for key in ("rotate_layer", "weight", "bias"):
        if not isinstance(state[key], torch.Tensor):
            raise SteerError(f"{name}'s {key} must be a tensor; got "
                             f"{type(state[key]).__name__}.")  # fmt: skip
    rotate = state["rotate_layer"]
    if rotate.ndim != 2:
        raise SteerError(f"{name}'s rotate_layer must be [d_model, rank]; got "
                         f"{tuple(rotate.shape)}.")  # fmt: skip
    return rotate, state["weight"], state["bias"]


def positions_of(positions: Any) -> Any:
    """steerlab's position rule from pyreft's notation (``"f3+l3"``, ``"f1"``, ``"l2"``); any
    other value is passed on as steerlab's own (``"first:3+last:3"``, ``"all"``...)."""
    if positions is None:
        raise SteerError("from_pyreft needs positions=: pyreft does not record the positions "
                         "it trained on. Give them as trained, in pyreft's notation ('f3+l3') "
                         "or steerlab's ('first:3+last:3').")  # fmt: skip
    if isinstance(positions, str) and (m := _PYREFT_SPAN.fullmatch(positions)):
        first, last = (int(g) if g else 0 for g in (m[1] or m[3] or m[5], m[2] or m[4] or m[6]))
        spans = [f"first:{first}"] * bool(first) + [f"last:{last}"] * bool(last)
        return "+".join(spans) or positions  # "f0": steerlab refuses it by name
    return positions
