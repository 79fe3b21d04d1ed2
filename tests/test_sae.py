"""SAEs in SAELens's format: SAELens writes the folders, steerlab reads them, SAELens's encode is
the reference; every bad folder gets its own error; feature steering equals a plain hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import steerlab as sl
from steerlab.core.sites import Site
from steerlab.features import SAEError, SAEUnavailableError, TopFeatures
from steerlab.features.format import CFG_FILENAME, WEIGHTS_FILENAME
from steerlab.features.hub import from_saelens

sae_lens = pytest.importorskip("sae_lens")

D_IN, D_SAE = 16, 48
SITE = "blocks.1.hook_resid_pre"


def lens_sae(architecture: str, apply_b_dec: bool = True, dtype: str = "float32", **extra):
    """A SAELens SAE with random weights (every parameter, threshold included, non-zero)."""
    cfg = {
        "architecture": architecture, "d_in": D_IN, "d_sae": D_SAE, "dtype": dtype,
        "device": "cpu", "apply_b_dec_to_input": apply_b_dec,
        "metadata": {"hook_name": SITE, "model_name": "tiny-gpt2"}, **extra,
    }  # fmt: skip
    sae = sae_lens.SAE.from_dict(cfg)
    generator = torch.Generator().manual_seed(len(architecture) + apply_b_dec)
    with torch.no_grad():
        for name, param in sae.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            param.copy_((noise.abs() * 0.5 if name == "threshold" else noise).to(param.dtype))
    return sae


def saved(tmp_path: Path, lens, name: str = "sae") -> Path:
    folder = tmp_path / name
    lens.save_model(folder)
    return folder


ARCHS = [
    ("standard", {}),
    ("jumprelu", {}),
    ("topk", {"k": 5}),
    ("topk", {"k": 5, "rescale_acts_by_decoder_norm": True}),
]


@pytest.mark.parametrize("apply_b_dec", [True, False])
@pytest.mark.parametrize(("architecture", "extra"), ARCHS)
def test_encode_and_decode_equal_saelens(tmp_path, architecture, extra, apply_b_dec):
    lens = lens_sae(architecture, apply_b_dec, **extra)
    sae = sl.load_sae(saved(tmp_path, lens))
    assert (sae.architecture, sae.site, sae.d_in, sae.d_sae) == (architecture, SITE, D_IN, D_SAE)
    assert sae.model_name == "tiny-gpt2" and sae.apply_b_dec_to_input is apply_b_dec
    x = 2 * torch.randn(
        3, 7, D_IN, generator=torch.Generator().manual_seed(0)
    )  # [batch, pos, d_in]
    with torch.no_grad():
        expected = lens.encode(x)
        f = sae.encode(x)
        torch.testing.assert_close(f, expected, atol=1e-6, rtol=1e-5)
        active = (expected > 0).float().sum(-1)
        assert 0 < float(active.mean()) < D_SAE  # sparse, and not trivially zero
        if architecture == "topk":
            assert bool((active <= extra["k"]).all())
        torch.testing.assert_close(sae.decode(f), lens.decode(expected), atol=1e-5, rtol=1e-5)


def test_apply_b_dec_to_input_changes_the_encoding(tmp_path):
    on = sl.load_sae(saved(tmp_path, lens_sae("standard", True), "on"))
    off = sl.load_sae(saved(tmp_path, lens_sae("standard", True), "off"))
    cfg = json.loads((tmp_path / "off" / CFG_FILENAME).read_text())
    (tmp_path / "off" / CFG_FILENAME).write_text(json.dumps({**cfg, "apply_b_dec_to_input": False}))
    off = sl.load_sae(tmp_path / "off")
    x = torch.randn(4, D_IN)
    torch.testing.assert_close(on.encode(x), torch.relu((x - on.b_dec) @ on.W_enc + on.b_enc))
    torch.testing.assert_close(off.encode(x), torch.relu(x @ off.W_enc + off.b_enc))


def test_dtype_is_honoured(tmp_path):
    lens = lens_sae("standard", dtype="float64")
    sae = sl.load_sae(saved(tmp_path, lens))
    assert sae.dtype == torch.float64 and sae.W_dec.dtype == torch.float64
    x = torch.randn(5, D_IN)  # float32 in, cast as SAELens casts it
    f = sae.encode(x)
    assert f.dtype == torch.float64
    with torch.no_grad():
        torch.testing.assert_close(f, lens.encode(x))


@pytest.mark.parametrize(("architecture", "extra"), ARCHS)
def test_save_round_trips_into_saelens(tmp_path, architecture, extra):
    sae = sl.load_sae(saved(tmp_path, lens_sae(architecture, **extra)))
    out = sae.save(tmp_path / "again")
    lens = sae_lens.SAE.load_from_disk(out, device="cpu")
    assert lens.cfg.architecture() == architecture
    assert lens.cfg.metadata.hook_name == SITE and lens.cfg.metadata.model_name == "tiny-gpt2"
    for name, tensor in sae.tensors().items():
        assert torch.equal(getattr(lens, name).detach(), tensor), name
    x = torch.randn(6, D_IN)
    with torch.no_grad():
        torch.testing.assert_close(lens.encode(x), sae.encode(x), atol=1e-6, rtol=1e-5)
    again = sl.load_sae(out)
    assert again.content_hash == sae.content_hash
    assert (again.k, again.rescale_acts_by_decoder_norm) == (
        sae.k,
        sae.rescale_acts_by_decoder_norm,
    )


def test_from_a_saelens_object_equals_from_its_folder(tmp_path):
    lens = lens_sae("jumprelu")
    assert from_saelens(lens, "x").content_hash == sl.load_sae(saved(tmp_path, lens)).content_hash


def test_feature_is_exactly_the_decoder_row_with_provenance(tmp_path):
    folder = saved(tmp_path, lens_sae("standard"))
    sae = sl.load_sae(folder)
    vec = sae.feature(7)
    assert isinstance(vec, sl.SteeringVector) and vec.sites == [SITE] and vec.scale == 1.0
    assert torch.equal(vec.direction_at(SITE), sae.W_dec[7])
    assert vec.provenance.data_sha256 == sae.content_hash and len(sae.content_hash) == 64
    assert "feature 7" in vec.provenance.method and "sae" in vec.provenance.method
    assert vec.provenance.model == "tiny-gpt2"
    assert sae.feature(int(torch.tensor(3))) == sae.feature(3)
    vec.save(tmp_path / "f7.safetensors")  # the provenance passes the vector file's schema
    assert sl.SteeringVector.load(tmp_path / "f7.safetensors") == vec


@pytest.mark.parametrize("bad", [-1, D_SAE, 2.0, True, "3", None, torch.tensor(1.0)])
def test_feature_index_outside_the_range_is_refused(tmp_path, bad):
    sae = sl.load_sae(saved(tmp_path, lens_sae("standard")))
    with pytest.raises(SAEError, match=rf"{D_SAE}"):
        sae.feature(bad)


def test_encode_of_the_wrong_width_is_refused(tmp_path):
    sae = sl.load_sae(saved(tmp_path, lens_sae("standard")))
    with pytest.raises(SAEError, match=rf"\[\.\.\., {D_IN}\].*\(2, 5\)"):
        sae.encode(torch.zeros(2, 5))
    with pytest.raises(SAEError, match=rf"\[\.\.\., {D_SAE}\]"):
        sae.decode(torch.zeros(2, D_IN))


def test_repr_names_what_matters(tmp_path):
    sae = sl.load_sae(saved(tmp_path, lens_sae("topk", k=5)))
    assert repr(sae).startswith("SAE(topk, k=5, site='blocks.1.hook_resid_pre', d_in=16, d_sae=48")
    html = sae._repr_html_()
    assert "<table>" in html and SITE in html and "tiny-gpt2" in html


# --- bad folders: each gets its own error, naming the thing, before any weight is used -----


def edit_cfg(folder: Path, **changes) -> Path:
    cfg = json.loads((folder / CFG_FILENAME).read_text())
    for key, value in changes.items():
        if key.startswith("metadata_"):
            cfg["metadata"][key.removeprefix("metadata_")] = value
        elif value is _DROP:
            cfg.pop(key)
        else:
            cfg[key] = value
    (folder / CFG_FILENAME).write_text(json.dumps(cfg))
    return folder


_DROP = object()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"architecture": "gated"}, r"architecture 'gated'.*cfg\.json.*not supported"),
        ({"architecture": "batchtopk"}, r"'batchtopk'"),
        ({"architecture": _DROP}, r"no 'architecture'"),
        (
            {"normalize_activations": "expected_average_only_in"},
            r"normalize_activations 'expected_average_only_in'",
        ),
        ({"normalize_activations": "layer_norm"}, r"normalize_activations 'layer_norm'"),
        ({"reshape_activations": "hook_z"}, r"reshape_activations 'hook_z'"),
        (
            {"metadata_hook_name": "blocks.0.attn.hook_z"},
            r"hook_name 'blocks\.0\.attn\.hook_z'.*not a steerlab site",
        ),
        ({"metadata_hook_name": "blocks.0.hook_resid_pre.x"}, r"'blocks\.0\.hook_resid_pre\.x'"),
        ({"metadata_hook_name": None}, r"metadata\.hook_name"),
        ({"metadata_hook_head_index": 3}, r"hook_head_index 3"),
        ({"metadata": _DROP}, r"no 'metadata'"),
        ({"d_sae": "48"}, r"d_sae in .*cfg\.json must be a positive int; got '48'"),
        ({"d_in": 0}, r"d_in"),
        ({"dtype": "int8"}, r"dtype 'int8'"),
        ({"apply_b_dec_to_input": "yes"}, r"apply_b_dec_to_input"),
        (
            {"d_sae": 40},
            r"W_enc in .*sae_weights\.safetensors has shape \(16, 48\); cfg\.json says \(16, 40\)",
        ),
    ],
)
def test_bad_configs_are_refused_naming_the_value(tmp_path, changes, message):
    folder = edit_cfg(saved(tmp_path, lens_sae("standard")), **changes)
    with pytest.raises(SAEError, match=message):
        sl.load_sae(folder)


@pytest.mark.parametrize("k", [0, D_SAE + 1, 2.5, None])
def test_bad_topk_k_is_refused(tmp_path, k):
    folder = edit_cfg(saved(tmp_path, lens_sae("topk", k=5)), k=k)
    with pytest.raises(SAEError, match=r"k in .*cfg\.json must be an int in \[1, d_sae=48\]"):
        sl.load_sae(folder)


def test_missing_folder_and_files_are_named(tmp_path):
    with pytest.raises(SAEError, match=r"No SAE folder at '.*nowhere'"):
        sl.load_sae(tmp_path / "nowhere")
    folder = saved(tmp_path, lens_sae("standard"))
    with pytest.raises(SAEError, match=r"is a file"):
        sl.load_sae(folder / CFG_FILENAME)
    (folder / CFG_FILENAME).rename(tmp_path / "kept.json")
    with pytest.raises(SAEError, match=r"Missing .*cfg\.json"):
        sl.load_sae(folder)
    (tmp_path / "kept.json").rename(folder / CFG_FILENAME)
    (folder / WEIGHTS_FILENAME).unlink()
    with pytest.raises(SAEError, match=r"Missing .*sae_weights\.safetensors"):
        sl.load_sae(folder)


def test_bad_json_and_bad_safetensors_are_named(tmp_path):
    folder = saved(tmp_path, lens_sae("standard"))
    (folder / CFG_FILENAME).write_text("{not json")
    with pytest.raises(SAEError, match=r"cfg\.json is not valid JSON"):
        sl.load_sae(folder)
    folder = saved(tmp_path, lens_sae("standard"), "b")
    (folder / WEIGHTS_FILENAME).write_bytes(b"\x00" * 64)
    with pytest.raises(
        SAEError, match=r"sae_weights\.safetensors is not a readable safetensors file"
    ):
        sl.load_sae(folder)
    (folder / CFG_FILENAME).write_text("[1, 2]")
    with pytest.raises(SAEError, match=r"cfg\.json must hold a JSON object"):
        sl.load_sae(folder)


def test_pickled_weights_are_refused_and_never_unpickled(tmp_path):
    folder = saved(tmp_path, lens_sae("standard"))
    tensors = load_file(folder / WEIGHTS_FILENAME)
    (folder / WEIGHTS_FILENAME).unlink()
    marker = tmp_path / "unpickled"

    class Boom:
        def __reduce__(self):
            return (Path.touch, (marker,))

    torch.save({"payload": Boom(), **tensors}, folder / "sae_weights.pt")
    (folder / "sae_weights.bin").write_bytes((folder / "sae_weights.pt").read_bytes())
    with pytest.raises(
        SAEError, match=r"pickled weights \(sae_weights\.bin, sae_weights\.pt\).*never unpickles"
    ):
        sl.load_sae(folder)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.pop("b_enc"), r"missing \['b_enc'\]"),
        (lambda t: t.update(extra=torch.zeros(3)), r"unexpected \['extra'\]"),
        (
            lambda t: t.update(scaling_factor=torch.full((D_SAE,), 2.0)),
            r"scaling_factor that is not all ones",
        ),
        (
            lambda t: t.update(W_dec=torch.full((D_SAE, D_IN), float("nan"))),
            r"W_dec in .* finite floats",
        ),
        (lambda t: t.update(b_dec=torch.zeros(D_IN + 1)), r"b_dec in .* has shape \(17,\)"),
    ],
)
def test_bad_weight_files_are_refused_naming_the_tensor(tmp_path, edit, message):
    folder = saved(tmp_path, lens_sae("standard"))
    tensors = load_file(folder / WEIGHTS_FILENAME)
    edit(tensors)
    save_file(tensors, folder / WEIGHTS_FILENAME)
    with pytest.raises(SAEError, match=message):
        sl.load_sae(folder)


def test_a_jumprelu_folder_without_threshold_is_refused(tmp_path):
    folder = saved(tmp_path, lens_sae("standard"))
    edit_cfg(folder, architecture="jumprelu")
    with pytest.raises(SAEError, match=r"missing \['threshold'\]"):
        sl.load_sae(folder)


def test_all_ones_scaling_factor_is_dropped_as_saelens_does(tmp_path):
    folder = saved(tmp_path, lens_sae("standard"))
    tensors = load_file(folder / WEIGHTS_FILENAME)
    reference = sl.load_sae(folder)
    save_file({**tensors, "scaling_factor": torch.ones(D_SAE)}, folder / WEIGHTS_FILENAME)
    assert sl.load_sae(folder).content_hash == reference.content_hash


def test_errors_are_value_errors_and_unavailable_is_also_an_import_error():
    assert issubclass(SAEError, ValueError)
    assert issubclass(SAEUnavailableError, ImportError) and issubclass(
        SAEUnavailableError, SAEError
    )


# --- the registry path: never downloads in tests ----------------------------------------


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_release_offline_fails_fast_with_one_short_message(tmp_path):
    code = (
        "import time, steerlab as sl\n"
        "t = time.perf_counter()\n"
        "try:\n"
        "    sl.load_sae('gpt2-small-res-jb', 'blocks.8.hook_resid_pre')\n"
        "except sl.features.SAEUnavailableError as e:\n"
        "    print(f'{time.perf_counter() - t:.3f}'); print(e)\n"
        "import sys; print('sae_lens' in sys.modules)\n"
    )
    result = _run(code, {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "empty-hf-home")})
    assert result.returncode == 0, result.stderr[-2000:]
    seconds, message, imported = result.stdout.strip().splitlines()
    assert float(seconds) < 2.0
    assert "HF_HUB_OFFLINE" in message and "jbloom/GPT2-Small-SAEs-Reformatted" in message
    assert len(message) < 200 and imported == "False"


def test_a_release_without_sae_lens_names_the_extra(tmp_path):
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import importlib.util as u\n_find = u.find_spec\n"
        "u.find_spec = lambda name, *a: None if name == 'sae_lens' else _find(name, *a)\n"
    )
    code = (
        "import steerlab as sl\n"
        "try:\n    sl.load_sae('gpt2-small-res-jb', 'blocks.8.hook_resid_pre')\n"
        "except ImportError as e:\n    print(e)\n"
    )
    result = _run(code, {"PYTHONPATH": f"{blocker}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "pip install 'steerlab[sae]'" in result.stdout


def test_an_unknown_release_is_refused_by_name():
    with pytest.raises(SAEError, match=r"'no-such-release' is not a release"):
        sl.load_sae("no-such-release", "x")


# --- steering with a feature equals a plain hook ---------------------------------------


@pytest.fixture(scope="module")
def tiny_lm():
    return sl.load("steerlab-tiny", backend="hf")


def test_feature_steering_equals_a_plain_hook_adding_the_decoder_row(tiny_lm):
    sae = sl.load_sae("steerlab-tiny-sae")
    i = 5
    prompts = ["Once upon a time, there was a", "Mia"]
    out = tiny_lm.generate(prompts, steer=sl.Steer(sae.site, sae.feature(i), alpha=8.0),
                           max_new_tokens=12, stop_at_eos=False)  # fmt: skip
    plain = tiny_lm.generate(prompts, steer=sl.Steer(sae.site, sae.W_dec[i].clone(), alpha=8.0),
                             max_new_tokens=12, stop_at_eos=False)  # fmt: skip
    assert out.tokens == plain.tokens and out.logprobs == plain.logprobs

    from steerlab.toy.evidence import add_to_resid_pre

    layer = Site.parse(sae.site).layer
    assert layer is not None
    model, tok = tiny_lm.model, tiny_lm.tokenizer
    for prompt, tokens in zip(prompts, out.tokens):
        ids = torch.tensor([tok(prompt).input_ids])
        with add_to_resid_pre(model, layer, 8.0 * sae.W_dec[i]), torch.no_grad():
            for _ in range(12):  # greedy, as lm.generate's default
                ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
        assert ids[0, -12:].tolist() == tokens
    unsteered = tiny_lm.generate(prompts, max_new_tokens=12, stop_at_eos=False)
    assert unsteered.tokens != out.tokens  # the feature does something


def test_top_features_named_tuple_is_importable():
    assert TopFeatures._fields == ("values", "indices")
