"""vLLM's logit adjustments (repetition, frequency and presence penalties, logit_bias,
min_tokens), checked against definitions steerlab did not write: HF's logits processors,
OpenAI's formula by hand, and HF ``generate`` end to end. The engine parity suite
(``engine_parity.check_penalties``) runs them on every engine, vLLM included."""

from __future__ import annotations

import pytest
import torch
from engine_parity import ENDS_EARLY, PENALTIES, prompt_ids
from reference import RefPenalties, greedy
from transformers import (
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

import steerlab as sl
from steerlab.core.errors import SamplingError
from steerlab.core.sampling import adjust_logits
from steerlab.engine import Request, Sampling
from steerlab.engine.progress import last
from steerlab.testing import FakeBackend, char_tokenizer

VOCAB = 12
EOS = {3, 7}


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


# --- the function against its definitions -------------------------------------------------


def test_repetition_penalty_is_hfs_over_prompt_and_output():
    logits = _logits(3)
    prompt, output = [0, 1, 1, 5], [5, 9, 2, 9]
    for p in (1.3, 0.7):
        got = adjust_logits(logits, [Sampling(repetition_penalty=p)] * 3, [prompt] * 3,
                            [output] * 3, EOS)  # fmt: skip
        ids = torch.tensor([prompt + output] * 3)
        want = RepetitionPenaltyLogitsProcessor(p)(ids, logits.clone())
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)  # vLLM: x * (1/p), HF: x / p
        untouched = [t for t in range(VOCAB) if t not in prompt + output]
        assert torch.equal(got[:, untouched], logits[:, untouched])


def test_frequency_and_presence_penalties_follow_openais_formula_on_the_output_only():
    logits = torch.zeros(1, 5)
    got = adjust_logits(logits, [Sampling(frequency_penalty=0.5, presence_penalty=0.25)],
                        [[0, 4, 4]], [[1, 1, 2, 1]], EOS)  # fmt: skip
    # token 1: 3 times -> -(3 * 0.5 + 0.25); token 2: once -> -(0.5 + 0.25); prompt ids untouched
    assert got.tolist() == [[0.0, -1.75, -0.75, 0.0, 0.0]]
    negative = adjust_logits(logits, [Sampling(frequency_penalty=-2.0, presence_penalty=-1.0)],
                             [[]], [[3, 3]], EOS)  # fmt: skip
    assert negative.tolist() == [[0.0, 0.0, 0.0, 5.0, 0.0]]


def test_logit_bias_is_added_as_hfs_sequence_bias_with_one_token_sequences():
    logits = _logits(2)
    bias = ((2, -100.0), (6, 7.5), (11, 100.0))
    got = adjust_logits(logits, [Sampling(logit_bias=bias)] * 2, [[0]] * 2, [[]] * 2, EOS)
    hf = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias])
    assert torch.equal(got, hf(torch.tensor([[0], [0]]), logits.clone()))


def test_min_tokens_bans_eos_as_hfs_min_new_tokens_until_the_output_is_long_enough():
    logits = _logits(1)
    for n_out in range(5):
        output = [0] * n_out
        got = adjust_logits(logits, [Sampling(max_new_tokens=9, min_tokens=3)], [[1, 2]],
                            [output], EOS)  # fmt: skip
        hf = MinNewTokensLengthLogitsProcessor(2, 3, sorted(EOS))
        assert torch.equal(got, hf(torch.tensor([[1, 2, *output]]), logits.clone()))
        assert bool(torch.isneginf(got[0, sorted(EOS)]).all()) == (n_out < 3)


def test_the_order_is_vllms_bias_before_penalties():
    logits = torch.zeros(1, VOCAB)
    logits[0, 0] = 1.0
    got = adjust_logits(logits, [Sampling(repetition_penalty=2.0, logit_bias=((0, -3.0),))],
                        [[0]], [[]], EOS)  # fmt: skip
    assert got[0, 0].item() == -4.0  # (1 - 3) * 2; the other order gives 1 / 2 - 3 = -2.5
    banned = adjust_logits(logits, [Sampling(max_new_tokens=2, min_tokens=2, logit_bias=(
        (3, 50.0),), frequency_penalty=-2.0)], [[]], [[3]], EOS)  # fmt: skip
    assert banned[0, 3].item() == float("-inf")  # no bias or penalty brings a banned EOS back


def test_rows_adjust_by_their_own_settings_and_default_rows_stay_bit_identical():
    logits = _logits(3, seed=1).to(torch.bfloat16)
    settings = [Sampling(), Sampling(presence_penalty=1.0), Sampling(logit_bias=((4, 2.0),))]
    got = adjust_logits(logits, settings, [[1]] * 3, [[2, 2]] * 3, EOS)
    assert got.dtype == torch.float32  # vLLM adjusts in float32
    assert torch.equal(got[0], logits[0].float())
    for i in (1, 2):
        alone = adjust_logits(logits[i : i + 1], settings[i : i + 1], [[1]], [[2, 2]], EOS)
        assert torch.equal(got[i], alone[0])
    plain = _logits(2)
    assert adjust_logits(plain, [Sampling()] * 2, [[1]] * 2, [[]] * 2, EOS) is plain


# --- Sampling refuses bad values, naming the field --------------------------------------------


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": -1.0}, "repetition_penalty"),
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"repetition_penalty": True}, "repetition_penalty"),
        ({"frequency_penalty": 2.5}, "frequency_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"presence_penalty": -2.01}, "presence_penalty"),
        ({"presence_penalty": False}, "presence_penalty"),
        ({"logit_bias": ((5, 100.5),)}, "logit_bias"),
        ({"logit_bias": ((5, True),)}, "logit_bias"),
        ({"logit_bias": ((-1, 1.0),)}, "logit_bias"),
        ({"logit_bias": ((True, 1.0),)}, "logit_bias"),
        ({"logit_bias": ((5, 1.0), (5, 2.0))}, "logit_bias"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 2.0}, "min_tokens"),
        ({"min_tokens": True}, "min_tokens"),
        ({"max_new_tokens": 4, "min_tokens": 5}, "min_tokens"),
    ],
)
def test_bad_values_raise_naming_the_field(settings, field):
    with pytest.raises(SamplingError, match=field) as error:
        Sampling(**settings)
    assert error.value.field == field
    assert isinstance(error.value, ValueError)


def test_biases_take_json_keys_and_refuse_others():
    assert Sampling.biases({"17": -1, 3: 2.5}) == ((3, 2.5), (17, -1))
    assert Sampling.biases(None) == ()
    for bad in ({"x": 1.0}, {"-3": 1.0}, {1.5: 1.0}, [(1, 2.0)]):
        with pytest.raises(SamplingError, match="logit_bias"):
            Sampling.biases(bad)  # type: ignore[arg-type]


def test_bad_settings_and_out_of_vocab_ids_fail_before_any_compute():
    backend = FakeBackend()
    lm = sl.SteerableModel(backend, char_tokenizer())
    with pytest.raises(SamplingError, match=r"vocabulary \[0, 98\): \[98, 500\]"):
        lm.generate("ab", max_new_tokens=3, logit_bias={98: 1.0, 500: 2.0, 5: 1.0})
    with pytest.raises(SamplingError, match="min_tokens"):
        lm.generate("ab", max_new_tokens=3, min_tokens=4)
    with pytest.raises(SamplingError, match="repetition_penalty"):
        lm.generate("ab", max_new_tokens=3, repetition_penalty=0)
    assert backend.forwards == [] and lm.hook_count() == 0


# --- end to end on steerlab-tiny ----------------------------------------------------------------


@pytest.mark.slow  # the reference decodes without a cache
def test_the_suite_penalizes_for_real(toy_lm, toy_hf):
    """Each row of the parity suite's settings changes the reference's own greedy tokens."""
    for p, case, settings in PENALTIES:
        if not settings or case:
            continue
        ids = list(prompt_ids(toy_lm, p))
        ref = RefPenalties(settings.get("repetition_penalty", 1.0),
                           settings.get("frequency_penalty", 0.0),
                           settings.get("presence_penalty", 0.0), settings.get("logit_bias", ()),
                           settings.get("min_tokens", 0), (1,))  # fmt: skip
        assert greedy(toy_hf, ids, [], 30, {1}, ref) != greedy(toy_hf, ids, [], 30, {1}), settings


def _hf_generate(hf, ids, new, **options) -> list[int]:
    out = hf.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, pad_token_id=2,
                      **options)[0, len(ids) :].tolist()  # fmt: skip
    return out[: out.index(1)] if 1 in out else out  # up to EOS (id 1), as steerlab reports


@pytest.mark.parametrize("penalty", [1.5, 0.8])
def test_greedy_repetition_penalty_equals_hf_generate(toy_lm, toy_hf, penalty):
    for text in ("Once upon a time", "The happy fox"):
        got = toy_lm.generate(text, max_new_tokens=40, repetition_penalty=penalty)
        ids = list(prompt_ids(toy_lm, text))
        assert got.tokens[0] == _hf_generate(toy_hf, ids, 40, repetition_penalty=penalty)
        assert got.tokens[0] != toy_lm.generate(text, max_new_tokens=40).tokens[0]


def test_min_tokens_equals_hf_min_new_tokens_where_eos_would_come_early(toy_lm, toy_hf):
    ids = list(prompt_ids(toy_lm, ENDS_EARLY))
    plain = toy_lm.generate(ENDS_EARLY, max_new_tokens=40)
    assert plain.finish_reasons == ["eos"] and len(plain.tokens[0]) == 23
    got = toy_lm.generate(ENDS_EARLY, max_new_tokens=40, min_tokens=30)
    assert got.tokens[0] == _hf_generate(toy_hf, ids, 40, min_new_tokens=30)
    assert len(got.tokens[0]) >= 30 and got.tokens[0][:23] == plain.tokens[0]


def test_logit_bias_forces_a_token_and_logprobs_stay_the_models_own(toy_lm, toy_hf):
    ids = list(prompt_ids(toy_lm, "Once upon a time"))
    forced = 262
    got = toy_lm.engine.run([Request(tuple(ids), sampling=Sampling(
        max_new_tokens=5, logit_bias=((forced, 100.0),), logprobs=0))])[0]  # fmt: skip
    assert got.tokens == [forced] * 5
    assert got.tokens == _hf_generate(toy_hf, ids, 5, sequence_bias=[[[forced], 100.0]])
    with torch.inference_mode():  # the raw model's log-probability of each forced token
        raw = toy_hf(torch.tensor([ids + got.tokens])).logits[0, len(ids) - 1 : -1]
    want = raw.log_softmax(-1)[:, forced]
    assert got.logprobs == pytest.approx(want.tolist(), abs=1e-5)
    assert max(got.logprobs) < -1.0  # far from the certainty the bias gave it


def test_batched_rows_with_different_settings_equal_each_alone(toy_lm):
    from engine_parity import penalty_requests

    requests = penalty_requests(toy_lm)
    together = [c.tokens for c in toy_lm.engine.run(requests)]
    assert together == [toy_lm.engine.run([r])[0].tokens for r in requests]


def test_sampled_rows_draw_from_the_adjusted_distribution(toy_lm):
    """At temperature 1 with a fixed seed, a bias of -100 on every token the plain row drew
    keeps them all out of the biased row."""
    plain = toy_lm.generate("Once upon a time", max_new_tokens=12, temperature=1.0, seed=3)
    ban = {t: -100.0 for t in plain.tokens[0]}
    banned = toy_lm.generate("Once upon a time", max_new_tokens=12, temperature=1.0, seed=3,
                             logit_bias=ban)  # fmt: skip
    assert not set(banned.tokens[0]) & set(ban)


def test_the_prompt_of_a_continued_cache_counts_for_the_repetition_penalty(toy_lm):
    """Continuing a cache is feeding its tokens again: the penalty sees the whole prompt."""
    ids = prompt_ids(toy_lm, "Once upon a time, there was a little cat")
    head, tail = ids[:6], ids[6:]
    sampling = Sampling(max_new_tokens=12, repetition_penalty=1.6)
    whole = toy_lm.engine.run([Request(ids, sampling=sampling)])[0].tokens
    cache = toy_lm.engine.prefill([Request(head)])
    continued = last(toy_lm.engine.stream([Request(tail, sampling=sampling)], cache=cache))
    assert continued.states.tokens[0] == whole


def test_stop_strings_do_not_match_within_the_first_min_tokens():
    """vLLM's stop checker skips the first ``min_tokens`` tokens' text: a stop string there
    neither ends the row nor cuts the text; the first one that ends after it does."""
    text = "Once upon a time"
    lm = sl.load("steerlab-tiny", backend="hf")
    plain = lm.generate(text, max_new_tokens=30, stop=".")
    assert plain.finish_reasons == ["stop"] and "." not in plain.text[0]
    n = len(plain.tokens[0])  # the row ended on the token that completed the first "."
    held = lm.generate(text, max_new_tokens=30, stop=".", min_tokens=n + 1)
    full = lm.generate(text, max_new_tokens=30, stop_at_eos=False).text[0]
    assert held.finish_reasons == ["stop"] and len(held.tokens[0]) > n
    assert held.text[0] == full[: full.index(".", len(plain.text[0]) + 1)]
    assert held.text[0].count(".") == 1  # the first "." is kept, the second cuts


def test_chat_turns_take_the_penalties_over_the_whole_conversation(toy_lm, toy_hf):
    """A second turn reuses the first's KV cache; its repetition penalty still sees every
    token of the conversation, as HF ``generate`` on the whole conversation does."""
    chat = toy_lm.chat()
    chat.say("Tell me a story.", max_new_tokens=16)
    reply = chat.say("Another one.", max_new_tokens=16, repetition_penalty=1.5, min_tokens=12)
    fresh = toy_lm.generate([chat.history[:-1]], chat=True, max_new_tokens=16,
                            repetition_penalty=1.5, min_tokens=12)  # fmt: skip
    assert reply.tokens == fresh.tokens
    want = _hf_generate(toy_hf, fresh.prompt_tokens[0], 16, repetition_penalty=1.5,
                        min_new_tokens=12)  # fmt: skip
    assert reply.tokens[0] == want and len(want) >= 12
    plain = toy_lm.generate([chat.history[:-1]], chat=True, max_new_tokens=16)
    assert plain.tokens != reply.tokens  # the settings changed the reply
    with pytest.raises(SamplingError, match="repetition_penalty"):
        chat.say("Again.", repetition_penalty=0.0)
    assert len(chat.history) == 4  # the refused turn left the conversation as it was
