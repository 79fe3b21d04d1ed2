"""Conditions (CAST) and monitors against references written without steerlab, shared by
every engine's tests: ``tests/test_conditions.py`` (in-process) and ``tests_vllm/`` (vLLM).

IBM's CAST is ``reference.cast_greedy`` (plain torch hooks at batch 1, deciding on its one
row); monitors are checked against plain transformers' hidden states of the steered text.
"""

from __future__ import annotations

import torch
from engine_parity import direction
from reference import RefCast, cast_greedy

import steerlab as sl

PROMPTS = [
    "Once upon a time",
    "The ship sailed across the sea",
    "In the dark forest",
    "The waves rolled onto the beach",
    "A fox ran between the trees",
    "The harbor was quiet",
    "The happy fox",
    "Deep in the woods, an owl",
]
NEW = 8
COND_LAYER, BEHAVE_LAYER = 1, 2


def ids(lm, text):
    return list(lm.tokenizer(text)["input_ids"])


def cast(threshold: float, compare: str = "above", mode: str = "mean") -> RefCast:
    return RefCast(COND_LAYER, direction(20), threshold, compare, BEHAVE_LAYER, direction(21),
                   8.0, mode)  # fmt: skip


def condition(ref: RefCast, read: str = "mean") -> sl.Condition:
    return sl.Condition(f"blocks.{ref.condition_layer}.hook_resid_pre", ref.condition,
                        threshold=ref.threshold, compare=ref.compare, read=read)  # fmt: skip


def steer_of(ref: RefCast, when) -> sl.Steer:
    return sl.Steer(f"blocks.{ref.behaviour_layer}.hook_resid_pre", ref.vector, ref.alpha,
                    positions="generated", when=when)  # fmt: skip


def median_threshold(lm, hf, mode: str = "mean") -> float:
    """A threshold between the 4th and 5th reference scores: half the rows fire."""
    scores = sorted(cast_greedy(hf, ids(lm, p), cast(0.0, mode=mode), 1, set())[2]
                    for p in PROMPTS)  # fmt: skip
    return (scores[3] + scores[4]) / 2


def check_cast_rows(lm, hf, mode: str, compare: str) -> None:
    """A batch of 8, half the rows firing, equals IBM's CAST row by row: decisions, scores
    (1e-5) and tokens."""
    ref = cast(median_threshold(lm, hf, mode), compare, mode)
    out = lm.generate(PROMPTS, steer=steer_of(ref, condition(ref, mode)), max_new_tokens=NEW,
                      stop_at_eos=False)  # fmt: skip
    wanted = [cast_greedy(hf, ids(lm, p), ref, NEW, set()) for p in PROMPTS]
    assert [w[1] for w in wanted].count(True) == 4  # mixed: half the rows fire
    assert out.fired.tolist() == [w[1] for w in wanted]
    torch.testing.assert_close(out.condition_scores, torch.tensor([w[2] for w in wanted]),
                               atol=1e-5, rtol=1e-4)  # fmt: skip
    assert out.tokens == [w[0] for w in wanted]
    assert lm.hook_count() == 0


def check_monitors_against_hf(lm, hf) -> None:
    """A monitor at ``blocks.1.hook_resid_post`` while steering ``blocks.1.hook_resid_pre``
    on generated tokens equals ``h·m/|m|`` of plain transformers' hidden state (block 1's
    output) over the steered text, the steer a plain pre-hook: prompt values at every
    prompt token, and new token t's value at position n - 1 + t."""
    v, m = direction(40), direction(41)
    site = "blocks.1.hook_resid_post"
    steer = sl.Steer("blocks.1.hook_resid_pre", v, 6.0, positions="generated")
    prompts = PROMPTS[:3]
    out = lm.generate(prompts, steer=steer, max_new_tokens=NEW, stop_at_eos=False,
                      monitor={"m": (site, m)})  # fmt: skip
    plain = lm.generate(prompts, steer=steer, max_new_tokens=NEW, stop_at_eos=False)
    assert out.tokens == plain.tokens  # monitors never change a token
    u = m / m.norm()
    trace = out.monitors["m"]
    for r, p in enumerate(prompts):
        prompt = ids(lm, p)
        n = len(prompt)

        def add(_module, args, n=n):
            h = args[0].clone()
            h[:, n:] += 6.0 * v
            return (h, *args[1:])

        handle = hf.transformer.h[1].register_forward_pre_hook(add)
        try:
            with torch.no_grad():
                hidden = hf(torch.tensor([prompt + out.tokens[r]]), output_hidden_states=True)
        finally:
            handle.remove()
        want = hidden.hidden_states[2][0] @ u  # block 1's output, [seq]
        torch.testing.assert_close(trace.prompt[r][~trace.prompt[r].isnan()], want[:n],
                                   atol=1e-4, rtol=1e-4)  # fmt: skip
        torch.testing.assert_close(trace.generated[r], want[n - 1 : n - 1 + NEW],
                                   atol=1e-4, rtol=1e-4)  # fmt: skip
    assert lm.hook_count() == 0
