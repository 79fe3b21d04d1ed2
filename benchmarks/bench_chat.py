"""Chat sessions and shared prompts, as ratios measured in one run.

Model: a GPT-2-small-shaped random model (12 layers, d_model 768, vocab 50257) with the
character tokenizer and a ChatML-style template. A 700-token system prompt, then 4 turns
of a 60-token user message and 60 generated tokens (fixed length):

- a session (each turn feeds what it adds) against recomputing the whole conversation
  with ``lm.generate(conversation, chat=True)`` at each turn: time overall and at turn 4,
  and peak memory (each side in a fresh process: peak RSS over the RSS after loading);
- ``positions="generated"`` over 8 alphas on a 500-token prompt: the prompt fed once and
  the cache repeated, against every row feeding it.

    .venv/bin/python benchmarks/bench_chat.py      # appends its section to RESULTS.md
"""

from __future__ import annotations

import multiprocessing
import resource
import sys
import time
from pathlib import Path

import torch

import steerlab as sl
from steerlab.testing import char_tokenizer

TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
SYSTEM = ("You are a careful assistant who answers briefly and kindly. " * 12)[:690]
USER = [f"Tell me about the sea and its tides, please, in a few words: {i}." for i in range(4)]
NEW = 30
SECTION = "## Chat sessions and shared prompts"


def model() -> sl.SteerableModel:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=2048,
                        bos_token_id=0, eos_token_id=1, pad_token_id=2)  # fmt: skip
    tokenizer = char_tokenizer()
    tokenizer.chat_template = TEMPLATE
    return sl.wrap(GPT2LMHeadModel(config).eval(), tokenizer)


def conversation(lm: sl.SteerableModel, session: bool) -> tuple[list[float], list[float]]:
    """Seconds per turn and to each turn's first token, with a session or recomputing the
    whole conversation each turn."""
    chat = lm.chat(system=SYSTEM) if session else None
    history = [{"role": "system", "content": SYSTEM}]
    times, first = [], []
    for message in USER:
        start = time.perf_counter()
        firsts: list[float] = []

        def on_token(step: object, firsts: list[float] = firsts, start: float = start) -> None:
            if not firsts:
                firsts.append(time.perf_counter() - start)

        options = dict(max_new_tokens=NEW, stop_at_eos=False, on_token=on_token)
        if chat is not None:
            reply = chat.say(message, **options).text[0]  # type: ignore[arg-type]
        else:
            history.append({"role": "user", "content": message})
            reply = lm.generate(history, chat=True, **options).text[0]  # type: ignore[arg-type]
        times.append(time.perf_counter() - start)
        first.append(firsts[0])
        history.append({"role": "assistant", "content": reply})
    return times, first


def _measure(session: bool, out: multiprocessing.Queue) -> None:
    torch.set_num_threads(1)
    lm = model()
    lm.generate("warm up", max_new_tokens=2)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times, first = conversation(lm, session)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB on Linux
    out.put((times, first, peak / 1024))


def in_fresh_process(session: bool) -> tuple[list[float], list[float], float]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_measure, args=(session, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def sweep_rows(lm: sl.SteerableModel) -> tuple[float, float, bool]:
    """Seconds for 8 alphas on a 500-token prompt, shared and not; and whether they agree."""
    prompt = ("The sea was calm and the boat drifted along the shore. " * 10)[:499]
    vector = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(0))
    steer = sl.Steer("blocks.6.hook_resid_pre", vector, alpha=[float(a) for a in range(-4, 4)],
                     positions="generated")  # fmt: skip
    outs, seconds = [], []
    for shared in (True, False):
        lm.engine.share_prefix = shared
        start = time.perf_counter()
        outs.append(lm.generate(prompt, steer, max_new_tokens=16, stop_at_eos=False).tokens)
        seconds.append(time.perf_counter() - start)
    lm.engine.share_prefix = True
    return seconds[0], seconds[1], outs[0] == outs[1]


def main() -> list[str]:
    ours, our_first, our_peak = in_fresh_process(session=True)
    base, base_first, base_peak = in_fresh_process(session=False)
    torch.set_num_threads(1)
    lm = model()
    lm.generate("warm up", max_new_tokens=2)
    shared, alone, same = sweep_rows(lm)
    lines = [
        SECTION,
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        f"`benchmarks/bench_chat.py` (1 CPU thread, torch {torch.__version__}, one run each "
        "on a shared machine). GPT-2-small-shaped random model; 700-token system prompt, 4 "
        f"turns of 60 user + {NEW} generated tokens.",
        "",
        "| comparison | ours | baseline | ratio | target |",
        "|---|---|---|---|---|",
        f"| session vs recompute each turn, all 4 turns (time) | {sum(ours):.2f} s | "
        f"{sum(base):.2f} s | {sum(ours) / sum(base):.2f}x | report |",
        f"| session vs recompute, turn 4 alone (time) | {ours[-1]:.2f} s | {base[-1]:.2f} s | "
        f"{ours[-1] / base[-1]:.2f}x | <=0.5x |",
        f"| session vs recompute, turn 4 time to first token | {our_first[-1]:.2f} s | "
        f"{base_first[-1]:.2f} s | {our_first[-1] / base_first[-1]:.2f}x | report |",
        f"| peak memory over the loaded model | {our_peak:.0f} MiB | {base_peak:.0f} MiB | "
        f"{our_peak / max(base_peak, 1e-9):.2f}x | report |",
        f"| 8 alphas, positions='generated', 500-token prompt: prompt shared vs fed per row "
        f"(time) | {shared:.2f} s | {alone:.2f} s | {shared / alone:.2f}x | report |",
        "",
        f"Per turn (s), session: {', '.join(f'{t:.2f}' for t in ours)}; recompute: "
        f"{', '.join(f'{t:.2f}' for t in base)}. Shared and unshared sweep rows give the same "
        f"tokens: {same}. The session's system prompt is fed once by `lm.chat`, before the "
        "timed turns; the turn-4 rows do not depend on that.",
    ]
    print("\n".join(lines))
    return lines


def append(lines: list[str], path: Path = Path(__file__).parent / "RESULTS.md") -> None:
    """Replace this benchmark's section of ``RESULTS.md`` (or add it at the end)."""
    from sections import replace_section

    replace_section(lines, path)


if __name__ == "__main__":
    append(main())
    sys.exit(0)
