"""Named vectors on the server are never silently replaced: fingerprints, 409 on other
content, replace=true, pinning, and a bounded store (issue 21, section 2)."""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

import httpx
import pytest
import torch
from server_helpers import HEADERS, KEY, post, served

import steerlab as sl
from steerlab.client import ServerError
from steerlab.server import Limits

SITE = "blocks.2.hook_resid_pre"


@pytest.fixture(scope="module")
def tiny():
    return sl.load("steerlab-tiny", backend="hf")


def vector(seed: int) -> sl.SteeringVector:
    return sl.SteeringVector(
        {SITE: torch.randn(128, generator=torch.Generator().manual_seed(seed))}
    )


def upload(url: str, name: str, data: bytes, replace: bool = False) -> httpx.Response:
    params = {"name": name, "replace": "true" if replace else "false"}
    return httpx.post(url + "/v1/vectors", params=params, content=data, headers=HEADERS,
                      timeout=60)  # fmt: skip


def file_bytes(tmp_path: Path, vec: sl.SteeringVector, name: str = "v") -> bytes:
    return vec.save(tmp_path / f"{name}.safetensors").read_bytes()


def test_the_fingerprint_is_the_sha256_of_scale_and_directions():
    vec = vector(0)
    data = vec.directions[SITE].contiguous().view(torch.uint8).numpy().tobytes()
    want = hashlib.sha256(
        b"scale:1.0" + f"|{SITE}:torch.float32:(128,):".encode() + data
    ).hexdigest()
    assert vec.sha256 == want
    assert (2 * vec).sha256 != vec.sha256  # the scale steers, so it counts


def test_upload_says_what_it_stored_and_re_uploading_is_idempotent(tiny, tmp_path):
    vec = vector(1)
    with served(tiny) as url:
        first = upload(url, "happy", file_bytes(tmp_path, vec))
        again = upload(url, "happy", file_bytes(tmp_path, vec))
        listing = httpx.get(url + "/v1/vectors", headers=HEADERS).json()["data"]
    assert first.status_code == again.status_code == 200
    assert first.json()["sha256"] == again.json()["sha256"] == vec.sha256
    assert [(v["id"], v["sha256"]) for v in listing] == [("happy", vec.sha256)]


def test_other_content_under_a_held_name_is_a_409_unless_replaced(tiny, tmp_path, caplog):
    a, b = vector(1), vector(2)
    prompt = {"model": "steerlab-tiny", "prompt": "Once upon a time", "max_tokens": 6,
              "temperature": 0, "steering": [{"vector": "happy", "alpha": 4.0}]}  # fmt: skip
    with served(tiny) as url:
        assert upload(url, "happy", file_bytes(tmp_path, a, "a")).status_code == 200
        before = post(url, "/v1/completions", prompt).json()["choices"][0]["text"]
        clash = upload(url, "happy", file_bytes(tmp_path, b, "b"))
        assert clash.status_code == 409, clash.text
        assert "'happy'" in clash.json()["error"]["message"]
        assert post(url, "/v1/completions", prompt).json()["choices"][0]["text"] == before
        with caplog.at_level(logging.WARNING, logger="steerlab.server"):
            replaced = upload(url, "happy", file_bytes(tmp_path, b, "b"), replace=True)
        assert replaced.status_code == 200 and replaced.json()["sha256"] == b.sha256
        assert any("replaced" in r.message and a.sha256 in r.message for r in caplog.records)


def test_a_pinned_fingerprint_that_differs_is_a_409_before_any_compute(tiny, tmp_path):
    a, b = vector(1), vector(2)
    with served(tiny) as url:
        remote = sl.connect(url, api_key=KEY)
        pin = remote.upload_vector("calm", a)
        assert pin == a.sha256 == remote.pins["calm"]
        body = {"model": "steerlab-tiny", "prompt": "Hi", "max_tokens": 4,
                "steering": [{"vector": "calm", "alpha": 2.0, "sha256": pin}]}  # fmt: skip
        assert post(url, "/v1/completions", body).status_code == 200
        with pytest.raises(ServerError, match="409"):
            remote.upload_vector("calm", b)
        remote.upload_vector("calm", b, replace=True)
        stale = post(url, "/v1/completions", body)
        assert stale.status_code == 409, stale.text
        assert "pinned" in stale.json()["error"]["message"]
        assert remote.hook_count() == 0


def test_concurrent_uploads_of_one_name_store_one_vector_and_refuse_the_rest(tiny, tmp_path):
    blobs = [file_bytes(tmp_path, vector(10 + i), f"c{i}") for i in range(6)]
    with served(tiny) as url:
        codes: list[int] = []
        threads = [threading.Thread(target=lambda d=d: codes.append(upload(url, "x", d).status_code))
                   for d in blobs]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        listing = httpx.get(url + "/v1/vectors", headers=HEADERS).json()["data"]
    assert sorted(codes) == [200] + [409] * 5
    assert len(listing) == 1
    assert listing[0]["sha256"] in {vector(10 + i).sha256 for i in range(6)}


def test_the_store_is_bounded_and_a_refused_upload_changes_nothing(tiny, tmp_path):
    limits = Limits(max_vectors=2, max_vector_bytes=3 * 128 * 4)
    with served(tiny, limits=limits) as url:
        assert upload(url, "a", file_bytes(tmp_path, vector(1), "a")).status_code == 200
        assert upload(url, "b", file_bytes(tmp_path, vector(2), "b")).status_code == 200
        third = upload(url, "c", file_bytes(tmp_path, vector(3), "c"))
        assert third.status_code == 413 and "--max-vectors 2" in third.json()["error"]["message"]
        # replacing a held name does not count as one more
        assert (
            upload(url, "b", file_bytes(tmp_path, vector(4), "d"), replace=True).status_code == 200
        )
        held = [v["id"] for v in httpx.get(url + "/v1/vectors", headers=HEADERS).json()["data"]]
        assert held == ["a", "b"]
    small = Limits(max_vector_bytes=128 * 4 + 10)
    two = sl.SteeringVector({SITE: torch.ones(128), "blocks.1.hook_resid_pre": torch.ones(128)})
    with served(tiny, limits=small) as url:
        big = upload(url, "two", file_bytes(tmp_path, two, "two"))
        assert big.status_code == 413 and "--max-vector-mb" in big.json()["error"]["message"]
        assert httpx.get(url + "/v1/vectors", headers=HEADERS).json()["data"] == []
