"""Names that cannot load fail with a message that says why, before any weights are read."""

from pathlib import Path

import pytest
import transformers

import steerlab as sl


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


def test_an_uncached_hub_id_offline_says_so(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    # A hub id no cache holds, so the test cannot pick up a real download.
    with pytest.raises(OSError, match="HF_HUB_OFFLINE") as error:
        sl.load("steerlab-tests/never-downloaded")
    message = str(error.value)
    assert "steerlab-tiny" in message and "not in the HuggingFace cache" in message


def test_a_folder_with_only_pickled_bin_weights_is_refused_on_every_backend(tiny_dirs, tmp_path):
    import shutil

    folder = tmp_path / "bin_only"
    shutil.copytree(tiny_dirs["gpt2"], folder)
    for weights in folder.glob("*.safetensors"):
        weights.rename(folder / "pytorch_model.bin")
    for backend in ("hf", "hooked", "bridge"):
        with pytest.raises(ValueError, match="pickled .bin"):
            sl.load(folder, backend=backend)
