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
    # logprobs 0: each position lists the chosen token alone (N + 1 = 1), as vLLM does
    assert lp["top_logprobs"][0] is None
    assert all(list(top) == [tok] for top, tok in zip(lp["top_logprobs"][1:], lp["tokens"][1:]))
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
        ({"logprobs": 21}, "logprobs"),
        ({"prompt": [[1, 2], "text"]}, "prompt"),
        ({"prompt": [10**9]}, "prompt"),
    ],
)
def test_what_scoring_cannot_do_is_a_400_naming_the_field(url, change, param):
    body = {"model": "steerlab-tiny", "prompt": "Hi", "max_tokens": 1, **change}
    response = post(url, "/v1/completions", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_logprobs_n_for_every_new_token_come_from_the_forward_that_sampled_it(url, toy_hf, toy_lm):
    """Greedy, 5 new tokens, logprobs 2: each new token's logprob and top 2 equal
    transformers' on the prompt plus the tokens before it; the echoed prompt's too."""
    ids = toy_lm.tokenizer("The happy fox")["input_ids"]
    body = {"model": "steerlab-tiny", "prompt": ids, "max_tokens": 5, "echo": True,
            "logprobs": 2, "temperature": 0, "ignore_eos": True}  # fmt: skip
    choice = post(url, "/v1/completions", body).json()["choices"][0]
    new = choice["token_ids"]
    full = ids + new
    want = hf_logprobs(toy_hf, full)
    lp = choice["logprobs"]
    assert len(new) == 5 and len(lp["token_logprobs"]) == len(full)
    for t in range(1, len(full)):
        assert lp["token_logprobs"][t] == pytest.approx(float(want[t - 1, full[t]]), abs=1e-4)
        top = want[t - 1].topk(2)
        names = [toy_lm.tokenizer.decode([int(i)]) for i in top.indices]
        assert list(lp["top_logprobs"][t])[:2] == names
        assert len(lp["top_logprobs"][t]) in (2, 3)  # N, or N + 1 with the chosen token
    assert new == [int(want[t - 1].argmax()) for t in range(len(ids), len(full))]


def test_an_ending_eos_is_scored_too(url, toy_hf, toy_lm):
    """A row that ends on EOS lists it in logprobs (text and token_ids leave it out), so
    lm-eval's ``[ctxlen:-1]`` slice still drops exactly the sampled tokens."""
    chat = toy_lm.tokenizer.apply_chat_template([{"role": "user", "content": "Tell me a story"}],
                                                tokenize=False, add_generation_prompt=True)  # fmt: skip
    ids = toy_lm.tokenizer(chat, add_special_tokens=False)["input_ids"]
    eos = toy_lm.tokenizer.eos_token_id
    body = {"model": "steerlab-tiny", "prompt": ids, "max_tokens": 60, "logprobs": 0,
            "temperature": 0}  # fmt: skip
    choice = post(url, "/v1/completions", body).json()["choices"][0]
    assert choice["steerlab"]["finish_reason"] == "eos"  # the toy's replies end on EOS
    lp, new = choice["logprobs"], choice["token_ids"]
    assert eos not in new and len(lp["tokens"]) == len(new) + 1
    assert lp["tokens"][-1] == toy_lm.tokenizer.decode([eos])
    want = hf_logprobs(toy_hf, ids + new + [eos])
    assert lp["token_logprobs"][-1] == pytest.approx(float(want[-2, eos]), abs=1e-4)


def test_chat_top_logprobs_are_openais_chat_shape_and_transformers_values(url, toy_hf, toy_lm):
    messages = [{"role": "user", "content": "Tell me about the sea"}]
    body = {"model": "steerlab-tiny", "messages": messages, "max_tokens": 4, "logprobs": True,
            "top_logprobs": 3, "temperature": 0, "ignore_eos": True}  # fmt: skip
    choice = post(url, "/v1/chat/completions", body).json()["choices"][0]
    prompt = toy_lm.tokenizer(toy_lm.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True), add_special_tokens=False)["input_ids"]  # fmt: skip
    full = prompt + choice["token_ids"]
    want = hf_logprobs(toy_hf, full)
    content = choice["logprobs"]["content"]
    assert len(content) == len(choice["token_ids"]) == 4
    for k, entry in enumerate(content):
        at = len(prompt) + k - 1
        assert entry["logprob"] == pytest.approx(float(want[at, full[at + 1]]), abs=1e-4)
        top = want[at].topk(3)
        assert [t["token"] for t in entry["top_logprobs"]] == [
            toy_lm.tokenizer.decode([int(i)]) for i in top.indices]  # fmt: skip
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(
            top.values.tolist(), abs=1e-4)  # fmt: skip
        assert entry["bytes"] == list(entry["token"].encode())
    bad = post(url, "/v1/chat/completions", {**body, "logprobs": False})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_logprobs"
