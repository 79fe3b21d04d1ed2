"""``sl.evals.lm_eval`` against lm-eval's own ``hf`` model: unsteered, the same per-sample
loglikelihoods as lm-eval scoring the transformers model; steered, the same as lm-eval
scoring that model with a plain torch hook adding alpha * v (``tests/reference.py``)."""

from __future__ import annotations

import json
import random

import pytest
from reference import RefSteer, _install
from server_helpers import KEY, served
from transformers import AutoTokenizer

import steerlab as sl
from steerlab.server.presets import Preset
from steerlab.toy import asset_path
from steerlab.toy.evidence import CONTRAST_PAIRS
from steerlab.toy.tasks import TASKS

lm_eval = pytest.importorskip("lm_eval")
pytestmark = pytest.mark.slow
SITE, ALPHA = "blocks.2.hook_resid_pre", 4.0


@pytest.fixture(scope="module")
def vec(toy_lm) -> sl.SteeringVector:
    pos, neg = zip(*CONTRAST_PAIRS["sentiment"])
    return sl.extract(toy_lm, pos, neg, [SITE], token="mean", progress=False)


@pytest.fixture(scope="module")
def tasks(lm_eval_tasks):
    return lm_eval_tasks


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def _loglikelihoods(results: dict, task: str) -> list[float]:
    out = []
    for sample in sorted(results["samples"][task], key=lambda s: s["doc_id"]):
        for resp in sample["resps"]:
            value = resp[0]
            out.append(float(value[0] if isinstance(value, (list, tuple)) else value))
    return out


def _oracle(toy_hf, tasks, steers: list[RefSteer]) -> dict:
    """lm-eval's hf model on the transformers weights, hooks on throughout. lm-eval's remote
    tokenizer adds no BOS, so neither does the oracle; the rolling prefix is BOS (0) in both."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    tokenizer = AutoTokenizer.from_pretrained(asset_path("steerlab-tiny"))
    model = HFLM(pretrained=toy_hf, tokenizer=tokenizer, batch_size=1, add_bos_token=False)
    handles = _install(toy_hf, steers, 0)
    try:
        return simple_evaluate(model=model, tasks=list(TASKS), log_samples=True,
                               task_manager=TaskManager(include_path=str(tasks)),
                               bootstrap_iters=100)  # fmt: skip
    finally:
        for h in handles:
            h.remove()


def test_lm_eval_steered_and_unsteered_equal_lm_evals_hf_model_with_a_hook(toy_lm, toy_hf, vec,
                                                                           tasks):  # fmt: skip
    res = sl.evals.lm_eval(toy_lm, TASKS, vec, alpha=ALPHA, include_path=tasks,
                           log_samples=True, bootstrap_iters=100)  # fmt: skip
    unsteered = _oracle(toy_hf, tasks, [])
    steered = _oracle(toy_hf, tasks, [RefSteer(SITE, vec.directions[SITE] * vec.scale, ALPHA)])
    for task in TASKS:
        for ours, oracle in ((res.unsteered, unsteered), (res.steered, steered)):
            got, want = _loglikelihoods(ours, task), _loglikelihoods(oracle, task)
            assert len(got) == len(want) > 0, task
            assert got == pytest.approx(want, abs=1e-3), task
    assert _loglikelihoods(res.steered, "toy_stories") != pytest.approx(
        _loglikelihoods(res.unsteered, "toy_stories"), abs=1e-2
    )  # the steer changed something
    table = {(r["task"], r["metric"]): r for r in res.table()}
    acc = table["toy_sentiment", "acc"]
    assert acc["unsteered"] == unsteered["results"]["toy_sentiment"]["acc,none"]
    assert acc["steered"] == steered["results"]["toy_sentiment"]["acc,none"]
    assert acc["delta"] == acc["steered"] - acc["unsteered"]
    assert ("toy_stories", "word_perplexity") in table and "sample_len" not in repr(res)
    assert toy_lm.hook_count() == 0  # the steered run left nothing behind
    assert res.unsteered["config"]["model"] == toy_lm.name  # lm-eval said "SteerlabLM"
    assert res.steered["config"]["model"] == f"{toy_lm.name} + steered"
    assert res.unsteered["config"]["steerlab_path"] == "in-process"


def test_lm_eval_against_a_running_server_steers_through_its_preset(toy_lm, vec, tasks):
    with served(toy_lm, presets=[Preset("happy", vec, ALPHA)]) as url:
        remote = sl.evals.lm_eval(url, ["toy_sentiment"], "happy", include_path=tasks, limit=6,
                                  api_key=KEY, log_samples=True, bootstrap_iters=100)  # fmt: skip
        with pytest.raises(ValueError, match="no preset 'sad'"):
            sl.evals.lm_eval(url, ["toy_sentiment"], "sad", include_path=tasks, api_key=KEY)
        with pytest.raises(ValueError, match="--preset NAME=VECTOR_FILE@ALPHA"):
            sl.evals.lm_eval(url, ["toy_sentiment"], vec, include_path=tasks, api_key=KEY)
    local = sl.evals.lm_eval(toy_lm, ["toy_sentiment"], vec, alpha=ALPHA, include_path=tasks,
                             limit=6, log_samples=True, bootstrap_iters=100)  # fmt: skip
    for run in ("unsteered", "steered"):
        assert _loglikelihoods(getattr(remote, run), "toy_sentiment") == pytest.approx(
            _loglikelihoods(getattr(local, run), "toy_sentiment"), abs=1e-5
        )
    assert remote.preset == "happy" and local.preset is None  # presets are a server's
    assert "vs preset 'happy'" in repr(remote)
    assert "preset" not in repr(local).splitlines()[0]
    assert remote.steered["config"]["model"] == "happy"
    assert remote.unsteered["config"]["steerlab_path"].startswith("server http://127.0.0.1")


def test_lm_eval_arguments_are_checked_before_any_server_starts(toy_lm, vec, tasks):
    with pytest.raises(ValueError, match="tasks"):
        sl.evals.lm_eval(toy_lm, [], vec)
    with pytest.raises(ValueError, match="limit"):
        sl.evals.lm_eval(toy_lm, TASKS, vec, limit=0)
    with pytest.raises(ValueError, match="names a preset"):
        sl.evals.lm_eval(toy_lm, TASKS, "happy", include_path=tasks)
    with pytest.raises(ValueError, match="not a folder"):
        sl.evals.lm_eval(toy_lm, TASKS, vec, include_path=tasks / "toy_sentiment.yaml")
    with pytest.raises(ValueError, match="model_args"):
        sl.evals.lm_eval(toy_lm, TASKS, vec, include_path=tasks, model_args={"batch_size": 4})
    with pytest.raises(sl.SiteError):  # checked against the model before lm-eval starts
        sl.evals.lm_eval(toy_lm, TASKS, sl.Steer("blocks.9.hook_resid_pre", vec[SITE]),
                         include_path=tasks)  # fmt: skip


def test_lm_eval_draws_no_request_bars_and_shows_a_missing_stderr_as_n_a(toy_lm, tasks, capfd):
    """lm-eval has no formula for a perplexity's stderr and prints "N/A"; so does the table.
    Its "Requesting API" bars stay out of the notebook, and only during the call."""
    from lm_eval.models import api_models
    from tqdm import tqdm

    result = sl.evals.lm_eval(toy_lm, list(TASKS), limit=2, include_path=tasks)
    err = capfd.readouterr().err
    assert "Requesting API" not in err and "Tokenizing inputs" not in err
    assert api_models.tqdm is tqdm  # put back
    rows = {r["task"]: r for r in result.table()}
    assert rows["toy_stories"]["unsteered_stderr"] != rows["toy_stories"]["unsteered_stderr"]
    line = next(x for x in repr(result.table()).splitlines() if "toy_stories" in x)
    assert line.split()[-1] == "N/A" and "nan" not in line
    assert "<td>N/A</td>" in result._repr_html_()


def test_an_in_process_model_is_scored_without_a_server(toy_lm, tasks, monkeypatch):
    """No server, no HTTP: lm-eval's model calls the engine (a forward of steerlab-tiny is
    shorter than a loopback round trip)."""
    from steerlab.server import background

    def refuse(*args, **kwargs):
        raise AssertionError("an in-process model started a server")

    monkeypatch.setattr(background, "serve_in_background", refuse)
    result = sl.evals.lm_eval(toy_lm, ["toy_sentiment"], limit=2, include_path=tasks,
                              log_samples=True)  # fmt: skip
    assert len(_loglikelihoods(result.unsteered, "toy_sentiment")) > 0


@pytest.fixture(scope="module")
def long_stories(tmp_path_factory):
    """A rolling task of three documents, each over twice steerlab-tiny's 128-token window."""

    from steerlab.toy.corpus import make_story

    rng = random.Random(7)
    folder = tmp_path_factory.mktemp("long-stories")
    docs = [{"text": " ".join(make_story(rng).text for _ in range(4 + i))} for i in range(3)]
    data = folder / "long_stories.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "long_stories.yaml").write_text(
        "task: long_stories\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {json.dumps(str(data))}\ntest_split: test\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: ''\n"
        "doc_to_target: '{{text}}'\nmetric_list:\n  - metric: word_perplexity\n"
    )
    return folder


def test_documents_longer_than_the_window_are_scored_in_windows_as_lm_evals_hf_model_does(
    toy_lm, toy_hf, long_stories
):
    """In-process, the windows are lm-eval's ``hf`` model's own at the same ``max_length``
    (``n_ctx``, which ``hf`` reads from the config): the last token of a full window is
    scored from the logits after the window's last token fed. Through a server, lm-eval's
    API model keeps a token for the one a request samples, so its windows are ``hf``'s at
    ``n_ctx - 2`` (it feeds a window less its last token)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lines = (long_stories / "long_stories.jsonl").read_text().splitlines()
    texts = [json.loads(line)["text"] for line in lines]
    assert min(len(toy_lm.tokenizer.encode(t)) for t in texts) > 2 * toy_lm.n_ctx
    tokenizer = AutoTokenizer.from_pretrained(asset_path("steerlab-tiny"))

    def oracle(max_length: int | None) -> list[float]:
        hf = HFLM(pretrained=toy_hf, tokenizer=tokenizer, batch_size=1, add_bos_token=False,
                  max_length=max_length)  # fmt: skip
        out = simple_evaluate(model=hf, tasks=["long_stories"], log_samples=True,
                              task_manager=TaskManager(include_path=str(long_stories)),
                              bootstrap_iters=0)  # fmt: skip
        return _loglikelihoods(out, "long_stories")

    ours = sl.evals.lm_eval(toy_lm, ["long_stories"], include_path=long_stories,
                            log_samples=True, bootstrap_iters=0)  # fmt: skip
    got, want = _loglikelihoods(ours.unsteered, "long_stories"), oracle(None)
    assert len(got) == len(want) == 3
    assert got == pytest.approx(want, abs=1e-3)
    assert got != pytest.approx(oracle(toy_lm.n_ctx - 2), abs=1e-1)  # the windows matter
    with served(toy_lm) as url:
        remote = sl.evals.lm_eval(url, ["long_stories"], include_path=long_stories,
                                  api_key=KEY, log_samples=True, bootstrap_iters=0)  # fmt: skip
    got = _loglikelihoods(remote.unsteered, "long_stories")
    assert got == pytest.approx(oracle(toy_lm.n_ctx - 2), abs=1e-3)


def test_rolling_windows_of_every_document_go_batch_size_a_request(toy_lm, tasks, monkeypatch):
    """lm-eval's API models send one document a request; ``sl.evals.lm_eval`` sends every
    document's windows together (as lm-eval's ``hf`` model batches them), with the same
    per-document loglikelihoods as the stock ``local-completions`` model against the same
    server."""
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    calls = []
    call = LocalCompletionsAPI.model_call
    monkeypatch.setattr(LocalCompletionsAPI, "model_call", lambda self, messages, **kw:
                        calls.append(len(messages)) or call(self, messages, **kw))  # fmt: skip
    with served(toy_lm) as url:
        ours = sl.evals.lm_eval(url, ["toy_stories"], include_path=tasks, api_key=KEY,
                                log_samples=True, bootstrap_iters=0)  # fmt: skip
        batched, calls[:] = list(calls), []
        stock = simple_evaluate(
            model="local-completions", tasks=["toy_stories"], log_samples=True,
            model_args={"base_url": f"{url}/v1/completions", "model": toy_lm.name,
                        "tokenizer_backend": "remote", "tokenized_requests": True,
                        "batch_size": 16, "max_length": toy_lm.n_ctx,
                        "custom_prefix_token_id": 0, "auth_token": KEY,
                        "header": {"Authorization": f"Bearer {KEY}"}},
            task_manager=TaskManager(include_path=str(tasks)), bootstrap_iters=0,
        )  # fmt: skip
    docs = len(_loglikelihoods(stock, "toy_stories"))
    assert docs == 12 and calls == [1] * docs  # stock: a document a request
    assert batched == [12]  # ours: every document's (single) window in one request
    assert _loglikelihoods(ours.unsteered, "toy_stories") == pytest.approx(
        _loglikelihoods(stock, "toy_stories"), abs=1e-5
    )
