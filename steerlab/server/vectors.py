"""The vectors a server holds by name, uploaded as safetensors bytes and checked on arrival.

An upload is checked exactly as ``SteeringVector.load`` checks a file (it goes through
``steerlab.vectors.io.load``, with the served model), or, when its header says it is a
LoReFT (``.reft.safetensors``), as ``sl.LoReFT.load`` checks one; bytes that start like a
pickle or a ``torch.save`` archive are refused before anything reads them as a file.

A name is never silently given another vector: each vector is known by its content
fingerprint (``SteeringVector.sha256``). Uploading the same content under a name again is a
no-op; different content under a held name is a 409 unless the upload says
``replace=true`` (and a replacement is logged). A steering entry may pin the fingerprint it
expects. The store is bounded (``max_vectors``, ``max_bytes``); an upload past a bound is a
413 and leaves the store as it was.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
import threading
from pathlib import Path

from steerlab.core.ops import SteerError
from steerlab.core.reft import LoReFT
from steerlab.model import SteerableModel
from steerlab.server.errors import ApiError
from steerlab.vectors import io
from steerlab.vectors.vector import SteeringVector

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
log = logging.getLogger("steerlab.server")
Held = SteeringVector | LoReFT  # a LoReFT is held by name too, and steers at its own site


def describe(name: str, vector: Held) -> dict[str, object]:
    """A held vector as the API shows it (upload response and listing)."""
    if isinstance(vector, LoReFT):
        return {"id": name, "object": "vector", "sha256": vector.sha256, "sites": [vector.site],
                "d_model": vector.d_model, "scale": vector.scale, "method": _method(vector),
                "op": "loreft", "rank": vector.rank, "positions": vector.positions}  # fmt: skip
    return {"id": name, "object": "vector", "sha256": vector.sha256, "sites": vector.sites,
            "d_model": vector.d_model, "scale": vector.scale,
            "method": vector.provenance.method}  # fmt: skip


def _method(reft: LoReFT) -> str:
    try:
        method = json.loads(reft.provenance or "{}").get("method")
    except (ValueError, AttributeError):
        method = None
    return str(method or "loreft")


def _nbytes(vector: Held) -> int:
    tensors = vector.directions if isinstance(vector, SteeringVector) else vector.tensors()
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _read(path: Path, lm: SteerableModel) -> Held:
    """The vector or LoReFT in an uploaded file, checked against ``lm``."""
    try:
        if LoReFT.is_file(path):
            return LoReFT.load(path, model=lm)
        return io.load(path, model=lm)
    except (io.VectorFileError, SteerError, ValueError) as error:
        raise ApiError(400, str(error), "file") from None


class VectorStore:
    """Named steering vectors for one model, safe to share between request threads."""

    def __init__(self, lm: SteerableModel, *, max_vectors: int = 256,
                 max_bytes: int = 1024 << 20) -> None:  # fmt: skip
        self.lm = lm
        self.max_vectors, self.max_bytes = max_vectors, max_bytes
        self._vectors: dict[str, Held] = {}
        self._lock = threading.Lock()

    def add(self, name: str, data: bytes, *, replace: bool = False) -> Held:
        """Check ``data`` (safetensors bytes: a vector or a LoReFT) against the model and
        keep it as ``name``.

        Raises:
            ApiError: 400 for a bad name or file; 409 when ``name`` holds a vector with other
                content and ``replace`` is off; 413 past ``max_vectors`` or ``max_bytes``.
        """
        if not _NAME.match(name):
            raise ApiError(400, "A vector name is 1-64 letters, digits, '_', '.' or '-'.", "name")
        if io.looks_pickled(data[:8]):
            raise ApiError(400, "Refusing the upload: it is a pickle / torch.save file, which can "
                                "run code. Upload a steerlab .safetensors vector.", "file")  # fmt: skip
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "upload.safetensors"
            path.write_bytes(data)
            vector = _read(path, self.lm)
        with self._lock:  # the checks and the insert as one step: concurrent uploads serialise
            held = self._vectors.get(name)
            if held is not None and held.sha256 == vector.sha256:
                return held  # the same content again: nothing changes
            if held is not None and not replace:
                raise ApiError(
                    409, f"Vector {name!r} already holds other content (sha256 "
                    f"{held.sha256[:16]}…, this upload {vector.sha256[:16]}…); upload with "
                    "replace=true to replace it.", "name",
                )  # fmt: skip
            others = {n: v for n, v in self._vectors.items() if n != name}
            if len(others) + 1 > self.max_vectors:
                raise ApiError(413, f"The store holds {len(others)} vectors, its limit "
                                    f"(--max-vectors {self.max_vectors}).", "name")  # fmt: skip
            size = sum(_nbytes(v) for v in others.values()) + _nbytes(vector)
            if size > self.max_bytes:
                raise ApiError(
                    413, f"Storing {name!r} would hold {size / (1 << 20):.1f} MiB of vectors, past "
                    f"the limit (--max-vector-mb {self.max_bytes / (1 << 20):g}).", "file",
                )  # fmt: skip
            if held is not None:
                log.warning("vector %r replaced: sha256 %s -> %s", name, held.sha256, vector.sha256)
            self._vectors[name] = vector
        return vector

    def remove(self, name: str) -> None:
        with self._lock:
            if self._vectors.pop(name, None) is None:
                raise ApiError(404, f"No vector named {name!r}.", "name")

    def listing(self) -> list[dict[str, object]]:
        with self._lock:
            items = sorted(self._vectors.items())
        return [describe(name, v) for name, v in items]

    def vector(self, name: str, param: str, sha256: str | None = None) -> SteeringVector:
        """The vector held as ``name`` (a LoReFT is refused: it has no direction to read
        or condition on); ``held`` gives either."""
        vector = self.held(name, param, sha256)
        if isinstance(vector, LoReFT):
            raise ApiError(400, f"{name!r} is a LoReFT: it steers (name it in steering), but "
                                "it has no direction to read or condition on.", param)  # fmt: skip
        return vector

    def held(self, name: str, param: str, sha256: str | None = None) -> Held:
        """The vector or LoReFT held as ``name``; with ``sha256``, it must have that
        fingerprint (409 otherwise). Which sites a vector steers is
        ``core.steer.steers_at``'s rule; a LoReFT steers at its own."""
        with self._lock:
            vector = self._vectors.get(name)
        if vector is None:
            known = ", ".join(sorted(self._vectors)) or "none yet"
            raise ApiError(400, f"No vector named {name!r} (known: {known}).", param)
        if sha256 is not None and sha256.lower() != vector.sha256:  # its form: schemas.Sha256
            raise ApiError(409, f"Vector {name!r} has sha256 {vector.sha256}, not the pinned "
                                f"{sha256}: it was replaced since you uploaded it.", param)  # fmt: skip
        return vector
