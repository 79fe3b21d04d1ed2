"""llama.cpp's control vectors: ``vec.save("x.gguf")`` and ``SteeringVector.load("x.gguf")``,
checked against the ``gguf`` package's reader, a repeng-style export written by the ``gguf``
package's writer (repeng's ``ControlVector.export_gguf`` calls, repeated here), and a plain
torch hook on HF's block output for the layer numbering."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import steerlab as sl
from steerlab.vectors import gguf as cv

gguf = pytest.importorskip("gguf")
HINT = "steerlab-tiny"


def _vector(lm, sites, seed=0) -> sl.SteeringVector:
    g = torch.Generator().manual_seed(seed)
    return sl.SteeringVector({s: torch.randn(lm.d_model, generator=g) for s in sites},
                             provenance=sl.vectors.Provenance(model=HINT))  # fmt: skip


def _repeng_export(path, model_hint: str, directions: dict[int, np.ndarray]) -> None:
    """What repeng's ``ControlVector.export_gguf`` does, call for call."""
    writer = gguf.GGUFWriter(path, "controlvector")
    writer.add_string("controlvector.model_hint", model_hint)
    writer.add_uint32("controlvector.layer_count", len(directions))
    for layer in directions:
        writer.add_tensor(f"direction.{layer}", directions[layer])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_round_trip_keeps_every_direction_bit_for_bit(toy_lm, tmp_path):
    vec = _vector(toy_lm, ["blocks.3.hook_resid_pre", "blocks.3.hook_resid_post",
                           "blocks.1.hook_resid_post"])  # fmt: skip
    path = vec.save(tmp_path / "happy.gguf")
    assert path.read_bytes()[:4] == b"GGUF"
    back = sl.SteeringVector.load(path, model=toy_lm)
    assert list(back.directions) == list(vec.directions) and back.scale == 1.0
    for site in vec.directions:
        assert torch.equal(back[site], vec[site]) and back[site].dtype == torch.float32
    assert back.provenance.model == HINT


def test_the_gguf_packages_reader_sees_llama_cpps_layout(toy_lm, tmp_path):
    vec = _vector(toy_lm, ["blocks.2.hook_resid_pre", "blocks.3.hook_resid_post"])
    path = vec.save(tmp_path / "v.gguf")
    reader = gguf.GGUFReader(path)
    assert reader.get_field("general.architecture").contents() == "controlvector"
    assert reader.get_field("controlvector.model_hint").contents() == HINT
    assert reader.get_field("controlvector.layer_count").contents() == 2
    tensors = {t.name: t for t in reader.tensors}
    assert sorted(tensors) == ["direction.1", "direction.3"]  # resid_pre 2 is layer 1's output
    for name, site in (("direction.1", "blocks.2.hook_resid_pre"),
                       ("direction.3", "blocks.3.hook_resid_post")):  # fmt: skip
        t = tensors[name]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32 and list(t.shape) == [toy_lm.d_model]
        assert np.array_equal(np.asarray(t.data), vec[site].numpy())


def test_a_file_of_output_sites_is_repengs_export_byte_for_byte(toy_lm, tmp_path):
    vec = _vector(toy_lm, [f"blocks.{layer}.hook_resid_post" for layer in (3, 1, 2)])
    layers = [int(site.split(".")[1]) for site in vec.directions]  # the vector's own order
    ours = vec.save(tmp_path / "ours.gguf").read_bytes()
    theirs = {layer: vec[f"blocks.{layer}.hook_resid_post"].numpy() for layer in layers}
    _repeng_export(tmp_path / "repeng.gguf", HINT, theirs)
    assert ours == (tmp_path / "repeng.gguf").read_bytes()
    # repeng's own default order is the last layer down: other bytes, the same vector
    _repeng_export(tmp_path / "down.gguf", HINT, dict(sorted(theirs.items(), reverse=True)))
    down = sl.SteeringVector.load(tmp_path / "down.gguf", model=toy_lm)
    assert all(torch.equal(down[site], vec[site]) for site in vec.directions)


def test_a_repeng_file_loads_at_each_layers_output(toy_lm, tmp_path):
    rng = np.random.default_rng(0)
    directions = {layer: rng.standard_normal(toy_lm.d_model).astype(np.float32) for layer in (1, 3)}
    _repeng_export(tmp_path / "r.gguf", "gpt2", directions)
    vec = sl.SteeringVector.load(tmp_path / "r.gguf", model=toy_lm)
    assert list(vec.directions) == ["blocks.1.hook_resid_post", "blocks.3.hook_resid_post"]
    assert np.array_equal(vec["blocks.3.hook_resid_post"].numpy(), directions[3])
    assert vec.provenance.model == "" and "gpt2" in vec.provenance.method  # no model warning


def test_direction_L_is_added_to_block_Ls_output_as_llama_cpp_adds_it(toy_lm, toy_hf, tmp_path):
    """llama.cpp: ``cur = ggml_add(cur, direction[il])`` after block il's residual add. The
    reference: a forward hook on HF's block L adding the direction to its output."""
    rng = np.random.default_rng(1)
    direction = (rng.standard_normal(toy_lm.d_model) * 4).astype(np.float32)
    _repeng_export(tmp_path / "d2.gguf", "gpt2", {2: direction})
    vec = sl.SteeringVector.load(tmp_path / "d2.gguf", model=toy_lm)
    ids = torch.tensor([toy_lm.tokenizer.encode("Once upon a time, there was")])
    added = torch.from_numpy(direction)

    def hook(_module, _args, output):
        return (output[0] + added, *output[1:]) if isinstance(output, tuple) else output + added

    handle = toy_hf.transformer.h[2].register_forward_hook(hook)
    try:
        with torch.no_grad():
            want = toy_hf(ids).logits[0]
    finally:
        handle.remove()
    got = toy_lm.logits(["Once upon a time, there was"], vec)[0]
    assert not torch.allclose(got, toy_lm.logits(["Once upon a time, there was"])[0], atol=1e-2)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    same = toy_lm.logits(["Once upon a time, there was"],
                         sl.Steer("blocks.3.hook_resid_pre", added))[0]  # fmt: skip
    torch.testing.assert_close(got, same, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("site", "why"),
    [("blocks.1.hook_attn_out", "hook_attn_out"), ("blocks.1.hook_mlp_out", "hook_mlp_out"),
     ("blocks.2.hook_resid_mid", "hook_resid_mid"), ("hook_embed", "hook_embed"),
     ("blocks.0.hook_resid_pre", "layer 0"), ("blocks.0.hook_resid_post", "layer 0"),
     ("blocks.1.hook_resid_pre", "layer 0")],
)  # fmt: skip
def test_sites_that_cannot_travel_are_refused_before_writing(toy_lm, tmp_path, site, why):
    with pytest.raises(ValueError, match=why):
        _vector(toy_lm, [site]).save(tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_ops_positions_conditions_and_loreft_are_refused(toy_lm, tmp_path, direction):
    v, site, out = torch.randn(toy_lm.d_model), "blocks.2.hook_resid_pre", tmp_path / "s.gguf"
    with pytest.raises(ValueError, match="Ablate"):
        cv.save(sl.Steer(site, v, op=sl.Ablate()), out)
    with pytest.raises(ValueError, match="positions='generated'"):
        cv.save(sl.Steer(site, v, positions="generated"), out)
    when = sl.Condition(site, v, 0.1)
    with pytest.raises(ValueError, match="condition"):
        cv.save(sl.Steer(site, v, when=when), out)
    reft = sl.LoReFT(site, torch.linalg.qr(torch.randn(toy_lm.d_model, 2))[0].T,
                     torch.randn(2, toy_lm.d_model), torch.zeros(2))  # fmt: skip
    with pytest.raises(TypeError, match="LoReFT"):
        cv.save(reft, out)
    with pytest.raises(ValueError, match="both layer 1"):
        _vector(toy_lm, ["blocks.1.hook_resid_post", "blocks.2.hook_resid_pre"]).save(out)
    wide = sl.SteeringVector({site: torch.randn(toy_lm.d_model, dtype=torch.float64)})
    with pytest.raises(ValueError, match="float32"):
        wide.save(out)
    assert not out.exists()
    cv.save(sl.Steer(site, v, alpha=2.0), out)  # an Add at every position: alpha baked in
    assert torch.equal(sl.SteeringVector.load(out)[site], v * 2.0)


def test_a_scale_is_baked_into_the_directions(toy_lm, tmp_path):
    vec = _vector(toy_lm, ["blocks.2.hook_resid_post"]) * 4
    back = sl.SteeringVector.load(vec.save(tmp_path / "x4.gguf"))
    assert back.scale == 1.0
    site = "blocks.2.hook_resid_post"
    assert torch.equal(back.directions[site], vec.directions[site] * 4.0)
    assert torch.equal(back[site], vec[site])  # indexing gives the scaled direction either way


def test_files_that_are_not_control_vectors_or_do_not_fit_are_refused(toy_lm, tmp_path):
    model_file = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(model_file, "llama")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(sl.vectors.io.VectorFileError, match="architecture 'llama'"):
        sl.SteeringVector.load(model_file)
    d = toy_lm.d_model
    for name, directions, match in (
        ("zero", {0: np.ones(d, np.float32)}, "L >= 1"),
        ("half", {1: np.ones(d, np.float16)}, "float32"),
        ("deep", {9: np.ones(d, np.float32)}, "4 layers"),
        ("narrow", {1: np.ones(8, np.float32)}, "d_model=128"),
    ):
        _repeng_export(tmp_path / f"{name}.gguf", "x", directions)
        with pytest.raises(sl.vectors.io.VectorFileError, match=match):
            sl.SteeringVector.load(tmp_path / f"{name}.gguf", model=toy_lm)
    good = _vector(toy_lm, ["blocks.2.hook_resid_post"]).save(tmp_path / "good.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(good[:-40])
    (tmp_path / "pickle.gguf").write_bytes(pickle.dumps({"direction.1": [1.0]}))
    for name in ("cut", "pickle"):
        with pytest.raises(sl.vectors.io.VectorFileError):
            sl.SteeringVector.load(tmp_path / f"{name}.gguf")
