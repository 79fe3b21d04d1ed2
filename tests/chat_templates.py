"""Real chat templates saved for tests, and tiny random Llamas that use them.

The Jinja strings follow the published formats: Llama-3 (headers, ``| trim`` on content,
``<|eot_id|>`` ends a turn and is the EOS) and ChatML (``<|im_start|>``/``<|im_end|>``,
``<|im_end|>`` is the EOS). The tokenizer is the character tokenizer of
``steerlab.testing`` with the template's special tokens added.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from steerlab.testing import char_tokenizer, tiny_model

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Only user/assistant/system, and roles must alternate (Llama-2 style): it raises otherwise.
STRICT = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}"
    "[{{ message['role'] }}]{{ message['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)

# Silently drops any role it does not know.
DROPPING = (
    "{% for message in messages %}{% if message['role'] in ['system', 'user', 'assistant'] %}"
    "[{{ message['role'] }}]{{ message['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}"
)

SPECIALS = {
    "llama3": (LLAMA3, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], "<|eot_id|>"),
    "chatml": (CHATML, ["<|im_start|>", "<|im_end|>"], "<|im_end|>"),
}


def template_tokenizer(style: str) -> Any:
    """The character tokenizer with ``style``'s template, special tokens and EOS."""
    template, specials, eos = SPECIALS[style]
    tok = char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": specials})
    tok.eos_token = eos
    tok.chat_template = template
    return tok


def save_chat_llama(directory: Path, style: str = "chatml", n_ctx: int = 512) -> Path:
    """A tiny random Llama with ``style``'s template, as a local HF-format folder."""
    tok = template_tokenizer(style)
    model = tiny_model("llama", vocab=len(tok), n_ctx=n_ctx)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory
