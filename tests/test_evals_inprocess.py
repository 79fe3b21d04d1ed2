"""lm-eval's in-process steerlab model against lm-eval's own ``hf`` model, sample by sample,
on a tiny random GPT-2 folder: multiple choice, and rolling documents several windows long,
unsteered and steered (the ``hf`` model with a plain torch hook, ``tests/reference.py``)."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch
from reference import RefSteer, _install
from transformers import AutoModelForCausalLM, AutoTokenizer

import steerlab as sl
from steerlab.core.request import Completion, TokenScore
from steerlab.engine.scoring import score_continuations, score_prompts
from steerlab.evals.inprocess import lm_eval_model
from steerlab.testing import save_tiny

lm_eval = pytest.importorskip("lm_eval")
pytestmark = pytest.mark.slow
N_CTX, SITE, ALPHA = 48, "blocks.1.hook_resid_pre", 3.0
WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "and",
    "ran",
    "to",
    "sea",
    "with",
    "big",
    "red",
    "hats",
    "in",
    "sun",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("gpt2"), "gpt2", n_ctx=N_CTX)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """A multiple-choice task (contexts shared by 3 choices) and a rolling one whose
    documents run to several of the model's 48-token windows."""
    rng = random.Random(3)
    folder = tmp_path_factory.mktemp("tasks")

    def text(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    mc = [{"context": text(6), "choices": [" " + text(k) for k in (1, 2, 3)], "label": i % 3}
          for i in range(8)]  # fmt: skip
    docs = [{"text": text(10 + 25 * i)} for i in range(5)]  # up to ~500 characters
    for name, docs_, spec in (
        ("tiny_mc", mc, "output_type: multiple_choice\ndoc_to_text: '{{context}}'\n"
         "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\ntarget_delimiter: ''\n"
         "metric_list:\n  - metric: acc\n"),
        ("tiny_rolling", docs, "output_type: loglikelihood_rolling\ndoc_to_text: ''\n"
         "doc_to_target: '{{text}}'\nmetric_list:\n  - metric: word_perplexity\n"),
    ):  # fmt: skip
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in docs_))
        (folder / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    test: {json.dumps(str(data))}\ntest_split: test\n{spec}"
        )
    return folder


def _samples(model, tasks) -> dict[str, list[tuple[float, ...]]]:
    from lm_eval.evaluator import evaluate
    from lm_eval.tasks import TaskManager, get_task_dict

    names = ["tiny_mc", "tiny_rolling"]
    task_dict = get_task_dict(names, TaskManager(include_path=str(tasks), include_defaults=False))
    out = evaluate(lm=model, task_dict=task_dict, log_samples=True, bootstrap_iters=0,
                   verbosity="ERROR")  # fmt: skip
    per_task = {}
    for name in names:
        rows = []
        for sample in sorted(out["samples"][name], key=lambda s: s["doc_id"]):
            for resp in sample["resps"]:
                value = resp[0]
                rows.append(tuple(value) if isinstance(value, (list, tuple)) else (value,))
        per_task[name] = rows
    return per_task


@pytest.mark.parametrize("backend", ["hf", "bridge"])
def test_equals_lm_evals_hf_model_sample_by_sample(folder, tasks, backend):
    from lm_eval.models.huggingface import HFLM

    lm = sl.load(folder, backend=backend)
    texts = [json.loads(line)["text"] for line in (tasks / "tiny_rolling.jsonl").open()]
    assert max(len(lm.tokenizer.encode(t)) for t in texts) > 4 * N_CTX  # several windows
    vector = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(5))
    hf_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    hf = HFLM(pretrained=hf_model, tokenizer=AutoTokenizer.from_pretrained(folder),
              batch_size=4, add_bos_token=False, device="cpu")  # fmt: skip
    assert hf.max_length == N_CTX == lm.n_ctx  # the same max_length, read from the config
    for steers in ([], [sl.Steer(SITE, vector, ALPHA)]):
        handles = _install(hf_model, [RefSteer(SITE, vector, ALPHA)] if steers else [], 0)
        try:
            want = _samples(hf, tasks)
        finally:
            for handle in handles:
                handle.remove()
        got = _samples(lm_eval_model(lm, steers), tasks)
        for name in want:
            assert len(got[name]) == len(want[name]) > 0
            for ours, theirs in zip(got[name], want[name]):
                assert ours[0] == pytest.approx(theirs[0], abs=1e-4), (name, steers)
                assert ours[1:] == theirs[1:]  # is_greedy, for multiple choice
    assert lm.hook_count() == 0


def test_score_continuations_equals_the_prompts_own_scores_and_refuses_bad_counts(toy_lm):
    ids = toy_lm.tokenizer.encode("Once upon a time, there was a little cat")
    [scores] = score_prompts(toy_lm.engine, [ids], top=1)
    for n in (1, 3, len(ids) - 1):
        [(logprob, greedy)] = score_continuations(toy_lm.engine, [(ids, n)], window=toy_lm.n_ctx)
        assert logprob == pytest.approx(sum(s.logprob for s in scores[-n:]), abs=1e-5)
        assert greedy == all(s.top[0][0] == s.token for s in scores[-n:])
    long = ids * 3  # past the window of 16: cut to its last 17 tokens
    pairs = [(ids, 3), (ids[:5], 2), (ids, len(ids) - 1), (long, 16), (long, 4)]  # padded rows
    by_decode = score_continuations(toy_lm.engine, pairs, window=16)
    by_forward = score_continuations(toy_lm.engine, pairs, window=16, shared=False)
    for (a, greedy_a), (b, greedy_b) in zip(by_decode, by_forward):
        assert a == pytest.approx(b, abs=1e-5) and greedy_a == greedy_b
    with pytest.raises(ValueError, match="0 scored tokens"):
        score_continuations(toy_lm.engine, [(ids, 0)], window=toy_lm.n_ctx)
    with pytest.raises(ValueError, match="at most 4"):  # the window keeps the last 5 tokens
        score_continuations(toy_lm.engine, [(ids, 5)], window=4)
    with pytest.raises(ValueError, match="window"):
        score_continuations(toy_lm.engine, [(ids, 1)], window=0)


def test_a_token_the_bias_cannot_force_is_refused_not_misreported(toy_lm):
    """An engine that sampled another token than the one forced: an error, never its score."""
    ids = toy_lm.tokenizer.encode("Once upon a time")

    def run(requests, wait=0.0):
        other = TokenScore(ids[-1] + 1, -0.1, ((ids[-1] + 1, -0.1),))
        return [Completion("", [other.token], [-0.1], "length", [other], [None] * len(r.prompt))
                for r in requests]  # fmt: skip

    engine = SimpleNamespace(run=run, n_ctx=128, capabilities=toy_lm.engine.capabilities)
    with pytest.raises(RuntimeError, match="100 nats"):
        score_continuations(engine, [(ids, 2)], window=128)


# generate_until: two tasks of the same settings but their stop strings, so one engine call
# holds rows with different stops; "." and " the" end most of a story's rows early
GEN_TASKS = {"gen_dot": ["."], "gen_the": [" the", "\n\n"]}
MAX_GEN = 12


@pytest.fixture(scope="module")
def gen_tasks(tmp_path_factory):
    from steerlab.toy.corpus import make_story

    rng = random.Random(7)
    folder = tmp_path_factory.mktemp("gen_tasks")
    for name, until in GEN_TASKS.items():
        docs = [{"context": " ".join(make_story(rng).text.split()[: 3 + 5 * i])} for i in range(5)]
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(d) + "\n" for d in docs))
        (folder / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    test: {json.dumps(str(data))}\ntest_split: test\noutput_type: generate_until\n"
            "doc_to_text: '{{context}}'\ndoc_to_target: ''\ngeneration_kwargs:\n"
            f"  until: {json.dumps(until)}\n  max_gen_toks: {MAX_GEN}\n  do_sample: false\n"
            "metric_list:\n  - metric: exact_match\n"
        )
    return folder


def _texts(model, gen_tasks) -> dict[str, list[str]]:
    from lm_eval.evaluator import evaluate
    from lm_eval.tasks import TaskManager, get_task_dict

    manager = TaskManager(include_path=str(gen_tasks), include_defaults=False)
    out = evaluate(lm=model, task_dict=get_task_dict(list(GEN_TASKS), manager),
                   log_samples=True, bootstrap_iters=0, verbosity="ERROR")  # fmt: skip
    return {name: [s["resps"][0][0] for s in sorted(out["samples"][name],
                                                    key=lambda s: s["doc_id"])]
            for name in GEN_TASKS}  # fmt: skip


@pytest.fixture(scope="module")
def gpt2_small_shape(tmp_path_factory):
    """GPT-2 small's shape (12 layers, d_model 768, 12 heads), random, with steerlab-tiny's
    tokenizer and a vocabulary of its size (so generated tokens decode to text)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from steerlab.toy import asset_path

    folder = tmp_path_factory.mktemp("gpt2_small")
    tokenizer = AutoTokenizer.from_pretrained(asset_path("steerlab-tiny"))
    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=len(tokenizer),
                        n_positions=128, bos_token_id=0, eos_token_id=1, pad_token_id=2)  # fmt: skip
    GPT2LMHeadModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("model", ["steerlab-tiny", "gpt2-small-shape"])
def test_generate_until_equals_lm_evals_hf_model_text_by_text(model, gen_tasks, request):
    """Greedy texts equal lm-eval ``hf``'s, per sample, unsteered and steered; the rows of
    both tasks (different stop strings) run in one engine call."""
    from lm_eval.models.huggingface import HFLM

    from steerlab.toy import asset_path

    path = asset_path(model) if model == "steerlab-tiny" else request.getfixturevalue(
        "gpt2_small_shape")  # fmt: skip
    lm = sl.load(path, backend="hf")
    hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    # steerlab-tiny's generation config says max_new_tokens=64, which transformers puts
    # before the max_length lm-eval's hf passes: without this, hf ignores max_gen_toks
    hf_model.generation_config.max_new_tokens = None
    hf = HFLM(pretrained=hf_model, tokenizer=AutoTokenizer.from_pretrained(path), batch_size=16,
              add_bos_token=False, device="cpu")  # fmt: skip
    vector = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(5))
    vector = vector / vector.norm() * 4
    calls, unsteered = [], {}
    run = lm.engine.run
    lm.engine.run = lambda requests, **kw: calls.append(len(requests)) or run(requests, **kw)
    try:
        for steers in ([], [sl.Steer(SITE, vector, ALPHA)]):
            handles = _install(hf_model, [RefSteer(SITE, vector, ALPHA)] if steers else [], 0)
            try:
                want = _texts(hf, gen_tasks)
            finally:
                for handle in handles:
                    handle.remove()
            calls.clear()
            got = _texts(lm_eval_model(lm, steers), gen_tasks)
            assert calls == [sum(len(t) for t in want.values())]  # one call: every row
            assert got == want, steers
            assert any(t.strip() for texts in want.values() for t in texts)  # real text
            unsteered = unsteered or want
    finally:
        del lm.engine.run
    assert lm.hook_count() == 0
    if model == "steerlab-tiny":  # the stop strings cut its stories: without them, rows go on
        prompts = [json.loads(line)["context"] for line in (gen_tasks / "gen_dot.jsonl").open()]
        free = lm.generate(prompts, max_new_tokens=MAX_GEN).text
        cut = [t for t, w in zip(free, unsteered["gen_dot"]) if t != w]
        assert cut and all("." in t for t in cut)


def test_generate_until_refuses_a_setting_it_cannot_honour(toy_lm):
    from lm_eval.api.instance import Instance

    model = lm_eval_model(toy_lm)
    bad = Instance("generate_until", {}, ("Once", {"until": ["."], "num_beams": 4}), 0)
    with pytest.raises(ValueError, match="num_beams=4"):
        model.generate_until([bad])
