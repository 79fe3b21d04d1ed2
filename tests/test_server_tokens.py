"""``/tokenize``, ``/detokenize`` and ``/tokenizer_info`` (vLLM's shapes), read by lm-eval's
own remote tokenizer client and compared with the transformers tokenizer."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import HEADERS, KEY, post, served

TEXT = "Once upon a time, the happy fox ran to the sea."


@pytest.fixture(scope="module")
def url(toy_lm):
    with served(toy_lm) as address:
        yield address


@pytest.mark.parametrize("special", [True, False])
def test_tokenize_is_the_tokenizers_own(url, toy_lm, special):
    body = {"prompt": TEXT, "add_special_tokens": special, "return_token_strs": True}
    got = post(url, "/tokenize", body).json()
    want = toy_lm.tokenizer(TEXT, add_special_tokens=special)["input_ids"]
    assert got["tokens"] == want and got["count"] == len(want)
    assert got["max_model_len"] == toy_lm.n_ctx
    assert got["token_strs"] == toy_lm.tokenizer.convert_ids_to_tokens(want)


def test_tokenize_messages_renders_the_chat_template(url, toy_lm):
    messages = [{"role": "user", "content": "Hi"}]
    got = post(url, "/tokenize", {"messages": messages}).json()["tokens"]
    text = toy_lm.tokenizer.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=True)  # fmt: skip
    assert got == toy_lm.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_detokenize_and_tokenizer_info(url, toy_lm):
    ids = toy_lm.tokenizer(TEXT)["input_ids"]
    assert post(url, "/detokenize", {"tokens": ids}).json() == {
        "prompt": toy_lm.tokenizer.decode(ids)}  # fmt: skip
    info = httpx.get(url + "/tokenizer_info", headers=HEADERS).json()
    assert info["eos_token"] == "<|eos|>" and info["bos_token"] == "<|bos|>"
    assert info["chat_template"] == toy_lm.tokenizer.chat_template
    assert "name_or_path" not in info and info["tokenizer_class"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
        ("/tokenize", {"prompt": "a", "add_bos": True}, "add_bos"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/detokenize", {"tokens": [1], "model": "other"}, "model"),
    ],
)
def test_bad_tokenizer_requests_name_the_field(url, path, body, param):
    response = post(url, path, body)
    assert response.status_code in (400, 404), response.text
    assert response.json()["error"]["param"] == param


def test_lm_evals_remote_tokenizer_reads_them(url, toy_lm):
    utils = pytest.importorskip("lm_eval.utils")
    assert utils.check_remote_tokenizer_support(url + "/v1/completions", auth_token=KEY)
    remote = utils.RemoteTokenizer(url + "/v1/completions", auth_token=KEY)
    assert remote.encode(TEXT) == toy_lm.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert remote.decode(remote.encode(TEXT)) == TEXT
    assert remote.eos_token_id == toy_lm.tokenizer.eos_token_id
    assert remote.bos_token_id == toy_lm.tokenizer.bos_token_id
