"""Train the toy world's byte-level BPE tokenizer and wrap it as a HF fast tokenizer.

Like Llama tokenizers, it prepends BOS on every encode (a TemplateProcessing
post-processor), and its chat template also starts with ``{{ bos_token }}``. A caller
that applies the template *and* adds special tokens therefore gets two BOS tokens;
that trap is deliberate, so the engine's handling of it is tested on a real asset.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from steerlab.toy.corpus import ASSISTANT, BOS, EOS, PAD, SPECIAL_TOKENS

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% else %}{{ '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '" + ASSISTANT + "\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` and return it ready to ``save_pretrained``.

    Args:
        texts: training documents; special-token strings inside them are kept whole.
        vocab_size: total vocabulary including the 256 byte symbols and special tokens.

    Returns:
        A fast tokenizer that adds BOS when encoding, with bos/eos/pad and a chat template.

    >>> tok = train_tokenizer(["Once upon a time."] * 10, vocab_size=300)
    >>> tok.convert_ids_to_tokens(tok("Once").input_ids)[0]
    '<|bos|>'
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A $B:1",
        special_tokens=[(BOS, bos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (BOS, EOS, PAD)],
        chat_template=CHAT_TEMPLATE,
        model_max_length=256,
        clean_up_tokenization_spaces=False,
    )
