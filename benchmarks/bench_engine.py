"""Engine speed as ratios against baselines measured in the same run.

Model: a GPT-2-small-shaped random model (12 layers, d_model 768, vocab 50257),
32-token prompt, 32 new tokens, greedy, fixed length. Each timing is the median of
``REPEATS`` runs, interleaved with its baseline so machine load hits both alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

import steerlab as sl
from steerlab.testing import char_tokenizer

REPEATS = 3
NEW = 32
BACKEND_NEW = 16  # the our-loop-vs-each-backend rows
PROMPT = "The quick brown fox jumps over a"  # 32 characters + BOS with the char tokenizer


def _median_pair(ours: Callable[[], object], base: Callable[[], object],
                 warm: bool = True) -> tuple[float, float]:  # fmt: skip
    if warm:  # a first call of each (lazy set-up, allocator growth) is left out
        ours(), base()
    t_ours, t_base = [], []
    for _ in range(REPEATS):
        for fn, times in ((ours, t_ours), (base, t_base)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(t_ours), statistics.median(t_base)


def _gpt2_small() -> tuple[torch.nn.Module, object]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024,
                        bos_token_id=0, eos_token_id=1, pad_token_id=2)  # fmt: skip
    return GPT2LMHeadModel(config).eval(), char_tokenizer()


def run(backends: bool = True) -> list[dict[str, object]]:
    torch.set_num_threads(torch.get_num_threads())
    model, tokenizer = _gpt2_small()
    lm = sl.wrap(model, tokenizer)
    steer = sl.Steer("blocks.6.hook_resid_pre", torch.randn(768), alpha=4.0, positions="generated")
    rows: list[dict[str, object]] = []

    def record(name: str, target: str, ours: float, base: float, speed: bool = True) -> None:
        ratio = base / ours if speed else ours / base
        rows.append(dict(comparison=name, ours_s=ours, baseline_s=base, ratio=ratio, target=target))
        print(
            f"{name:<58} ours {ours:7.2f}s  baseline {base:7.2f}s  ratio {ratio:5.2f}  ({target})"
        )

    for batch in (1, 8):
        prompts = [PROMPT] * batch
        ids = torch.tensor([tokenizer(PROMPT)["input_ids"]] * batch)

        def hf_generate(ids=ids):
            with torch.inference_mode():
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                               min_new_tokens=NEW, do_sample=False, pad_token_id=2)  # fmt: skip

        def steered(prompts=prompts):
            lm.generate(prompts, steer, max_new_tokens=NEW, stop_at_eos=False)

        ours, base = _median_pair(steered, hf_generate)
        record(f"steered decode, batch {batch} (speed vs HF generate)", ">=0.97x", ours, base)

    grid = sl.Steer("blocks.6.hook_resid_pre", steer.vector, alpha=[0.0, 2.0, 4.0, 8.0])
    sequential = [sl.Steer("blocks.6.hook_resid_pre", steer.vector, alpha=a) for a in grid.alpha]
    ours, base = _median_pair(  # the model is warm from the rows above
        lambda: lm.generate(PROMPT, grid, max_new_tokens=NEW, stop_at_eos=False),
        lambda: [lm.generate(PROMPT, s, max_new_tokens=NEW, stop_at_eos=False) for s in sequential],
        warm=False,
    )
    record("baseline + 3 alphas in one batch (time vs 4 sequential runs)", "<=0.4x", ours, base,
           speed=False)  # fmt: skip

    ours, base = _median_pair(
        lambda: lm.generate(PROMPT, steer, max_new_tokens=NEW, stop_at_eos=False),
        lambda: lm.generate(
            PROMPT, steer, max_new_tokens=NEW, stop_at_eos=False, use_cache=False
        ),  # fmt: skip
        warm=False,
    )
    record(f"KV cache vs recompute-everything loop, {NEW} new (speed)", "report", ours, base)
    ours, base = _median_pair(lambda: _ragged(lm, steer, True), lambda: _ragged(lm, steer, False),
                              warm=False)  # fmt: skip
    record(f"batch 8, half stop at 8 / half at {NEW}: compaction (speed)", "report", ours, base)
    if backends:  # needs TransformerLens for the hooked and bridge rows
        rows += _backends(model)
    return rows


def _ragged(lm: sl.SteerableModel, steer: sl.Steer, compact: bool) -> None:
    """Eight rows, four of which stop after 8 tokens: with and without dropping them."""
    from steerlab.engine import Request, Sampling, Steer

    ids = tuple(lm.tokenizer(PROMPT)["input_ids"])
    row_steer = (Steer.of(steer, steer.alpha[0]),)
    requests = [
        Request(
            ids, row_steer, Sampling(max_new_tokens=8 if i % 2 else NEW, stop_at_eos=False), str(i)
        )  # fmt: skip
        for i in range(8)
    ]
    lm.engine.run(requests, compact=compact)


def _backends(model: torch.nn.Module) -> list[dict[str, object]]:
    """Our unsteered loop against each backend's own generate, ``BACKEND_NEW`` tokens (the
    HookedTransformer runs about 4x slower than HF's model on CPU, whichever loop drives it)."""
    import tempfile

    from transformers import AutoTokenizer

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        char_tokenizer().save_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
        for backend in ("hf", "hooked", "bridge"):
            lm = sl.load(folder, backend=backend)
            native = _native_generate(lm, ids)
            ours, base = _median_pair(
                lambda lm=lm: lm.generate(PROMPT, max_new_tokens=BACKEND_NEW, stop_at_eos=False),
                native,
            )
            ratio = base / ours
            name = f"our loop vs {backend}'s own generate (speed)"
            print(
                f"{name:<58} ours {ours:7.2f}s  baseline {base:7.2f}s  ratio {ratio:5.2f}  (>=1.0x)"
            )
            rows.append(dict(comparison=name, ours_s=ours, baseline_s=base, ratio=ratio,
                             target=">=1.0x"))  # fmt: skip
    return rows


def _native_generate(lm: sl.SteerableModel, ids: torch.Tensor) -> Callable[[], object]:
    model = lm.model
    if lm.backend.kind == "hf":
        return lambda: model.generate(ids, attention_mask=torch.ones_like(ids),
                                      max_new_tokens=BACKEND_NEW, min_new_tokens=BACKEND_NEW,
                                      do_sample=False, pad_token_id=2)  # fmt: skip
    return lambda: model.generate(ids, max_new_tokens=BACKEND_NEW, do_sample=False, stop_at_eos=False,
                                  use_past_kv_cache=True, verbose=False)  # fmt: skip


if __name__ == "__main__":
    run()
