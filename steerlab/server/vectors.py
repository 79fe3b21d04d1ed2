"""The vectors a server holds by name, uploaded as safetensors bytes and checked on arrival.

An upload is checked exactly as ``SteeringVector.load`` checks a file (it goes through
``steerlab.vectors.io.load``, with the served model); bytes that start like a pickle or a
``torch.save`` archive are refused before anything reads them as a file.
"""

from __future__ import annotations

import re
import tempfile
import threading
from pathlib import Path

import torch

from steerlab.model import SteerableModel
from steerlab.server.errors import ApiError
from steerlab.vectors import io
from steerlab.vectors.vector import SteeringVector

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def looks_pickled(data: bytes) -> bool:
    """Pickle protocol 2-5 opcodes, or a zip archive (``torch.save``)."""
    return data.startswith(b"PK\x03\x04") or (
        data[:1] == b"\x80" and data[1:2] in b"\x02\x03\x04\x05"
    )


class VectorStore:
    """Named steering vectors for one model, safe to share between request threads."""

    def __init__(self, lm: SteerableModel) -> None:
        self.lm = lm
        self._vectors: dict[str, SteeringVector] = {}
        self._lock = threading.Lock()

    def add(self, name: str, data: bytes) -> SteeringVector:
        """Check ``data`` (safetensors bytes) against the model and keep it as ``name``."""
        if not _NAME.match(name):
            raise ApiError(400, "A vector name is 1-64 letters, digits, '_', '.' or '-'.", "name")
        if looks_pickled(data[:8]):
            raise ApiError(400, "Refusing the upload: it is a pickle / torch.save file, which can "
                                "run code. Upload a steerlab .safetensors vector.", "file")  # fmt: skip
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "upload.safetensors"
            path.write_bytes(data)
            try:
                vector = io.load(path, model=self.lm)
            except (io.VectorFileError, ValueError) as error:
                raise ApiError(400, str(error), "file") from None
        with self._lock:
            self._vectors[name] = vector
        return vector

    def remove(self, name: str) -> None:
        with self._lock:
            if self._vectors.pop(name, None) is None:
                raise ApiError(404, f"No vector named {name!r}.", "name")

    def listing(self) -> list[dict[str, object]]:
        with self._lock:
            items = sorted(self._vectors.items())
        return [{"id": name, "object": "vector", "sites": v.sites, "d_model": v.d_model,
                 "scale": v.scale, "method": v.provenance.method} for name, v in items]  # fmt: skip

    def directions(self, name: str, site: str | None,
                   param: str) -> list[tuple[str, float, torch.Tensor]]:  # fmt: skip
        """``(site, scale, direction)`` to steer with: at ``site``, or every site when None.

        A vector with one site lends its direction to any site (as the panel does).
        """
        with self._lock:
            vector = self._vectors.get(name)
        if vector is None:
            known = ", ".join(sorted(self._vectors)) or "none yet"
            raise ApiError(400, f"No vector named {name!r} (known: {known}).", param)
        if site is None:
            return [(s, vector.scale, d) for s, d in vector.directions.items()]
        if site in vector.directions:
            return [(site, vector.scale, vector.directions[site])]
        if len(vector.sites) == 1:
            return [(site, vector.scale, vector.directions[vector.sites[0]])]
        raise ApiError(400, f"Vector {name!r} has no direction at {site}; it has {vector.sites}.",
                       param)  # fmt: skip
