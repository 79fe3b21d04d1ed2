"""Chat templates: the tokens actually fed carry exactly one BOS."""

import pytest

from steerlab.core.prompts import encode
from steerlab.testing import char_tokenizer

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)


@pytest.fixture
def tokenizer():
    tok = char_tokenizer()  # its post-processor adds BOS, like Llama's
    tok.chat_template = TEMPLATE
    return tok


def test_chat_string_is_the_user_turn_with_one_bos(tokenizer):
    ids = encode(tokenizer, "hi", chat=True)
    assert ids[0] == tokenizer.bos_token_id and ids[1] != tokenizer.bos_token_id
    assert tokenizer.decode(ids[1:]) == "[user]hi[assistant]"


def test_chat_messages_and_plain_prompt(tokenizer):
    messages = [{"role": "system", "content": "be kind"}, {"role": "user", "content": "yo"}]
    ids = encode(tokenizer, messages, chat=True)
    assert ids.count(tokenizer.bos_token_id) == 1
    assert tokenizer.decode(ids[1:]) == "[system]be kind[user]yo[assistant]"
    plain = encode(tokenizer, "yo", chat=False)
    assert plain == [
        tokenizer.bos_token_id,
        *tokenizer("yo", add_special_tokens=False)["input_ids"],
    ]


def test_no_template_falls_back_with_a_warning():
    tok = char_tokenizer()
    with pytest.warns(UserWarning, match="no chat template"):
        ids = encode(tok, "hello", chat=True)
    assert ids == encode(tok, "hello", chat=False)


def test_generate_with_chat_feeds_the_template(lm, tokenizer):
    lm.tokenizer.chat_template = TEMPLATE
    try:
        out = lm.generate("hey", chat=True, max_new_tokens=2)
    finally:
        lm.tokenizer.chat_template = None
    assert lm.tokenizer.decode(out.prompt_tokens[0]) == "<|bos|>[user]hey[assistant]"
    assert out.prompt_tokens[0].count(lm.tokenizer.bos_token_id) == 1
