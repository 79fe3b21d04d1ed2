"""``sl.evals.lm_eval`` against lm-eval's own ``hf`` model: unsteered, the same per-sample
loglikelihoods as lm-eval scoring the transformers model; steered, the same as lm-eval
scoring that model with a plain torch hook adding alpha * v (``tests/reference.py``)."""

from __future__ import annotations

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
    assert toy_lm.hook_count() == 0  # the server served it and left nothing behind


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
    assert remote.preset == "happy" and local.preset == "steered"


def test_lm_eval_arguments_are_checked_before_any_server_starts(toy_lm, vec, tasks):
    with pytest.raises(ValueError, match="tasks"):
        sl.evals.lm_eval(toy_lm, [], vec)
    with pytest.raises(ValueError, match="limit"):
        sl.evals.lm_eval(toy_lm, TASKS, vec, limit=0)
    with pytest.raises(ValueError, match="names a preset"):
        sl.evals.lm_eval(toy_lm, TASKS, "happy", include_path=tasks)
    with pytest.raises(ValueError, match="not a folder"):
        sl.evals.lm_eval(toy_lm, TASKS, vec, include_path=tasks / "toy_sentiment.yaml")


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


def test_an_in_process_model_is_tokenized_on_the_client_not_through_tokenize(toy_lm, tasks,
                                                                              monkeypatch):  # fmt: skip
    """No /tokenize round trips for an in-process model (two per loglikelihood cost more
    than scoring steerlab-tiny); the ids equal the server's own, as the oracle test checks."""
    from lm_eval.utils import RemoteTokenizer

    calls = []
    encode = RemoteTokenizer.encode
    monkeypatch.setattr(RemoteTokenizer, "encode", lambda self, text: calls.append(text)
                        or encode(self, text))  # fmt: skip
    result = sl.evals.lm_eval(toy_lm, ["toy_sentiment"], limit=2, include_path=tasks,
                              log_samples=True)  # fmt: skip
    assert calls == []
    assert len(_loglikelihoods(result.unsteered, "toy_sentiment")) > 0
