"""Vector files: bit-identical round trips, model checks, and nothing that can run code."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import steerlab as sl
from steerlab.testing import char_tokenizer, tiny_model
from steerlab.vectors import SteeringVector, VectorFileError, extract
from steerlab.vectors.io import _metadata

SITES = ["blocks.0.hook_resid_post", "blocks.2.hook_resid_pre"]


@pytest.fixture(scope="module")
def hf_lm(tiny_dirs) -> sl.SteerableModel:
    """The tiny GPT-2 on the plain HF backend, loaded once for this module."""
    return sl.load(tiny_dirs["gpt2"], backend="hf")


@pytest.fixture(scope="module")
def vec(hf_lm) -> SteeringVector:
    return extract(hf_lm, ["good day", "joy"], ["bad day", "pain"], SITES, progress=False) * 2.5


def _file_metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), "pt") as f:
        return f.metadata()


def test_round_trip_is_bit_identical(vec, tmp_path, hf_lm):
    path = vec.save(tmp_path / "happy.safetensors")
    back = SteeringVector.load(path, model=hf_lm)
    assert back.sites == vec.sites
    for site in SITES:
        assert back.directions[site].dtype == vec.directions[site].dtype
        assert torch.equal(back.directions[site], vec.directions[site])
    assert back.scale == vec.scale
    assert back.provenance == vec.provenance
    again = back.save(tmp_path / "again.safetensors")
    assert _file_metadata(again) == _file_metadata(path)
    assert again.read_bytes() == path.read_bytes()


def test_header_carries_the_provenance(vec, tmp_path):
    meta = _file_metadata(vec.save(tmp_path / "v.safetensors"))
    assert meta["d_model"] == "64"
    assert json.loads(meta["sites"]) == SITES
    assert meta["method"] == "mean_diff" and meta["backend"] == "hf"
    assert meta["data_sha256"] == vec.provenance.data_sha256 and len(meta["data_sha256"]) == 64
    assert json.loads(meta["norms"]) == pytest.approx(vec.norms())
    assert json.loads(meta["residual_norms"]) == pytest.approx(dict(vec.provenance.residual_norms))
    assert meta["steerlab_version"] == sl.__version__


def test_loads_on_every_backend(vec, tmp_path, lm):
    back = SteeringVector.load(vec.save(tmp_path / "v.safetensors"), model=lm)
    out = lm.generate("Hi", steer=back, max_new_tokens=4, stop_at_eos=False)
    assert out.alphas == [(2.5, 2.5)]


def test_another_d_model_fails_clearly(vec, tmp_path):
    small = sl.wrap(tiny_model("gpt2", d_model=32, n_layers=3), char_tokenizer())
    with pytest.raises(VectorFileError, match="d_model=64.*d_model=32"):
        SteeringVector.load(vec.save(tmp_path / "v.safetensors"), model=small)


def test_unknown_site_fails_clearly(tmp_path, hf_lm):
    far = SteeringVector({"blocks.7.hook_resid_pre": torch.ones(64)})
    with pytest.raises(
        VectorFileError, match="lacks: Layer 7 is out of range in .blocks.7.hook_resid_pre"
    ):
        SteeringVector.load(far.save(tmp_path / "far.safetensors"), model=hf_lm)


class _Payload:
    """Unpickling this touches a file: proof that a loader unpickled."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self):
        return (Path.touch, (self.sentinel,))


@pytest.mark.parametrize("name", ["evil.pt", "evil.pkl", "evil.safetensors", "evil.bin"])
def test_pickles_are_refused_unopened(tmp_path, name):
    sentinel = tmp_path / "unpickled"
    path = tmp_path / name
    if name == "evil.pt":
        torch.save({"x": _Payload(sentinel)}, path)  # a zip with a pickle inside
    else:
        path.write_bytes(pickle.dumps(_Payload(sentinel), protocol=4))
    with pytest.raises(VectorFileError, match="pickle"):
        SteeringVector.load(path)
    assert not sentinel.exists()


def _write_raw(path: Path, metadata: object, tensors: dict | None = None) -> Path:
    data = torch.ones(64).numpy().tobytes()
    header = tensors or {"blocks.0.hook_resid_post": {"dtype": "F32", "shape": [64], "data_offsets": [0, len(data)]}}  # fmt: skip
    blob = json.dumps({"__metadata__": metadata, **header}).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return path


@pytest.mark.parametrize(
    "tamper",
    [
        {"model": "__import__('os').system('touch x')"},
        {"method": "!!python/object/apply:os.system ['ls']"},
        {"model": "lambda: 1"},
        {"__reduce__": "os.system"},
        {"extra": "hello"},
        {"sites": '["blocks.0.hook_resid_post", {"__class__": "x"}]'},
        {"norms": '{"blocks.0.hook_resid_post": "1e3; import os"}'},
        {"scale": "float('inf')"},
        {"d_model": "64.0"},
    ],
)
def test_code_like_metadata_is_refused(tmp_path, tamper):
    v = SteeringVector({"blocks.0.hook_resid_post": torch.ones(64)})
    meta = _metadata(v) | tamper
    path = tmp_path / "v.safetensors"
    save_file({"blocks.0.hook_resid_post": torch.ones(64)}, str(path), metadata=meta)
    with pytest.raises(VectorFileError):
        SteeringVector.load(path)


@pytest.mark.parametrize(
    "metadata",
    [{"model": {"__reduce__": "os.system"}}, {"model": 1}, ["not", "a", "dict"], None],
)
def test_non_string_metadata_is_refused(tmp_path, metadata):
    with pytest.raises(VectorFileError, match="metadata"):
        SteeringVector.load(_write_raw(tmp_path / "raw.safetensors", metadata))


def test_tensors_must_match_the_declared_sites(tmp_path):
    v = SteeringVector({"blocks.0.hook_resid_post": torch.ones(64)})
    path = tmp_path / "v.safetensors"
    save_file({"blocks.1.hook_resid_post": torch.ones(64)}, str(path), metadata=_metadata(v))
    with pytest.raises(VectorFileError, match="do not match"):
        SteeringVector.load(path)
    save_file({"blocks.0.hook_resid_post": torch.ones(32)}, str(path), metadata=_metadata(v))
    with pytest.raises(VectorFileError, match="shape"):
        SteeringVector.load(path)


def test_save_wants_the_safetensors_suffix(vec, tmp_path):
    with pytest.raises(ValueError, match="safetensors"):
        vec.save(tmp_path / "v.pt")


def test_a_combined_vector_round_trips_its_metadata(vec, tmp_path, hf_lm):
    other = extract(hf_lm, ["sun", "calm"], ["rain", "storm"], SITES, method=sl.pca_diff,
                    progress=False)  # fmt: skip
    combined = vec + other
    assert "+" in combined.provenance.method and "(" in combined.provenance.method
    back = SteeringVector.load(combined.save(tmp_path / "sum.safetensors"), model=hf_lm)
    assert back.provenance == combined.provenance
    assert all(torch.equal(back.directions[s], combined.directions[s]) for s in SITES)


def test_the_model_revision_is_recorded(tmp_path, hf_lm, monkeypatch):
    monkeypatch.setattr(hf_lm, "revision", "v1.2-main")
    vector = extract(hf_lm, ["good"], ["bad"], SITES[:1], progress=False)
    back = SteeringVector.load(vector.save(tmp_path / "r.safetensors"), model=hf_lm)
    assert back.provenance.revision == "v1.2-main" == vector.provenance.revision
