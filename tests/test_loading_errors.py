"""Names that cannot load fail with a message that says why, before any weights are read."""

import time
from pathlib import Path

import pytest
import transformers
from helpers import BACKENDS

import steerlab as sl
from steerlab.loading import ModelNotAvailableError, _locate


@pytest.fixture
def no_tokenizer_load(monkeypatch):
    """Fail the test if loading gets as far as reading a tokenizer."""

    def refuse(*args, **kwargs):
        raise AssertionError("the error came after loading had started")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)


@pytest.mark.parametrize("name", ["./missing_dir", "../no/such/folder", Path("missing_dir")])
def test_a_missing_folder_says_it_does_not_exist(name, no_tokenizer_load):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        sl.load(name)


@pytest.mark.parametrize("name", ["steerlab-tine", "steerlab_tiny", "Steerlab-tiny"])
def test_a_typo_of_an_embedded_model_suggests_it(name, no_tokenizer_load):
    with pytest.raises(ValueError, match="Did you mean 'steerlab-tiny'"):
        sl.load(name)


def test_a_file_is_not_a_folder(tmp_path, no_tokenizer_load):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(NotADirectoryError, match="folder"):
        sl.load(tmp_path / "model.safetensors")


def test_an_uncached_hub_id_offline_says_so(monkeypatch, no_tokenizer_load):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    # A hub id no cache holds, so the test cannot pick up a real download.
    with pytest.raises(ModelNotAvailableError, match="HF_HUB_OFFLINE") as error:
        sl.load("steerlab-tests/never-downloaded")
    message = str(error.value)
    assert "steerlab-tiny" in message and "not in the HuggingFace cache" in message
    assert "hf download steerlab-tests/never-downloaded" in message
    assert isinstance(error.value, OSError)


@pytest.fixture
def unreachable_hub(monkeypatch):
    """No HF_HUB_OFFLINE, and a hub endpoint on a closed loopback port (refused at once).

    Any call to huggingface_hub's retrying HTTP helper fails the test: the answer must come
    from the one probe, not from transformers' retry loop (about 47 s offline).
    """
    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")

    def no_retries(*args, **kwargs):
        raise AssertionError("a hub download with retries was started")

    monkeypatch.setattr(_http, "http_backoff", no_retries)


def test_an_uncached_hub_id_without_network_fails_fast_with_one_message(
    unreachable_hub, no_tokenizer_load
):
    start = time.perf_counter()
    with pytest.raises(ModelNotAvailableError) as error:
        sl.load("steerlab-tests/never-downloaded")
    assert time.perf_counter() - start < 10  # loose: a guard against the 47 s retry loop
    assert str(error.value) == (
        "Cannot load 'steerlab-tests/never-downloaded': it is not in the HuggingFace cache "
        "and the hub cannot be reached (no network?). Download it once while online "
        "(hf download steerlab-tests/never-downloaded), pass a local folder, or use "
        "sl.load('steerlab-tiny'), which ships with steerlab and works offline."
    )
    assert error.value.__cause__ is None and error.value.__context__ is None


def test_a_cached_hub_id_without_network_loads_from_its_snapshot_folder(
    unreachable_hub, monkeypatch, tmp_path, tiny_dirs
):
    import shutil

    from huggingface_hub import constants

    repo = tmp_path / "models--steerlab-tests--cached"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_dirs["gpt2"], snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert _locate("steerlab-tests/cached") == str(snapshot)
    lm = sl.load("steerlab-tests/cached", backend="hf")
    assert lm.n_layers == sl.load(tiny_dirs["gpt2"], backend="hf").n_layers


def test_serve_prints_one_line_for_a_model_it_cannot_get(unreachable_hub):
    from steerlab.cli import main

    with pytest.raises(SystemExit) as error:
        main(["serve", "steerlab-tests/never-downloaded"])
    message = str(error.value.code)
    assert message.startswith("steerlab serve: Cannot load 'steerlab-tests/never-downloaded'")
    assert "\n" not in message and "steerlab-tiny" in message


def test_a_folder_with_only_pickled_bin_weights_is_refused_on_every_backend(tiny_dirs, tmp_path):
    import shutil

    folder = tmp_path / "bin_only"
    shutil.copytree(tiny_dirs["gpt2"], folder)
    for weights in folder.glob("*.safetensors"):
        weights.rename(folder / "pytorch_model.bin")
    for backend in BACKENDS:
        with pytest.raises(ValueError, match="pickled .bin"):
            sl.load(folder, backend=backend)
