"""Scoring through ``/v1/completions`` (issue 21, section 1): token-id prompts, ``echo``,
``logprobs: N`` and ``max_tokens: 0``, against plain transformers log-probabilities, steered
with a plain PyTorch hook too."""

from __future__ import annotations

import math

import pytest
import torch
from server_helpers import post, served

SITE, LAYER, ALPHA = "blocks.2.hook_resid_pre", 2, 4.0


@pytest.fixture(scope="module")
def url(toy_lm):
    with served(toy_lm) as address:
        yield address


def direction() -> torch.Tensor:
    return torch.randn(128, generator=torch.Generator().manual_seed(7))


@torch.no_grad()
def hf_logprobs(hf, ids: list[int], steered: bool = False) -> torch.Tensor:
    """[len(ids), vocab] log-probabilities of plain transformers, a pre-hook adding
    ALPHA * v at block 2's input when ``steered``."""
    handle = None
    if steered:
        v = direction()

        def add(_module, args, kwargs):
            if args:
                return (args[0] + ALPHA * v, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + ALPHA * v}

        blocks = hf.model.layers if hasattr(hf, "model") else hf.transformer.h
        handle = blocks[LAYER].register_forward_pre_hook(add, with_kwargs=True)
    try:
        return hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    finally:
        if handle is not None:
            handle.remove()


@pytest.mark.parametrize("steered", [False, True])
def test_echo_with_max_tokens_0_scores_token_id_prompts_as_transformers_does(
    url, toy_hf, toy_lm, steered
):
    prompts = [toy_lm.tokenizer("Once upon a time")["input_ids"],
               toy_lm.tokenizer("The happy fox ran")["input_ids"]]  # fmt: skip
    body = {"model": "steerlab-tiny", "prompt": prompts, "max_tokens": 0, "echo": True,
            "logprobs": 3, "temperature": 0}  # fmt: skip
    if steered:
        body["steering"] = [{"site": SITE, "vector": direction().tolist(), "alpha": ALPHA}]
    response = post(url, "/v1/completions", body)
    assert response.status_code == 200, response.text
    for ids, choice in zip(prompts, response.json()["choices"]):
        want = hf_logprobs(toy_hf, ids, steered)
        got = choice["logprobs"]
        assert choice["token_ids"] == [] and got["token_logprobs"][0] is None
        assert len(got["tokens"]) == len(ids) == len(got["token_logprobs"])
        for t in range(1, len(ids)):
            assert got["token_logprobs"][t] == pytest.approx(float(want[t - 1, ids[t]]), abs=1e-4)
            top = want[t - 1].topk(3)
            names = [toy_lm.tokenizer.decode([int(i)]) for i in top.indices]
            assert set(got["top_logprobs"][t]) >= set(names)
            for name, value in zip(names, top.values.tolist()):
                assert got["top_logprobs"][t][name] == pytest.approx(value, abs=1e-4)
        assert choice["text"] == toy_lm.tokenizer.decode(ids, skip_special_tokens=True)


def test_echo_with_one_new_token_is_what_lm_eval_reads(url, toy_hf, toy_lm):
    """lm-eval's loglikelihood request: token ids, max_tokens 1, logprobs 1, echo."""
    ids = toy_lm.tokenizer("Once upon a time, there was")["input_ids"]
    body = {"model": "steerlab-tiny", "prompt": [ids], "max_tokens": 1, "echo": True,
            "logprobs": 1, "temperature": 0, "seed": 1234}  # fmt: skip
    choice = post(url, "/v1/completions", body).json()["choices"][0]
    lp = choice["logprobs"]
    want = hf_logprobs(toy_hf, ids)
    assert len(lp["token_logprobs"]) == len(ids) + 1
    new = choice["token_ids"][0]
    assert new == int(want[-1].argmax())  # greedy
    assert lp["token_logprobs"][-1] == pytest.approx(float(want[-1, new]), abs=1e-4)
    for t in range(1, len(ids)):  # what lm-eval slices: [ctxlen:-1]
        assert lp["token_logprobs"][t] == pytest.approx(float(want[t - 1, ids[t]]), abs=1e-4)
        assert len(lp["top_logprobs"][t]) in (1, 2)  # N, or N + 1 with the chosen token


def test_text_prompts_echo_and_offsets(url, toy_lm):
    body = {"model": "steerlab-tiny", "prompt": "Once upon a time", "max_tokens": 0,
            "echo": True, "logprobs": 0}  # fmt: skip
    lp = post(url, "/v1/completions", body).json()["choices"][0]["logprobs"]
    assert lp["top_logprobs"] is None
    text = post(url, "/v1/completions", body).json()["choices"][0]["text"]
    assert text == "Once upon a time"  # the BOS token is in tokens, not in text
    ends = [*lp["text_offset"][1:], len(text)]
    pieces = [text[a:b] for a, b in zip(lp["text_offset"], ends)]
    assert pieces[0] == "" and "".join(pieces) == text and pieces[1:] == lp["tokens"][1:]
    assert all(v is None or (v <= 0 and math.isfinite(v)) for v in lp["token_logprobs"])


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"max_tokens": 0, "echo": False}, "max_tokens"),
        ({"logprobs": 2, "max_tokens": 5}, "logprobs"),
        ({"logprobs": 21}, "logprobs"),
        ({"prompt": [[1, 2], "text"]}, "prompt"),
        ({"prompt": [10**9]}, "prompt"),
        ({"echo": True, "stream": True}, "stream"),
    ],
)
def test_what_scoring_cannot_do_is_a_400_naming_the_field(url, change, param):
    body = {"model": "steerlab-tiny", "prompt": "Hi", "max_tokens": 1, **change}
    response = post(url, "/v1/completions", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
