"""The hf backend's LM head on a CPU with a wide vocabulary (``steerlab.backends.head``): the
weight on the left for 2-64 rows, faster there and the same logits within float rounding,
against plain transformers; a hook on the model or the head keeps the model's own forward."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import steerlab as sl
from steerlab.backends.head import WIDE_ROWS, plain_head, wide
from steerlab.engine.scoring import score_prompts
from steerlab.testing import char_tokenizer


@pytest.fixture(scope="module")
def wide_model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=9000, n_positions=128,
                        bos_token_id=0, eos_token_id=1, pad_token_id=2)  # fmt: skip
    return GPT2LMHeadModel(config).eval()


def _hf_scores(model: GPT2LMHeadModel, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logprobs = model(torch.tensor([ids])).logits[0].log_softmax(-1)
    return logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def test_scores_and_greedy_tokens_equal_plain_transformers(wide_model):
    lm = sl.wrap(wide_model, char_tokenizer())
    assert plain_head(wide_model) is wide_model.lm_head
    prompts = [lm.tokenizer.encode(t) for t in ("Once upon a time", "The sea was calm")]
    assert all(wide(wide_model.lm_head, len(p)) for p in prompts)  # the fast path is taken
    for ids, scores in zip(prompts, score_prompts(lm.engine, prompts, top=1)):
        got = torch.tensor([s.logprob for s in scores[1:]])
        torch.testing.assert_close(got, _hf_scores(wide_model, ids), rtol=0, atol=1e-5)
        assert all(s.top[0][0] == int(s.top[0][0]) for s in scores[1:])
    ids = torch.tensor([prompts[0]] * 3)  # three rows decoding: the fast path every step
    with torch.inference_mode():
        hf = wide_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                                 min_new_tokens=12, do_sample=False, pad_token_id=2)  # fmt: skip
    ours = lm.generate(["Once upon a time"] * 3, max_new_tokens=12, stop_at_eos=False)
    assert ours.tokens == hf[:, ids.shape[1] :].tolist()


def test_a_hook_on_the_head_or_the_model_is_not_skipped(wide_model):
    """A forward hook of the user's on ``lm_head`` (or the model) would be bypassed by the
    fast path, so the backend then calls the model itself: the hook's edit shows."""
    lm = sl.wrap(wide_model, char_tokenizer())
    ids = lm.tokenizer.encode("Once upon a time")
    before = [s.logprob for s in score_prompts(lm.engine, [ids])[0][1:]]
    bump = torch.zeros(9000)
    bump[ids[1:]] = 5.0  # every prompt token more likely
    for module in (wide_model.lm_head, wide_model):
        if module is wide_model:
            handle = module.register_forward_hook(
                lambda _m, _a, out: out.__class__(**{**out, "logits": out.logits + bump})
            )
        else:
            handle = module.register_forward_hook(lambda _m, _a, out: out + bump)
        try:
            assert plain_head(wide_model) is None
            lm.engine.prompt_store.clear()
            after = [s.logprob for s in score_prompts(lm.engine, [ids])[0][1:]]
            assert all(a > b + 1 for a, b in zip(after, before))
        finally:
            handle.remove()
    assert plain_head(wide_model) is wide_model.lm_head


def test_one_row_or_many_rows_or_another_dtype_keep_the_modules_product():
    head = torch.nn.Linear(16, 9000)
    assert wide(head, 2) and wide(head, WIDE_ROWS)
    assert not wide(head, 1) and not wide(head, WIDE_ROWS + 1)
    assert not wide(torch.nn.Linear(16, 8191), 8)
    assert not wide(head.to(torch.bfloat16), 8)
