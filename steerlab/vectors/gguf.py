"""llama.cpp's control vectors: a steering vector as the GGUF file llama.cpp steers with.

``vec.save("happy.gguf")`` writes, and ``SteeringVector.load("happy.gguf", model=lm)`` reads,
the file that ``llama-cli`` / ``llama-server --control-vector(-scaled)`` load (and ollama and
LM Studio through them), as repeng's ``ControlVector.export_gguf`` writes it: GGUF version 3,
little-endian, the key ``general.architecture = "controlvector"``, the keys
``controlvector.model_hint`` (a string) and ``controlvector.layer_count`` (uint32, the number
of directions), then one 1-D float32 tensor ``direction.{L}`` per layer, data aligned to 32
bytes. Written here in plain Python (no ``gguf`` package needed), read without pickle.

**Layers.** llama.cpp adds ``direction.{L}`` to the output of its layer ``L`` (``l_out``,
after the MLP's residual add), counting layers from 0, and never steers layer 0 (a file with
``direction.0`` is refused by its loader). repeng numbers layers the same way (HF's
``hidden_states[L + 1]``, block ``L``'s output). So:

- ``direction.{L}`` is ``blocks.{L}.hook_resid_post``, for ``1 <= L < n_layers``;
- ``blocks.{L}.hook_resid_pre`` is the same activation as ``blocks.{L-1}.hook_resid_post``
  (the residual stream between two blocks), and is written as ``direction.{L-1}``;
- a file read back gives each direction at ``blocks.{L}.hook_resid_post``, unless steerlab
  wrote it from other sites (``hook_resid_pre``): then its key ``steerlab.sites`` (which
  llama.cpp ignores) restores them.

**Provenance.** A vector's provenance beyond its model (the method, the data's sha256, a
trained vector's settings ...) is written as string keys ``steerlab.<field>`` (the fields
of a ``.safetensors`` file's metadata, checked by the same schema), which llama.cpp and the
``gguf`` package read past; read back, the vector keeps it. A file of ``hook_resid_post``
sites from a vector that knows no more than its model has repeng's keys only, and is byte
for byte what repeng exports for the same directions.

**What cannot travel.** A control vector is one direction added at every position of a
layer's output, scaled by the one strength llama.cpp is given. So only residual-stream
sites between two blocks (not ``hook_embed``, ``hook_resid_mid``, ``hook_attn_out``,
``hook_mlp_out``, nor block 0's output), only ``Add`` (not ``Ablate``, ``Clamp``, ``Cap``,
``Rotate``, feature clamps, LoReFT), at every position (``positions="all"``, no condition)
are written; anything else is refused by name before a byte is written. llama.cpp reads no
scale either: a vector with a scale other than 1 is written as ``direction * scale``
(float32), and reads back with scale 1.
"""

from __future__ import annotations

import io
import math
import re
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import torch

from steerlab.core import atomic
from steerlab.core.errors import SiteError
from steerlab.core.ops import Add
from steerlab.core.sites import Site
from steerlab.core.steer import Steer
from steerlab.vectors.io import SCHEMA, VectorFileError, provenance_metadata, provenance_of
from steerlab.vectors.vector import Provenance, SteeringVector

if TYPE_CHECKING:
    from steerlab.model import SteerableModel

MAGIC, VERSION, ALIGNMENT = b"GGUF", 3, 32
ARCH = "controlvector"
PREFIX = "steerlab."  # steerlab's own keys, which llama.cpp ignores
SITES_KEY = PREFIX + "sites"  # the sites a file's directions came from
PROVENANCE_FIELDS = frozenset(
    provenance_metadata(Provenance(model_config_sha256="0" * 16, training="{}"))
)
_STRING, _UINT32, _ARRAY = 8, 4, 9  # GGUF value types used here
_F32 = 0  # GGML's tensor type for float32
# GGUF's scalar value types: struct format by type id (8 string, 9 array are read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_MAX_COUNT = 1 << 20  # keys, tensors or array items in a control vector: far fewer


def layer_of(site: str) -> int:
    """The llama.cpp layer whose output ``site`` is, or a ``ValueError`` saying why the
    site has none.

    >>> layer_of("blocks.3.hook_resid_post"), layer_of("blocks.3.hook_resid_pre")
    (3, 2)
    """
    parsed = Site.parse(site)
    if parsed.kind == "hook_resid_post" and parsed.layer is not None:
        layer = parsed.layer
    elif parsed.kind == "hook_resid_pre" and parsed.layer is not None:
        layer = parsed.layer - 1
    else:
        raise ValueError(
            f"{site} cannot travel to llama.cpp: a control vector is added to a layer's output "
            "(blocks.L.hook_resid_post, or the next block's hook_resid_pre), not to "
            f"{parsed.kind}."
        )
    if layer < 1:
        raise ValueError(
            f"{site} cannot travel to llama.cpp: it is the residual stream before block 1, and "
            "llama.cpp never steers layer 0's output nor the embeddings (its loader refuses "
            "direction.0). Steer blocks.1.hook_resid_post or later."
        )
    return layer


def site_of(layer: int) -> str:
    """The canonical site of ``direction.{layer}``: block ``layer``'s output.

    >>> site_of(3)
    'blocks.3.hook_resid_post'
    """
    return f"blocks.{layer}.hook_resid_post"


def save(source: SteeringVector | Steer | Sequence[Steer], path: str | Path) -> Path:
    """Write ``source`` as llama.cpp's control-vector GGUF (see the module's docstring).

    ``source`` is a steering vector, or steers (``Add`` at every position, one alpha each,
    which multiplies the direction written).

    >>> vec = sl.SteeringVector({"blocks.2.hook_resid_pre": torch.ones(lm.d_model)})
    >>> save(vec, "ones.gguf")
    PosixPath('ones.gguf')
    """
    path = Path(path)
    if path.suffix != ".gguf":
        raise ValueError(f"A llama.cpp control vector is a .gguf file; got {path.name!r}.")
    directions, hint = _directions(source)
    layers: dict[int, str] = {}
    for site in directions:
        layer = layer_of(site)
        if layer in layers:
            raise ValueError(
                f"{layers[layer]} and {site} are both layer {layer}'s output (direction.{layer}): "
                "add them into one site first."
            )
        layers[layer] = site
    blobs = {layer: _float32(site, directions[site]) for layer, site in layers.items()}
    sizes = {len(blob) // 4 for blob in blobs.values()}
    if len(sizes) != 1:
        raise ValueError(f"The directions have different widths {sorted(sizes)}.")
    sites = [layers[layer] for layer in blobs]
    canonical = all(site == site_of(layer) for layer, site in layers.items())
    extra = _provenance_keys(source.provenance) if isinstance(source, SteeringVector) else {}
    atomic.write_file(path, _gguf(hint, blobs, None if canonical else sites, extra))
    return path


def _provenance_keys(provenance: Provenance) -> dict[str, str]:
    """``steerlab.<field>`` -> the value, for a provenance that knows more than its model
    (which ``controlvector.model_hint`` carries); checked as ``load`` will read it."""
    if provenance == Provenance(model=provenance.model):
        return {}
    fields = provenance_metadata(provenance)
    for key, value in fields.items():
        SCHEMA[key](value)  # never write a file that load would refuse
    return {f"{PREFIX}{key}": value for key, value in fields.items()}


def _directions(source: Any) -> tuple[dict[str, torch.Tensor], str]:
    """Site -> the direction to write (a vector's scale, a steer's alpha, multiplied in),
    and the model hint; what cannot travel is refused."""
    if isinstance(source, SteeringVector):
        if not source.directions:
            raise ValueError("The vector has no direction to write.")
        scale = source.scale
        directions = {s: d if scale == 1.0 else d.float() * scale for s, d in source.directions.items()}  # fmt: skip
        return directions, source.provenance.model
    steers = [source] if isinstance(source, Steer) else list(source)
    if not steers or not all(isinstance(s, Steer) for s in steers):
        raise TypeError(
            "A control vector is written from a SteeringVector or Steers; got "
            f"{type(source).__name__} (LoReFT is a learned low-rank edit, not one added "
            "direction per layer, and cannot travel to llama.cpp)."
        )
    out: dict[str, torch.Tensor] = {}
    for s in steers:
        if type(s.op) is not Add:
            raise ValueError(f"{s.site}: op {type(s.op).__name__} cannot travel to llama.cpp, which only "
                             "adds a control vector (sl.Add).")  # fmt: skip
        if s.positions != "all" or s.when is not None:
            what = "a condition" if s.when is not None else f"positions={s.positions!r}"
            raise ValueError(f"{s.site}: {what} cannot travel to llama.cpp, which adds a "
                             "control vector at every position.")  # fmt: skip
        if len(s.alpha) != 1:
            raise ValueError(f"{s.site}: one alpha per steer (a file holds one strength).")
        if s.site in out:
            raise ValueError(f"{s.site} is steered twice: add the vectors into one steer first.")
        alpha = s.alpha[0]
        out[s.site] = s.vector if alpha == 1.0 else s.vector.float() * alpha
    return out, steers[0].made_for.name


def _float32(site: str, direction: torch.Tensor) -> bytes:
    """The direction's float32 bytes, little-endian; refused where float32 would change it."""
    tensor = direction.detach().cpu()
    if tensor.ndim != 1 or not tensor.is_floating_point():
        raise ValueError(f"{site}: a direction is a 1-D float tensor; got {tuple(tensor.shape)} "
                         f"{tensor.dtype}.")  # fmt: skip
    single = tensor.to(torch.float32)
    if not torch.equal(single.to(tensor.dtype), tensor):
        raise ValueError(f"{site}: this {tensor.dtype} direction changes in float32, the only "
                         "type llama.cpp reads; convert it first (vec.to(torch.float32)).")  # fmt: skip
    if not bool(torch.isfinite(single).all()):
        raise ValueError(f"{site}: the direction has NaN or infinite values.")
    return single.contiguous().numpy().astype("<f4", copy=False).tobytes()


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def _gguf(hint: str, blobs: Mapping[int, bytes], sites: Sequence[str] | None,
          extra: Mapping[str, str]) -> bytes:  # fmt: skip
    """The file: header, keys, tensor infos, padding to 32, then each tensor, padded. The
    keys are repeng's, in its order, then ``steerlab.sites`` only where a site is not the
    canonical one of its layer, and the ``extra`` string keys (a file of
    ``hook_resid_post`` sites and no extra keys is repeng's, byte for byte)."""
    keys = [("general.architecture", _STRING, _string(ARCH)),
            (f"{ARCH}.model_hint", _STRING, _string(hint)),
            (f"{ARCH}.layer_count", _UINT32, struct.pack("<I", len(blobs)))]  # fmt: skip
    if sites is not None:
        keys.append((SITES_KEY, _STRING, _string(",".join(sites))))
    keys += [(key, _STRING, _string(value)) for key, value in extra.items()]
    out = bytearray(MAGIC + struct.pack("<IQQ", VERSION, len(blobs), len(keys)))
    for key, kind, value in keys:
        out += _string(key) + struct.pack("<I", kind) + value
    offset = 0
    for layer, blob in blobs.items():
        out += _string(f"direction.{layer}") + struct.pack("<IQIQ", 1, len(blob) // 4, _F32, offset)
        offset += _padded(len(blob))
    out += bytes(_padded(len(out)) - len(out))
    for blob in blobs.values():
        out += blob + bytes(_padded(len(blob)) - len(blob))
    return bytes(out)


def _padded(n: int, alignment: int = ALIGNMENT) -> int:
    return n + (-n % alignment)


def load(path: str | Path, model: SteerableModel | None = None) -> SteeringVector:
    """Read a llama.cpp control vector (llama.cpp's own, repeng's, or steerlab's); with
    ``model``, check its width and layers first. Each ``direction.{L}`` lands on
    ``blocks.{L}.hook_resid_post`` (steerlab's own files: on the sites they were saved from).

    Raises:
        VectorFileError: not a control-vector GGUF, a malformed one, or one that does not
            fit ``model``.

    >>> ones = sl.SteeringVector({"blocks.2.hook_resid_pre": torch.ones(lm.d_model)})
    >>> _ = save(ones, "ones.gguf")  # written as direction.1: layer 1's output
    >>> list(load("ones.gguf", model=lm).directions)
    ['blocks.2.hook_resid_pre']
    """
    path = Path(path)
    if not path.is_file():
        raise VectorFileError(f"No control vector at {path}.")
    data = path.read_bytes()
    try:
        keys, tensors, start = _parse(io.BytesIO(data), len(data))
    except (struct.error, UnicodeDecodeError, ValueError) as error:
        raise VectorFileError(f"{path.name} is not a readable GGUF file: {error}") from None
    arch = keys.get("general.architecture")
    if arch != ARCH:
        raise VectorFileError(f"{path.name} is a GGUF file of architecture {arch!r}, not a "
                              f"control vector ({ARCH!r}).")  # fmt: skip
    directions = _tensors(path, data, tensors, start, keys)
    if model is not None:
        _check(path, directions, model)
    hint = keys.get(f"{ARCH}.model_hint")
    hint = hint if isinstance(hint, str) else ""
    meta = _provenance_read(path, keys)
    if meta:  # steerlab's own file, with what its provenance knew
        return SteeringVector(directions, 1.0, provenance_of({"model": hint} | meta))
    ours = SITES_KEY in keys
    provenance = Provenance(model=hint if ours else "",
                            method="" if ours else f"llama.cpp control vector ({hint or 'no model hint'})")  # fmt: skip
    return SteeringVector(directions, 1.0, provenance)


def _provenance_read(path: Path, keys: Mapping[str, Any]) -> dict[str, Any]:
    """The ``steerlab.<field>`` keys, parsed by the vector files' schema; refused by name
    where a value is not one steerlab writes."""
    meta: dict[str, Any] = {}
    for key, value in keys.items():
        if not key.startswith(PREFIX) or key == SITES_KEY:
            continue
        field = key[len(PREFIX) :]
        if field not in PROVENANCE_FIELDS:
            raise VectorFileError(f"{path.name} holds the key {key!r}, which steerlab does not "
                                  "write: refused rather than ignored.")  # fmt: skip
        if not isinstance(value, str):
            raise VectorFileError(f"{path.name}: {key} is {type(value).__name__}, not a string.")
        try:
            meta[field] = SCHEMA[field](value)
        except VectorFileError as error:
            raise VectorFileError(f"{path.name}: {key}: {error}") from None
    return meta


def _parse(f: BinaryIO, size: int) -> tuple[dict[str, Any], list[tuple[str, int, int, int]], int]:
    """Keys, tensor infos ``(name, elements, type, offset)`` and where the data starts."""

    def read(fmt: str) -> Any:
        n = struct.calcsize(fmt)
        chunk = f.read(n)
        if len(chunk) != n:
            raise ValueError("the file ends early")
        return struct.unpack(fmt, chunk)[0]

    def string() -> str:
        n = read("<Q")
        if n > size:
            raise ValueError(f"a string of {n} bytes in a file of {size}")
        return str(f.read(n).decode("utf-8"))

    def value(kind: int) -> Any:
        if kind in _SCALARS:
            return read(_SCALARS[kind])
        if kind == _STRING:
            return string()
        if kind == _ARRAY:
            item, n = read("<I"), read("<Q")
            if item == _ARRAY or n > _MAX_COUNT:
                raise ValueError("an array too large or nested")
            return [value(item) for _ in range(n)]
        raise ValueError(f"unknown value type {kind}")

    if f.read(4) != MAGIC:
        raise ValueError("no GGUF magic")
    version, n_tensors, n_keys = read("<I"), read("<Q"), read("<Q")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} (steerlab reads 2 and 3, little-endian)")
    if n_tensors > _MAX_COUNT or n_keys > _MAX_COUNT:
        raise ValueError(f"{n_tensors} tensors and {n_keys} keys")
    keys: dict[str, Any] = {}
    for _ in range(n_keys):
        key = string()
        if key in keys:
            raise ValueError(f"the key {key!r} twice")
        keys[key] = value(read("<I"))
    tensors = []
    for _ in range(n_tensors):
        name, dims = string(), read("<I")
        if dims > 4:
            raise ValueError(f"{name} has {dims} dimensions")
        shape = [read("<Q") for _ in range(dims)]
        tensors.append((name, math.prod(shape) if dims == 1 else -1, read("<I"), read("<Q")))
    alignment = keys.get("general.alignment", ALIGNMENT)
    if not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"general.alignment {alignment!r}")
    return keys, tensors, _padded(f.tell(), alignment)


def _tensors(path: Path, data: bytes, tensors: list[tuple[str, int, int, int]], start: int,
             keys: Mapping[str, Any]) -> dict[str, torch.Tensor]:  # fmt: skip
    """Site -> direction, each ``direction.{L}`` checked as llama.cpp's loader checks it."""
    by_layer: dict[int, torch.Tensor] = {}
    for name, n, kind, offset in tensors:
        parsed = re.fullmatch(r"direction\.([0-9]{1,9})", name)  # ASCII digits ("²" is a digit)
        if parsed is None or int(parsed.group(1)) < 1:
            raise VectorFileError(f"{path.name} holds a tensor {name!r:.80}; a control vector "
                                  "holds direction.L tensors, L >= 1 (llama.cpp refuses others).")  # fmt: skip
        if kind != _F32 or n < 1:
            raise VectorFileError(f"{path.name}: {name} is not a 1-D float32 tensor.")
        begin, end = start + offset, start + offset + 4 * n
        if end > len(data):
            raise VectorFileError(f"{path.name}: {name} runs past the end of the file.")
        layer = int(parsed.group(1))
        if layer in by_layer:
            raise VectorFileError(f"{path.name} holds {name} twice.")
        by_layer[layer] = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
    if not by_layer:
        raise VectorFileError(f"{path.name} holds no direction tensor.")
    if len({t.numel() for t in by_layer.values()}) != 1:
        raise VectorFileError(f"{path.name}: its directions have different widths.")
    sites = [site_of(layer) for layer in by_layer]
    saved = keys.get(SITES_KEY)
    if saved is not None:  # steerlab's own file: the sites it was saved from, checked
        named = saved.split(",") if isinstance(saved, str) else []
        try:
            same = len(named) == len(sites) and all(
                layer_of(s) == layer for s, layer in zip(named, by_layer)
            )
        except (ValueError, SiteError):
            same = False
        if not same:
            raise VectorFileError(f"{path.name}: {SITES_KEY} does not match its directions.")
        sites = named
    return dict(zip(sites, by_layer.values()))


def _check(path: Path, directions: Mapping[str, torch.Tensor], model: SteerableModel) -> None:
    width = next(iter(directions.values())).numel()
    if width != model.d_model:
        raise VectorFileError(f"{path.name} holds directions of width {width}; this model has "
                              f"d_model={model.d_model}.")  # fmt: skip
    for site in directions:
        if site not in model.sites():
            raise VectorFileError(
                f"{path.name} steers {site} (direction.{layer_of(site)}), which this model "
                f"lacks: it has {model.n_layers} layers, so llama.cpp steers direction.1 to "
                f"direction.{model.n_layers - 1}."
            )
