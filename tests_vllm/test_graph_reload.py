"""A compiled engine's later starts load the compiled model vLLM saved instead of tracing
again (on a GPU, every start after the first). Its steering must still be data read from
the live buffers, never values baked into the saved artifact: new vectors, monitors,
conditions and uncompiled forwards after such a load equal plain HF with hooks."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from reads_parity import check_cast_rows, check_monitors_against_hf
from reference import RefSteer, greedy

import steerlab as sl
from steerlab.engine import Request, Sampling, Steer

SHIM = Path(__file__).resolve().parent / "aot_shim"
NEW = 10
TWO = "two steers act on one token at one site (the compiled table holds one)"


def _vec(seed: int) -> torch.Tensor:
    return torch.randn(128, generator=torch.Generator().manual_seed(seed)) * 0.4


ROWS = [
    [],
    [RefSteer("blocks.1.hook_resid_pre", _vec(201), 4.0)],
    [RefSteer("blocks.2.hook_resid_post", _vec(202), 6.0, "generated")],
    [RefSteer("hook_embed", _vec(203), 2.0)],
    # two steers on one token at one site: these forwards run uncompiled
    [RefSteer("blocks.1.hook_resid_pre", _vec(204), 3.0),
     RefSteer("blocks.1.hook_resid_pre", _vec(205), -2.0)],
]  # fmt: skip
PROMPTS = ["Once upon a time", "The sea was", "A cat", "Tell me", "The forest"]


def _load_from_saved(monkeypatch) -> sl.SteerableModel:
    """The session's engine's settings, in processes that can load vLLM's saved model."""
    paths = [str(SHIM), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    return sl.load("steerlab-tiny", backend="vllm", max_model_len=128, graph="all",
                   vllm_args={"block_size": 32, "enable_chunked_prefill": False,
                              "enforce_eager": False})  # fmt: skip


def test_a_compiled_model_loaded_from_vllms_saved_artifact_still_steers(lm, hf, monkeypatch):
    assert lm.engine.rpc("steerlab_graphs")[0] > 0  # the session's engine traced and saved
    loaded = _load_from_saved(monkeypatch)
    try:
        assert loaded.engine.rpc("steerlab_graphs") == [0]  # the model loaded, not traced
        requests = []
        for prompt, row in zip(PROMPTS, ROWS):
            steers = tuple(Steer(s.site, s.vector, s.alpha, s.positions, sl.Add()) for s in row)
            ids = tuple(loaded.tokenizer(prompt)["input_ids"])
            requests.append(Request(ids, steers, Sampling(max_new_tokens=NEW), prompt))
        done = loaded.engine.run(requests)
        (traced,) = loaded.engine.rpc("steerlab_graphs")  # + vLLM's sampling ops, on first use
        for i, (request, row) in enumerate(zip(requests, ROWS)):
            want = greedy(hf, list(request.prompt), row, NEW, loaded.eos_ids)
            assert done[i].tokens == want, i
            if row:  # the steer acted
                assert want != greedy(hf, list(request.prompt), [], NEW, loaded.eos_ids), i
        assert loaded.engine.rpc("steerlab_uncompiled")[0].get(TWO, 0) > 0
        check_monitors_against_hf(loaded, hf)
        check_cast_rows(loaded, hf, "mean", "above")
        assert loaded.engine.rpc("steerlab_graphs") == [traced]  # new steers: nothing new
    finally:
        loaded.engine.close()
