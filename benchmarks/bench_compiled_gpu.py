"""The compiled path on a GPU (CUDA graphs): exactness, then speed against HF ``generate``.

Runs without TransformerLens (models are wrapped with the hf backend directly). Writes
``$OUT/gpu.json`` after every measurement, so a run cut short still reports what it did.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

import steerlab as sl
from steerlab.backends.hf import HFBackend
from steerlab.model import SteerableModel
from steerlab.testing import char_tokenizer

OUT = Path(os.environ.get("OUT", "."))
RESULTS: dict[str, object] = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
PROMPT = "The quick brown fox jumps over a"


def save() -> None:
    (OUT / "gpu.json").write_text(json.dumps(RESULTS, indent=1))
    print(json.dumps(RESULTS)[-600:], flush=True)


def wrap(model: torch.nn.Module, tokenizer: object) -> SteerableModel:
    return SteerableModel(HFBackend(model), tokenizer, name=type(model).__name__)


def timed(fn: Callable[[], object], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def exactness() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from steerlab.toy import asset_path

    path = str(asset_path("steerlab-tiny"))
    tok = AutoTokenizer.from_pretrained(path)
    load = lambda: AutoModelForCausalLM.from_pretrained(path).cuda().eval()  # noqa: E731
    fast, eager = wrap(load(), tok).compile(), wrap(load(), tok)
    torch.manual_seed(1)
    v = torch.randn(fast.d_model)
    steers = [
        sl.Steer("blocks.1.hook_resid_pre", v, alpha=[0.0, 4.0], positions="generated"),
        sl.Steer("blocks.2.hook_attn_out", v, alpha=[-3.0, 2.0], positions=3, op=sl.Ablate()),
        sl.Steer("hook_embed", v, alpha=[0.5, 1.0], op=sl.Clamp(2.0)),
        sl.Steer("blocks.0.hook_mlp_out", v, alpha=[0.0, 6.0], positions="prompt"),
        sl.Steer(
            "blocks.2.hook_resid_pre",
            v,
            alpha=[0.5, 1.0],
            positions="generated",
            op=sl.Rotate(120.0, torch.randn(fast.d_model)),
        ),  # the rot table term
        sl.Steer(
            "blocks.2.hook_resid_pre",
            v,
            alpha=[0.0, 4.0],
            positions="generated",
            when=sl.Condition(
                "blocks.1.hook_resid_post", torch.randn(fast.d_model), score="projection"
            ),
        ),  # a per-row mask set after prefill
    ]
    prompts = ["Once upon a time", "The sea was", "Hi"]
    checks, worst = [], 0.0
    start = time.perf_counter()
    for kw in ({}, {"temperature": 0.9, "top_p": 0.95, "seed": 7}):
        for steer in steers:
            got = fast.generate(prompts, steer, max_new_tokens=24, stop_at_eos=False, **kw)
            want = eager.generate(prompts, steer, max_new_tokens=24, stop_at_eos=False, **kw)
            checks.append(got.tokens == want.tokens)
            if got.tokens == want.tokens:
                worst = max(worst, max(abs(a - b) for g, w in zip(got.logprobs, want.logprobs)
                                       for a, b in zip(g, w)))  # fmt: skip
    RESULTS["tiny_explain"] = [fast.explain(prompts, steer) for steer in steers]
    RESULTS["tiny_equal"] = checks
    RESULTS["tiny_max_logprob_diff"] = worst
    RESULTS["tiny_seconds_incl_compile"] = time.perf_counter() - start
    RESULTS["tiny_mode"] = fast.engine.compiled.mode
    save()


def bandwidth() -> float:
    """Bytes a device-to-device copy moves per second, reads and writes counted."""
    x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    y.copy_(x)
    seconds = timed(lambda: y.copy_(x), 10)
    return 2 * x.numel() / seconds


def gpt2(batches: tuple[int, ...] = (1, 8, 64), new: int = 128) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                        bos_token_id=0, eos_token_id=1, pad_token_id=2)  # fmt: skip
    model = GPT2LMHeadModel(config).cuda().eval()
    tok = char_tokenizer()
    lm, eager = wrap(model, tok).compile(), wrap(model, tok)
    steer = sl.Steer("blocks.6.hook_resid_pre", torch.randn(768), alpha=4.0, positions="generated")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    rate = bandwidth()
    RESULTS["gpt2_weight_bytes"], RESULTS["copy_bytes_per_s"] = weights, rate
    # each decode step reads every weight once at least (the tied embedding once): the floor
    RESULTS["gpt2_floor_s_per_token"] = weights / rate
    for batch in batches:
        prompts = [PROMPT] * batch
        ids = torch.tensor([tok(PROMPT)["input_ids"]] * batch, device="cuda")
        row: dict[str, object] = {}

        def ours(p=prompts):
            return lm.generate(p, steer, max_new_tokens=new, stop_at_eos=False)

        start = time.perf_counter()
        first = ours()
        row["ours_first_call_s"] = time.perf_counter() - start
        want = eager.generate(prompts, steer, max_new_tokens=new, stop_at_eos=False)
        row["greedy_equal_eager"] = first.tokens == want.tokens
        row["ours_s"] = timed(ours)
        row["ours_over_floor"] = row["ours_s"] / (new * weights / rate)
        row["eager_steerlab_s"] = timed(
            lambda p=prompts: eager.generate(p, steer, max_new_tokens=new, stop_at_eos=False), 1
        )

        def hf(static: bool, ids=ids):
            kw = {"cache_implementation": "static"} if static else {}
            with torch.inference_mode():
                return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                      min_new_tokens=new, do_sample=False, pad_token_id=2, **kw)  # fmt: skip

        hf(False)
        row["hf_dynamic_s"] = timed(lambda: hf(False))
        RESULTS[f"gpt2_b{batch}"] = row
        save()
        start = time.perf_counter()
        hf(True)
        row["hf_static_first_call_s"] = time.perf_counter() - start
        hf(True)
        row["hf_static_compiled_s"] = timed(lambda: hf(True))
        save()


def reads(batch: int = 8, new: int = 128) -> None:
    """A conditioned steer against the unconditioned one (compiled), and a monitor's cost
    (eager; the compiled step runs monitors eagerly), at batch 8."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                        bos_token_id=0, eos_token_id=1, pad_token_id=2)  # fmt: skip
    model = GPT2LMHeadModel(config).cuda().eval()
    tok = char_tokenizer()
    lm, eager = wrap(model, tok).compile(), wrap(model, tok)
    v, c = torch.randn(768), torch.randn(768)
    plain = sl.Steer("blocks.6.hook_resid_pre", v, 4.0, positions="generated")
    cond = sl.Condition("blocks.3.hook_resid_post", c, threshold=0.0, score="projection")
    gated = sl.Steer("blocks.6.hook_resid_pre", v, 4.0, positions="generated", when=cond)
    prompts = [PROMPT * (1 + i % 2) for i in range(batch)]
    row: dict[str, object] = {"explain": lm.explain(prompts, gated)}

    def gen(model: SteerableModel, steer: sl.Steer, **kw: object) -> object:
        return model.generate(prompts, steer, max_new_tokens=new, stop_at_eos=False, **kw)

    gen(lm, gated), gen(lm, plain)  # compile both specs' graphs
    row["compiled_conditioned_s"] = timed(lambda: gen(lm, gated))
    row["compiled_plain_s"] = timed(lambda: gen(lm, plain))
    monitor = {"m": ("blocks.3.hook_resid_post", c)}
    gen(eager, plain, monitor=monitor)
    row["eager_monitor_s"] = timed(lambda: gen(eager, plain, monitor=monitor))
    row["eager_plain_s"] = timed(lambda: gen(eager, plain))
    RESULTS["reads_b8"] = row
    save()


if __name__ == "__main__":
    exactness()
    gpt2()
    reads()
