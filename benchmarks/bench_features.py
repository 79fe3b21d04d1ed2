"""SAE features as steers: what a feature and a feature clamp cost against a plain vector.

Model: the GPT-2-small-shaped random model of ``bench_engine`` (12 layers, d_model 768),
with a random standard SAE of 16,384 features at ``blocks.6.hook_resid_pre`` (and the same
weights read as a topk SAE, k 32). 32-token prompt, 64 new tokens, greedy, every position
steered. Each timing is the median of ``REPEATS`` runs, interleaved with its baseline.

    .venv/bin/python benchmarks/bench_features.py     # rewrites its section of RESULTS.md
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from sections import table  # noqa: E402

import steerlab as sl  # noqa: E402
from steerlab.features import SAE  # noqa: E402

SECTION = "## SAE features as steers"
NEW = 32
D_SAE = 16384
SITE = "blocks.6.hook_resid_pre"


def random_sae(d_in: int, d_sae: int) -> SAE:
    generator = torch.Generator().manual_seed(0)
    W_dec = torch.randn(d_sae, d_in, generator=generator) / d_in**0.5
    return SAE(W_dec.T.contiguous(), W_dec, torch.zeros(d_sae), torch.zeros(d_in), SITE)


def run() -> list[dict[str, object]]:
    from bench_engine import PROMPT, _gpt2_small, _median_pair

    model, tokenizer = _gpt2_small()
    lm = sl.wrap(model, tokenizer)
    sae = random_sae(768, D_SAE)
    topk = replace(sae, architecture="topk", k=32)
    i = 123
    vector = sae.W_dec[i].clone()
    rows: list[dict[str, object]] = []

    def record(name: str, target: str, ours: float, base: float) -> None:
        ratio = ours / base
        rows.append(dict(comparison=name, ours_s=ours, baseline_s=base, ratio=ratio, target=target))
        print(f"{name:<62} ours {ours:6.2f}s  baseline {base:6.2f}s  time ratio {ratio:5.2f}")

    def timed(steer: object, batch: int):
        return lambda: lm.generate([PROMPT] * batch, steer, max_new_tokens=NEW, stop_at_eos=False)

    add = sl.Steer(SITE, vector, alpha=8.0)
    ours, base = _median_pair(timed(sl.Steer(SITE, sae.feature(i), alpha=8.0), 1), timed(add, 1))
    record("sae.feature(i) vs the same vector as a tensor, Add, batch 1", "1.00x", ours, base)
    for batch in (1, 8):
        ours, base = _median_pair(timed(sae.clamp(i, 10.0), batch), timed(add, batch))
        record(f"sae.clamp (standard, d_sae 16k) vs Add, batch {batch}", "report", ours, base)
    ours, base = _median_pair(timed(topk.clamp(i, 10.0), 1), timed(add, 1))
    record("topk clamp (reads all 16k features) vs Add, batch 1", "report", ours, base)
    return rows


def main() -> list[str]:
    rows = run()
    lines = [
        SECTION,
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        f"`benchmarks/bench_features.py` ({torch.get_num_threads()} CPU threads, torch "
        f"{torch.__version__}). GPT-2-small-shaped random model (d_model 768), a random SAE "
        f"of {D_SAE} features at `{SITE}`; {NEW} new tokens, every position steered. `ratio` is "
        "ours over the baseline's time (1.00 costs the same).",
        "",
        *table(rows),
        "",
        "A standard or jumprelu clamp carries only its feature's encoder column, so its cost "
        "does not grow with the SAE's width: two dot products per steered token. A topk "
        "feature depends on every feature, so a topk clamp multiplies each steered token by "
        "the whole encoder.",
    ]
    return lines


if __name__ == "__main__":
    from sections import replace_section

    replace_section(main())
