"""Loading from local folders on every backend, device maps, and nothing that runs code."""

import contextlib
import json

import pytest
import torch
from helpers import BACKENDS, PROMPTS

import steerlab as sl
from steerlab.testing import char_tokenizer, save_tiny, tiny_model

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_local_folder_on_every_backend_gives_one_completion(tiny_dirs):
    outs = [sl.load(tiny_dirs["llama"], backend=b).generate(PROMPTS, max_new_tokens=8).tokens
            for b in BACKENDS]  # fmt: skip
    assert all(out == outs[0] for out in outs[1:])


def test_wrap_each_model_type(tiny_dirs):
    lm = sl.load(tiny_dirs["gpt2"], backend="hf")
    for backend in [b for b in BACKENDS if b != "hf"]:
        other = sl.load(tiny_dirs["gpt2"], backend=backend)
        wrapped = sl.wrap(other.model)  # TL models carry their tokenizer
        assert wrapped.backend.kind == backend
        assert (
            wrapped.generate(PROMPTS, max_new_tokens=5).tokens
            == lm.generate(PROMPTS, max_new_tokens=5).tokens
        )
    hf = sl.wrap(tiny_model("gpt2"), char_tokenizer())
    assert hf.backend.kind == "hf" and "blocks.2.hook_resid_post" in hf.sites()
    with pytest.raises(ValueError, match="tokenizer"):
        sl.wrap(tiny_model("gpt2"))


def test_all_cpu_device_map(tiny_dirs):
    plain = sl.load(tiny_dirs["gpt2"], backend="hf").generate(PROMPTS, max_new_tokens=6)
    for backend in ("hf", "bridge"):
        mapped = sl.load(tiny_dirs["gpt2"], backend=backend, device_map={"": "cpu"})
        assert mapped.generate(PROMPTS, max_new_tokens=6).tokens == plain.tokens


def test_hooked_refuses_device_map_and_unknown_local_families(tmp_path, tiny_dirs):
    with pytest.raises(ValueError, match="n_devices"):
        sl.load(tiny_dirs["gpt2"], backend="hooked", device_map="auto")
    gemma = save_tiny(tmp_path / "gemma2", "gemma2")
    with pytest.raises(ValueError, match="gpt2, llama, mistral"):
        sl.load(gemma, backend="hooked")
    lm = sl.load(gemma, backend="hf")  # the HF table has a row for it
    assert lm.generate("hi", max_new_tokens=3, stop_at_eos=False).tokens[0].__len__() == 3


def test_remote_code_is_never_run_by_default(tmp_path):
    folder = save_tiny(tmp_path / "evil", "gpt2")
    sentinel = tmp_path / "ran"
    (folder / "evil_model.py").write_text(f"open({str(sentinel)!r}, 'w').write('pwned')\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "evil_model.Evil", "AutoConfig": "evil_model.C"}
    (folder / "config.json").write_text(json.dumps(config))
    for backend in BACKENDS:
        with contextlib.suppress(Exception):  # refusing to load is fine; running code is not
            sl.load(folder, backend=backend)
        assert not sentinel.exists(), backend


@gpu
@pytest.mark.gpu
def test_split_over_cpu_and_cuda(tiny_dirs):
    plain = sl.load(tiny_dirs["llama"], backend="hf", device="cpu")
    device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu",
                  "model.layers.2": 0, "model.norm": "cpu", "model.rotary_emb": 0, "lm_head": "cpu"}  # fmt: skip
    split = sl.load(tiny_dirs["llama"], backend="hf", device_map=device_map)
    direction = torch.randn(split.d_model)
    steer = sl.Steer("blocks.1.hook_resid_pre", direction, alpha=3.0)
    assert (
        split.generate(PROMPTS, steer, max_new_tokens=8).tokens
        == plain.generate(PROMPTS, steer, max_new_tokens=8).tokens
    )
