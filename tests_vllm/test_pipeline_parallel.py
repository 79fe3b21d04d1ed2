"""A tiny random Llama on pipeline parallel 2 (layers 0-1 on one rank, 2-3 on the other).

Llama-family layers pass ``(delta, residual)``: steers act on their sum. vLLM's CPU runner
needs steerlab's workaround to run pipeline parallel in eager mode at all (see
``SteerWorker.steerlab_pp_buffers``: vLLM 0.32's ``CPUModelRunner`` skips allocating
``intermediate_tensors`` under ``enforce_eager``; no upstream issue for the CPU runner was
found, the same assertion from other causes is vllm-project/vllm#49430). Each hook fires
only on the rank holding its layer.
"""

from __future__ import annotations

import os

import pytest
import torch
from reference import RefSteer, greedy, peaky_folder
from transformers import AutoModelForCausalLM

import steerlab as sl

NEW = 12


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return peaky_folder(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=3)


@pytest.fixture(scope="module")
def lm(folder):
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    model = sl.load(str(folder), backend="vllm", pipeline_parallel_size=2, max_model_len=128)
    yield model
    model.engine.close()
    del os.environ["VLLM_CPU_OMP_THREADS_BIND"], os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"]


def _vec(seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(128, generator=torch.Generator().manual_seed(seed)) * scale


def test_pipeline_parallel_llama_rows_equal_hf(lm, folder):
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    sites = [
        ("blocks.0.hook_resid_pre", "add", "all"),
        ("blocks.1.hook_resid_mid", "ablate", "all"),
        ("blocks.2.hook_resid_post", "clamp", "generated"),
        ("blocks.3.hook_mlp_out", "add", 2),
        ("blocks.1.hook_attn_out", "add", "prompt"),
        ("blocks.0.hook_resid_pre", "clamp", "all"),
    ]
    plain = lm.generate(["Hello there", "abc"], max_new_tokens=NEW)
    for row, prompt in enumerate(plain.prompt_tokens):
        assert plain.tokens[row] == greedy(hf, prompt, [], NEW, lm.eos_ids)
    changed = 0
    for i, (site, op, where) in enumerate(sites):
        v = _vec(10 + i, 1.0 if op != "add" else 2.0)
        sl_op = {"add": sl.Add(), "ablate": sl.Ablate(), "clamp": sl.Clamp(3.0)}[op]
        out = lm.generate(["Hello there", "abc"], sl.Steer(site, v, alpha=[0.0, 1.0],
                          positions=where, op=sl_op), max_new_tokens=NEW)  # fmt: skip
        for row, prompt in enumerate(out.prompt_tokens):
            ref = [RefSteer(site, v, out.alphas[row][0], where, op, 3.0)]
            assert out.tokens[row] == greedy(hf, prompt, ref, NEW, lm.eos_ids), (site, row)
        changed += out.tokens[1] != out.tokens[0]
    assert changed >= len(sites) - 2
    assert lm.hook_count() == 0


def test_conditions_are_refused_and_monitors_read_on_the_stage_holding_them(lm, folder):
    """A worker decides from what it holds, so a condition on two stages is refused, with
    why; a monitor is read by whichever stage holds its layer, and the reports merge."""
    c = sl.Condition("blocks.0.hook_resid_post", _vec(30))
    steer = sl.Steer("blocks.3.hook_resid_pre", _vec(31), 2.0, positions="generated", when=c)
    assert lm.explain("Hello there", steer).startswith("refused:")
    with pytest.raises(sl.SteerError, match="pipeline stages"):
        lm.generate("Hello there", steer=steer, max_new_tokens=2)
    monitor = {"early": ("blocks.0.hook_resid_post", _vec(32)),
               "late": ("blocks.3.hook_resid_post", _vec(33))}  # fmt: skip
    prompts = ["Hello there", "abc"]
    got = lm.generate(prompts, max_new_tokens=NEW, monitor=monitor)
    want = sl.load(str(folder), backend="hf").generate(prompts, max_new_tokens=NEW, monitor=monitor)
    assert got.tokens == want.tokens
    for name in monitor:
        for part in ("prompt", "generated"):
            torch.testing.assert_close(getattr(got.monitors[name], part),
                                       getattr(want.monitors[name], part), atol=1e-4,
                                       rtol=1e-4, equal_nan=True)  # fmt: skip
    assert lm.hook_count() == 0
