"""lm-eval's own ``hf`` model is the oracle: its ``local-completions`` model pointed at
``steerlab serve steerlab-tiny`` gives the same per-sample loglikelihoods, on a local
multiple-choice task and a ``loglikelihood_rolling`` task (``steerlab.toy.tasks``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from server_helpers import KEY, served

from steerlab.toy import asset_path
from steerlab.toy.tasks import TASKS

lm_eval = pytest.importorskip("lm_eval")


@pytest.fixture(scope="module")
def task_dir(lm_eval_tasks) -> Path:
    """The toy world's multiple-choice and rolling-loglikelihood tasks (``steerlab.toy.tasks``),
    the session's folder, whose lm-eval task index is made once."""
    return lm_eval_tasks


def _loglikelihoods(results: dict, task: str) -> list[float]:
    samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
    out = []
    for sample in samples:
        for resp in sample["resps"]:
            value = resp[0]
            out.append(float(value[0] if isinstance(value, (list, tuple)) else value))
    return out


def _run(task_dir: Path, model: str, model_args: dict) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(
        model=model, model_args=model_args, tasks=list(TASKS),
        task_manager=TaskManager(include_path=str(task_dir)), log_samples=True, batch_size=1,
        device="cpu",
    )  # fmt: skip


@pytest.fixture(scope="module")
def oracles(task_dir) -> dict[bool, dict]:
    """lm-eval's hf model on the same folder, contexts with and without a BOS token."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        return {bos: _run(task_dir, "hf", {"pretrained": str(asset_path("steerlab-tiny")),
                                           "dtype": "float32", "add_bos_token": bos})
                for bos in (True, False)}  # fmt: skip


# The remote tokenizer is the server's own /tokenize, /detokenize and /tokenizer_info: no
# tokenizer on the client. It never adds a BOS (lm-eval's RemoteTokenizer), and the README's
# local-tokenizer recipe adds none either (a BOS in the text would be scored after the rolling
# window's prefix BOS), so both have the hf model without one as their oracle. lm-eval picks
# the rolling window's prefix token as bos or eos and reads steerlab-tiny's bos id 0 as false,
# so the prefix is named (0, the hf model's) in both.
TOKENIZERS = {
    "local": {"tokenizer_backend": "huggingface", "tokenizer": str(asset_path("steerlab-tiny")),
              "add_bos_token": False, "custom_prefix_token_id": 0},
    "remote": {"tokenizer_backend": "remote", "custom_prefix_token_id": 0, "auth_token": KEY},
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer", sorted(TOKENIZERS))
def test_local_completions_against_the_server_equals_lm_evals_hf_model(
    task_dir, oracles, monkeypatch, tokenizer, toy_lm
):
    oracle = oracles[TOKENIZERS[tokenizer].get("add_bos_token", False)]
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # local-completions sends it as the bearer token
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with served(toy_lm) as url:
        ours = _run(task_dir, "local-completions", {
            "model": "steerlab-tiny", "base_url": f"{url}/v1/completions", "num_concurrent": 1,
            "max_retries": 1, **TOKENIZERS[tokenizer],
        })  # fmt: skip
    for task in TASKS:
        want, got = _loglikelihoods(oracle, task), _loglikelihoods(ours, task)
        assert len(got) == len(want) > 0, task
        assert got == pytest.approx(want, abs=1e-3), task
        assert len(set(want)) == len(want) and all(v < 0 for v in want)  # real, distinct scores
        print(tokenizer, task, [round(v, 4) for v in got])


@pytest.mark.slow
def test_a_bos_in_the_text_is_scored_after_the_rolling_prefix_bos(oracles):
    """Why the README keeps ``add_bos_token`` off: with it, lm-eval's rolling loglikelihood
    of a story is log P(BOS | BOS) plus the story after two BOS tokens, computed here with
    plain transformers; without it, the story after exactly one BOS (what the model was
    trained on)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from steerlab.toy.tasks import story_docs

    path = asset_path("steerlab-tiny")
    tokenizer, model = (
        AutoTokenizer.from_pretrained(path),
        AutoModelForCausalLM.from_pretrained(path),
    )
    bos = tokenizer.bos_token_id
    want = {True: [], False: []}
    for doc in story_docs():
        ids = tokenizer(doc["text"], add_special_tokens=False).input_ids
        for with_bos, prefix in ((True, [bos, bos]), (False, [bos])):
            with torch.no_grad():
                logits = model(torch.tensor([prefix + ids])).logits[0].float()
            scored = prefix[1:] + ids  # each token after the one before it
            logp = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(scored)[:, None])
            want[with_bos].append(logp.sum().item())
    for with_bos in (True, False):
        got = _loglikelihoods(oracles[with_bos], "toy_stories")
        assert got == pytest.approx(want[with_bos], abs=1e-3)
    ppl = {b: oracles[b]["results"]["toy_stories"]["word_perplexity,none"] for b in (True, False)}
    assert ppl[True] > ppl[False]  # the extra BOS is counted against the text
