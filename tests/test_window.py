"""A text far past the context window is refused before it is tokenized, and the bound that
decides it never exceeds the tokens a real tokenizer produces."""

from __future__ import annotations

import random

import pytest
from server_helpers import post, served
from transformers import AutoTokenizer

import steerlab as sl
from steerlab.core.errors import ContextError
from steerlab.core.window import least_tokens, longest_token
from steerlab.testing import char_tokenizer
from steerlab.toy import asset_path

BIG = "The fox was happy. " * 450_000  # 8.5 MB


def _texts() -> list[str]:
    rng = random.Random(0)
    words = ["happy", "fox", "Ünïcödé", "naïve", "日本語", "🦊", "a" * 40, "\t", "\n\n", "   "]
    out = ["", " " * 500, "x" * 3000, "é" * 1000, "e\u0301" * 500]
    out += [" ".join(rng.choice(words) for _ in range(rng.randint(50, 900))) for _ in range(20)]
    return out


@pytest.mark.parametrize("tokenizer", ["steerlab-tiny", "char", "gpt2-like"])
def test_the_bound_never_exceeds_a_real_tokenizers_count(tokenizer, tiny_dirs):
    tok = {"steerlab-tiny": lambda: AutoTokenizer.from_pretrained(asset_path("steerlab-tiny")),
           "char": char_tokenizer,
           "gpt2-like": lambda: AutoTokenizer.from_pretrained(tiny_dirs["gpt2"])}[tokenizer]()  # fmt: skip
    assert longest_token(tok) >= 1
    for text in _texts():
        real = len(tok(text, add_special_tokens=False)["input_ids"])
        assert least_tokens(tok, text) <= real, text[:40]


def test_generate_refuses_an_8_mb_prompt_without_tokenizing_it(toy_lm, monkeypatch):
    def untouchable(*args, **kwargs):
        raise AssertionError("the tokenizer ran on a prompt that could never fit")

    monkeypatch.setattr(type(toy_lm.tokenizer), "__call__", untouchable)
    with pytest.raises(ContextError, match=r"Prompt 0 has 8550000 characters.*refused before"):
        toy_lm.generate(BIG, max_new_tokens=4)
    with pytest.raises(ContextError, match="refused before"):
        toy_lm.generate([[{"role": "user", "content": BIG}]], chat=True, max_new_tokens=4)
    assert toy_lm.hook_count() == 0


def test_a_long_prompt_that_may_fit_is_tokenized_and_judged_by_its_tokens(toy_lm):
    text = "The fox was happy and smiled. " * 12  # 360 characters, past 2 x 128: counted
    with pytest.raises(ContextError, match="prompt tokens") as error:
        toy_lm.generate(text * 4, max_new_tokens=4)
    assert "refused before" not in str(error.value)  # the count could not rule it out
    assert toy_lm.generate("The fox was happy. " * 5, max_new_tokens=4).tokens[0]


def test_the_server_refuses_an_8_mb_prompt_with_a_400(toy_lm):
    big_body_limit = sl.server.Limits(max_body_bytes=16 << 20)
    with served(toy_lm, limits=big_body_limit) as url:
        reply = post(url, "/v1/completions", {"model": "steerlab-tiny", "prompt": BIG,
                                              "max_tokens": 4})  # fmt: skip
        assert reply.status_code == 400
        assert "refused before tokenizing" in reply.json()["error"]["message"]
        ok = post(url, "/v1/completions", {"model": "steerlab-tiny", "prompt": "Once",
                                           "max_tokens": 4})  # fmt: skip
        assert ok.status_code == 200
