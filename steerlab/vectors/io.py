"""Steering-vector files: safetensors tensors plus an allow-listed metadata header.

Loading never unpickles: pickle and ``torch.save`` files are refused by suffix and by
magic bytes, and the safetensors header is parsed and checked against a schema (known
keys, plain values, canonical site names) before any tensor is read.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from steerlab.core import atomic, jsontext
from steerlab.core.errors import ModelMismatchWarning
from steerlab.core.identity import ModelId, is_config_sha256
from steerlab.core.sites import Site, SiteError, resolve
from steerlab.core.steer import warn_made_elsewhere
from steerlab.vectors.vector import Provenance, SteeringVector

if TYPE_CHECKING:
    from steerlab.model import SteerableModel

FORMAT = "steerlab.steering_vector"
FORMAT_VERSION = "1"
_PICKLE_SUFFIXES = {".pt", ".pth", ".pkl", ".pickle", ".bin", ".ckpt", ".joblib"}
_MAX_HEADER = 1 << 24
_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
# Backend kinds a vector can be read from. "amplified" is ``sl.amplify``'s pair of models: its
# activations are the ``after`` model's, and ``model`` names both ("a amplified vs b").
BACKEND_KINDS = ("bridge", "hooked", "hf", "amplified", "")
# Free text (model names, paths, versions, method names like "(mean_diff + probe)"): printable,
# no quoting or code punctuation. Metadata is never executed; this keeps it boring to read.
_TEXT = re.compile(r"^[A-Za-z0-9 _./:@+\-()?,]{0,300}$")
_CODE_LIKE = re.compile(r"__|!!|\blambda\b|\bimport\b|\beval\b|\bexec\b|\bos\.|\bsystem\b", re.I)


class VectorFileError(ValueError):
    """A steering-vector file that is unsafe, malformed, or made for another model."""


def _text(value: str) -> str:
    if not _TEXT.match(value) or _CODE_LIKE.search(value):
        raise VectorFileError(f"Refusing metadata value {value[:60]!r}: not plain text.")
    return value


def plain_text(value: str) -> str:
    """``value`` with anything the metadata schema refuses replaced, so it can be saved.

    Names made by steerlab (sites, methods, sums of methods, local paths) pass unchanged.
    """
    value = re.sub(r"[^A-Za-z0-9 _./:@+\-()?,]", "-", value)[:300]
    return _CODE_LIKE.sub("-", value)


def _int(value: str) -> int:
    if not re.fullmatch(r"\d{1,9}", value):
        raise VectorFileError(f"Expected a non-negative integer, got {value[:60]!r}.")
    return int(value)


def _float(value: str) -> float:
    if not re.fullmatch(r"-?\d+(\.\d+)?([eE][-+]?\d+)?", value):
        raise VectorFileError(f"Expected a number, got {value[:60]!r}.")
    return float(value)


def _bool(value: str) -> bool:
    if value not in ("true", "false"):
        raise VectorFileError(f"Expected true or false, got {value[:60]!r}.")
    return value == "true"


def _sha(value: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}|", value):
        raise VectorFileError(f"Expected a sha256 hex digest, got {value[:60]!r}.")
    return value


def _short_sha(value: str) -> str:
    if not value or not is_config_sha256(value):  # written only when known
        raise VectorFileError(f"Expected 16 hex digits of a sha256, got {value[:60]!r}.")
    return value


def _site(value: Any) -> str:
    if not isinstance(value, str):
        raise VectorFileError(f"Expected a site name, got {type(value).__name__}.")
    try:
        return Site.parse(value).name
    except SiteError as error:
        raise VectorFileError(f"Refusing metadata: {error}") from None


def _sites(value: str) -> list[str]:
    parsed = _json(value)
    if not isinstance(parsed, list) or not parsed:
        raise VectorFileError("Metadata 'sites' must be a non-empty JSON list of site names.")
    return [_site(s) for s in parsed]


def _norms(value: str) -> dict[str, float]:
    parsed = _json(value)
    if not isinstance(parsed, dict):
        raise VectorFileError("Metadata norms must be a JSON object of site -> number.")
    out = {}
    for key, number in parsed.items():
        if type(number) not in (int, float) or not math.isfinite(number):
            raise VectorFileError(f"Norm for {key!r} must be a finite number.")
        out[_site(key)] = float(number)
    return out


def _json(value: str) -> Any:
    try:
        return jsontext.loads(value)
    except json.JSONDecodeError:
        raise VectorFileError(f"Metadata value is not valid JSON: {value[:60]!r}.") from None
    except jsontext.NestingError as error:
        raise VectorFileError(f"Refusing a metadata value: its {error}.") from None


# The allow-list: every metadata key a vector file may carry, and its parser.
SCHEMA: dict[str, Callable[[str], Any]] = {
    "format": lambda v: v if v == FORMAT else _fail(f"not a steerlab vector file ({v[:40]!r})"),
    "format_version": lambda v: v if v == FORMAT_VERSION else _fail(f"format version {v!r}"),
    "model": _text,
    "revision": _text,
    "backend": lambda v: v if v in BACKEND_KINDS else _fail(f"backend {v!r}"),
    "d_model": _int,
    "sites": _sites,
    "method": _text,
    "data_sha256": _sha,
    "token": lambda v: v if v in ("last", "mean", "") else _fail(f"token {v!r}"),
    "chat": _bool,
    "n_positive": _int,
    "n_negative": _int,
    "scale": _float,
    "norms": _norms,
    "residual_norms": _norms,
    "steerlab_version": _text,
    "model_config_sha256": _short_sha,
    "training": lambda v: json.dumps(_training(v)),
}
# Keys a file may lack: files written before they existed still load.
OPTIONAL = frozenset({"model_config_sha256", "training"})


def _training(value: str) -> dict[str, Any]:
    """A trained vector's settings and last loss: a flat JSON object of numbers and text."""
    parsed = _json(value)
    if not isinstance(parsed, dict) or not all(
        isinstance(v, (int, float, str, bool)) or v is None for v in parsed.values()
    ):
        raise VectorFileError("Metadata 'training' must be a flat JSON object.")
    return parsed


def _fail(message: str) -> Any:
    raise VectorFileError(f"Refusing metadata: {message}.")


def _metadata(vector: SteeringVector) -> dict[str, str]:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "d_model": str(vector.d_model),
        "sites": json.dumps(vector.sites),
        "scale": repr(vector.scale),
        "norms": json.dumps(vector.norms()),
    } | provenance_metadata(vector.provenance)


def provenance_metadata(p: Provenance) -> dict[str, str]:
    """A vector's provenance as metadata strings, each one ``SCHEMA`` reads back: the part
    of a vector file's metadata that every file format steerlab writes carries (the
    ``.gguf`` writer too, under its own keys)."""
    return (
        {
            "model": plain_text(p.model),
            "revision": plain_text(p.revision),
            "backend": p.backend,
            "method": plain_text(p.method),
            "data_sha256": p.data_sha256,
            "token": p.token,
            "chat": "true" if p.chat else "false",
            "n_positive": str(p.n_positive),
            "n_negative": str(p.n_negative),
            "residual_norms": json.dumps(dict(p.residual_norms)),
            "steerlab_version": p.steerlab_version,
        }
        | ({"model_config_sha256": p.model_config_sha256} if p.model_config_sha256 else {})
        | ({"training": p.training} if p.training else {})
    )


def provenance_of(meta: dict[str, Any]) -> Provenance:
    """The ``Provenance`` in parsed metadata (``SCHEMA``'s values); missing keys default."""
    fields = {k: meta[k] for k in asdict(Provenance()) if k in meta and k != "residual_norms"}
    return Provenance(**fields, residual_norms=meta.get("residual_norms", {}))


def save(vector: SteeringVector, path: str | Path) -> Path:
    """Write ``vector`` to a ``.safetensors`` file (one tensor per site).

    The header is written with sorted keys, so the same vector always gives the same
    bytes (``safetensors.save_file`` orders metadata arbitrarily).

    >>> vec = sl.SteeringVector({"blocks.2.hook_resid_pre": torch.ones(lm.d_model)})
    >>> save(vec, "ones.safetensors")
    PosixPath('ones.safetensors')
    """
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"Steering vectors are saved as .safetensors (or .gguf, llama.cpp's "
                         f"control vectors); got {path.name!r}.")  # fmt: skip
    metadata = _metadata(vector)
    for key, value in metadata.items():
        SCHEMA[key](value)  # never write a file that load would refuse
    header: dict[str, Any] = {"__metadata__": metadata}
    blobs, offset = [], 0
    for site, direction in vector.directions.items():
        tensor = direction.detach().cpu().contiguous()
        blob = tensor.view(torch.uint8).numpy().tobytes()
        dtype = next(name for name, dt in _DTYPES.items() if dt == tensor.dtype)
        header[site] = {"dtype": dtype, "shape": [tensor.shape[0]], "data_offsets": [offset, offset + len(blob)]}  # fmt: skip
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors aligns the data to 8 bytes
    atomic.write_file(path, struct.pack("<Q", len(text)) + text + b"".join(blobs))
    return path


def looks_pickled(head: bytes) -> bool:
    """Pickle protocol 2-5 opcodes, or a zip archive (``torch.save``): files that can run code.

    >>> looks_pickled(b"\\x80\\x04K\\x01."), looks_pickled(b"{}")
    (True, False)
    """
    return head.startswith(b"PK\x03\x04") or (
        head[:1] == b"\x80" and head[1:2] in b"\x02\x03\x04\x05"
    )


def read_header(path: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The tensor entries and ``__metadata__`` of a safetensors file, parsed by hand.

    Pickle-capable files (``.pt``, ``.pkl`` ...) are refused by suffix before they are
    opened; anything else must have a well-formed safetensors header.
    """
    if path.suffix.lower() in _PICKLE_SUFFIXES:
        raise VectorFileError(
            f"Refusing {path.name}: {path.suffix} files may hold pickles, which can run code. "
            "steerlab reads steering vectors from .safetensors only."
        )
    if not path.exists():
        raise VectorFileError(f"No vector file at {path.resolve()}.")
    if not path.is_file():  # a FIFO or device would block the read below
        raise VectorFileError(f"Refusing {path.resolve()}: it is not a regular file.")
    with path.open("rb") as f:
        head = f.read(8)
        size = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        body = f.read(size) if 0 < size <= min(_MAX_HEADER, path.stat().st_size - 8) else b""
    if not body.startswith(b"{"):
        kind = "a pickle / torch.save file" if looks_pickled(head) else "not a safetensors file"
        raise VectorFileError(f"Refusing {path.name}: it is {kind}.")
    try:
        header = jsontext.loads(body, object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise VectorFileError(f"{path.name} has a header that is not JSON.") from None
    except jsontext.NestingError as error:
        raise VectorFileError(f"Refusing {path.name}: its header's {error}.") from None
    except _DuplicateKey as duplicate:
        raise VectorFileError(
            f"{path.name} names {duplicate.args[0]!r} twice in its header: which one is meant "
            "is ambiguous, so the file is refused."
        ) from None
    if not isinstance(header, dict):
        raise VectorFileError(f"{path.name} has a malformed safetensors header.")
    metadata = header.pop("__metadata__", None)
    if not isinstance(metadata, dict):
        raise VectorFileError(f"{path.name} carries no metadata (__metadata__).")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise VectorFileError(
                f"{path.name}: metadata {key!r} is {type(value).__name__}, not a string "
                "(safetensors metadata is flat string-to-string; nested values are refused)."
            )
    data_bytes = path.stat().st_size - 8 - size
    for name, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1]):  # fmt: skip
            raise VectorFileError(f"{path.name}: tensor {name!r} has no valid data_offsets.")
        if offsets[1] > data_bytes:
            raise VectorFileError(
                f"{path.name} is truncated: tensor {name!r} needs bytes up to {offsets[1]} of "
                f"its data, but the file holds {data_bytes}."
            )
    return header, metadata


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all distinct (json keeps the last of a duplicate)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _checked(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    entries, raw = read_header(path)
    unknown = sorted(set(raw) - set(SCHEMA))
    if unknown:
        raise VectorFileError(f"Refusing {path.name}: unexpected metadata keys {unknown[:5]}.")
    missing = sorted(set(SCHEMA) - set(raw) - OPTIONAL)
    if missing:
        raise VectorFileError(f"{path.name} lacks metadata keys {missing}.")
    meta = {key: _parsed(path, key, value) for key, value in raw.items()}
    if meta["d_model"] < 1:
        raise VectorFileError(f"{path.name} says d_model={meta['d_model']}: it holds no vector.")
    if sorted(entries) != sorted(meta["sites"]):
        raise VectorFileError(f"{path.name}: tensor names do not match the 'sites' metadata.")
    for name, entry in entries.items():
        if not isinstance(entry, dict) or entry.get("dtype") not in _DTYPES:
            raise VectorFileError(f"{path.name}: tensor {name!r} is not a float tensor.")
        if entry.get("shape") != [meta["d_model"]]:
            raise VectorFileError(
                f"{path.name}: tensor {name!r} has shape {entry.get('shape')}, "
                f"but the file says d_model={meta['d_model']}."
            )
    return entries, meta


def _parsed(path: Path, key: str, value: str) -> Any:
    try:
        return SCHEMA[key](value)
    except VectorFileError as error:
        raise VectorFileError(f"{path.name}: metadata {key!r}: {error}") from None


class VectorMismatchWarning(ModelMismatchWarning):
    """A vector file made for another model of the same width."""


def _check_model(path: Path, meta: dict[str, Any], model: SteerableModel) -> None:
    if meta["d_model"] != model.d_model:
        raise VectorFileError(
            f"{path.name} was made for d_model={meta['d_model']} (model {meta['model']!r}); "
            f"this model has d_model={model.d_model}."
        )
    for site in meta["sites"]:
        try:
            resolve(site, model.sites())
        except SiteError as error:
            raise VectorFileError(f"{path.name} steers a site this model lacks: {error}") from None
    made_for = ModelId(meta["model"], meta.get("model_config_sha256", ""))
    warn_made_elsewhere(made_for, model, path.name, verb="extracted",
                        category=VectorMismatchWarning)  # fmt: skip


def load(path: str | Path, model: SteerableModel | None = None) -> SteeringVector:
    """Read a vector written by ``save``; with ``model``, check it fits that model.

    Raises:
        VectorFileError: a pickle, code-like or unknown metadata, or a model mismatch.

    >>> vec = sl.SteeringVector({"blocks.2.hook_resid_pre": torch.ones(lm.d_model)})
    >>> _ = save(vec, "ones.safetensors")
    >>> site = "blocks.2.hook_resid_pre"
    >>> torch.equal(load("ones.safetensors", model=lm).directions[site], vec.directions[site])
    True
    """
    from safetensors.torch import load_file

    path = Path(path)
    _, meta = _checked(path)
    if model is not None:
        _check_model(path, meta, model)
    try:
        tensors = load_file(str(path))
    except Exception as error:  # safetensors' own errors, for anything the header check missed
        raise VectorFileError(f"{path.name} could not be read as safetensors: {error}") from None
    return SteeringVector(tensors, meta["scale"], provenance_of(meta))
