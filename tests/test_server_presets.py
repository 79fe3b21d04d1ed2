"""Steering presets (issue 21): ``--preset NAME=VECTOR_FILE@ALPHA`` serves the model steered
by a vector as a model of its own name, scored against plain transformers with a torch hook."""

from __future__ import annotations

import time

import httpx
import pytest
import torch
from reference import RefSteer, logprobs
from server_helpers import HEADERS, post, served

import steerlab as sl
from steerlab.server.presets import Preset, PresetError, parse_preset

SITE, ALPHA = "blocks.1.hook_resid_pre", 6.0


@pytest.fixture(scope="module")
def vector() -> sl.SteeringVector:
    v = torch.randn(128, generator=torch.Generator().manual_seed(3))
    return sl.SteeringVector({SITE: v}, scale=0.5)


@pytest.fixture(scope="module")
def url(toy_lm, vector):
    started = int(time.time())
    with served(toy_lm, presets=[Preset("calm", vector, ALPHA)]) as address:
        yield address, started


def test_models_lists_the_preset_beside_the_model_with_a_real_created(url):
    address, started = url
    data = httpx.get(address + "/v1/models", headers=HEADERS).json()["data"]
    assert [d["id"] for d in data] == ["steerlab-tiny", "calm"]
    assert all(started - 5 <= d["created"] <= time.time() + 1 for d in data)
    assert data[1]["preset"] == {"sites": [SITE], "alpha": ALPHA}


def test_a_presets_loglikelihoods_equal_transformers_with_a_hook_adding_alpha_v(
    url, toy_hf, toy_lm, vector
):
    ids = toy_lm.tokenizer("The happy fox ran to the sea")["input_ids"]
    body = {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0}
    got = post(url[0], "/v1/completions", {**body, "model": "calm"}).json()
    want = logprobs(toy_hf, ids, [RefSteer(SITE, vector.directions[SITE], vector.scale * ALPHA)])
    plain = logprobs(toy_hf, ids, [])
    values = got["choices"][0]["logprobs"]["token_logprobs"]
    for t in range(1, len(ids)):
        assert values[t] == pytest.approx(float(want[t - 1, ids[t]]), abs=1e-4)
    assert max(abs(values[t] - float(plain[t - 1, ids[t]])) for t in range(1, len(ids))) > 1e-2


def test_a_preset_is_its_vector_in_the_steering_field(url, toy_lm, vector):
    body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0.8, "seed": 5,
            "logprobs": 1}  # fmt: skip
    steering = [
        {"site": SITE, "vector": vector.directions[SITE].tolist(), "alpha": vector.scale * ALPHA}
    ]
    by_name = post(url[0], "/v1/completions", {**body, "model": "calm"}).json()["choices"][0]
    by_field = post(url[0], "/v1/completions", {**body, "model": "steerlab-tiny",
                                                "steering": steering}).json()["choices"][0]  # fmt: skip
    assert by_name["token_ids"] == by_field["token_ids"]
    assert by_name["logprobs"]["token_logprobs"] == by_field["logprobs"]["token_logprobs"]


def test_an_unknown_model_is_a_404_listing_the_names(url):
    response = post(url[0], "/v1/completions", {"model": "clam", "prompt": "Hi"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["param"] == "model" and "'steerlab-tiny'" in error["message"]
    assert "'calm'" in error["message"]


def test_preset_arguments_are_checked():
    assert parse_preset("a.b=dir/v@x.safetensors@-2.5") == ("a.b", "dir/v@x.safetensors", -2.5)
    for bad in ("calm", "calm=v.safetensors", "calm=v.safetensors@big", "=v@1", "c=v@inf"):
        with pytest.raises(PresetError, match="--preset"):
            parse_preset(bad)


def test_preset_names_must_be_distinct(toy_lm, vector):
    from steerlab.server import ServedModels, create_app

    with pytest.raises(PresetError, match="differ"):
        create_app(ServedModels(toy_lm), presets=[Preset("steerlab-tiny", vector, 1.0)])
