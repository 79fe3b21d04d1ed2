"""``sl.evals.steerability`` against plain transformers with torch hooks, its intervals
against scipy's bootstrap, the judge against a fake OpenAI-compatible endpoint, and the
trade-off figure against the summary it draws."""

from __future__ import annotations

import math
import re
import statistics

import numpy as np
import pytest
import torch
from fastapi import FastAPI, Request
from reference import RefSteer, greedy, logprobs
from transformers import AutoTokenizer

import steerlab as sl
from steerlab.evals import Judge, JudgeError, mean_interval, perplexity_interval, steerability
from steerlab.evals.judge import parse_rating
from steerlab.toy import asset_path, concept_score
from steerlab.toy.evidence import CONTRAST_PAIRS, NEUTRAL_PROMPT

SITE = "blocks.2.hook_resid_pre"
PROMPTS = [NEUTRAL_PROMPT, "Mia the fox"]


@pytest.fixture(scope="module")
def vec(toy_lm) -> sl.SteeringVector:
    pos, neg = zip(*CONTRAST_PAIRS["sentiment"])
    return sl.extract(toy_lm, pos, neg, [SITE], token="mean", progress=False)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(asset_path("steerlab-tiny"))


def test_greedy_rows_perplexity_and_kl_equal_transformers_with_a_hook(toy_lm, toy_hf, vec,
                                                                       tokenizer):  # fmt: skip
    alphas = [-4.0, 0.0, 4.0]
    res = steerability(toy_lm, vec, PROMPTS, alphas, concept=concept_score, max_new_tokens=12,
                       temperature=0.0, n_boot=200, progress=False)  # fmt: skip
    direction = vec.directions[SITE] * vec.scale
    eos = {tokenizer.eos_token_id}
    assert len(res.rows) == len(PROMPTS) * len(alphas)
    for row in res.rows:
        ids = tokenizer(PROMPTS[row["prompt"]]).input_ids
        steers = [RefSteer(SITE, direction, row["alpha"])]
        tokens = greedy(toy_hf, ids, steers, 12, eos)
        assert row["text"] == tokenizer.decode(tokens, skip_special_tokens=True)
        assert row["length"] == row["tokens"] == len(tokens)
        unsteered = logprobs(toy_hf, ids + tokens, [])  # fluency: under the unsteered model
        nll = -sum(float(unsteered[len(ids) - 1 + i, t]) for i, t in enumerate(tokens))
        assert row["nll"] == pytest.approx(nll, abs=1e-4)
        p = logprobs(toy_hf, ids, steers)[-1]
        q = logprobs(toy_hf, ids, [])[-1]
        assert row["kl"] == pytest.approx(float((p.exp() * (p - q)).sum()), abs=1e-5)
        assert row["concept"] == concept_score(row["text"]) or math.isnan(row["concept"])
    for record in res.summary:
        cell = [r for r in res.rows if r["alpha"] == record["alpha"]]
        pooled = math.exp(sum(r["nll"] for r in cell) / sum(r["tokens"] for r in cell))
        assert record["perplexity"] == pytest.approx(pooled, rel=1e-6)
        assert record["kl"] == pytest.approx(statistics.mean(r["kl"] for r in cell))
        assert record["n"] == len(PROMPTS)
    assert res.summary[1]["kl"] == 0.0  # alpha 0 is the unsteered model, bit for bit
    # the steer moves the concept: sad at -4, happy at +4 (the toy's own lexicon score)
    assert res.summary[0]["concept"] == 0.0 and res.summary[2]["concept"] == 1.0


def test_one_batched_generate_carries_every_prompt_alpha_and_sample(toy_lm, vec, monkeypatch):
    calls = []
    original = type(toy_lm).generate

    def spy(self, prompts, steer=None, **kwargs):
        calls.append(len(prompts))
        return original(self, prompts, steer, **kwargs)

    monkeypatch.setattr(type(toy_lm), "generate", spy)
    # scored prompts continue from ones scored before (the engine's PromptStore), which moves
    # a perplexity in its last bits: each run starts from an empty store, so they are equal
    toy_lm.engine.prompt_store.clear()
    res = steerability(toy_lm, vec, PROMPTS, [-4, 0, 4, 8], samples=3, max_new_tokens=6,
                       seed=3, n_boot=50, progress=False)  # fmt: skip
    assert calls == [len(PROMPTS) * 3]
    assert res.alphas == [-4.0, 0.0, 4.0, 8.0]  # one call; its rows are prompts x samples x alphas
    assert len(res.rows) == 2 * 3 * 4 and [r["n"] for r in res.summary] == [6] * 4
    toy_lm.engine.prompt_store.clear()
    again = steerability(toy_lm, vec, PROMPTS, np.array([-4, 0, 4, 8]), samples=3, max_new_tokens=6,
                         seed=3, n_boot=50, progress=False)  # fmt: skip
    assert [r["text"] for r in again.rows] == [r["text"] for r in res.rows]
    assert again.summary == res.summary and res.seed == 3
    texts = res.texts(0.0)  # three samples per prompt differ: each repeat has its own stream
    assert len(texts) == 6 and len(set(texts[:3])) > 1
    with pytest.raises(KeyError, match="was not run"):
        res.texts(2.0)
    assert "perplexity" in repr(res) and "<table>" in res._repr_html_()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"alphas": []}, "alphas is empty"),
    ({"alphas": [0, 0]}, "repeat"),
    ({"alphas": [float("nan")]}, "finite"),
    ({"alphas": "048"}, "list of numbers"),
    ({"samples": 0}, "samples"),
    ({"level": 1.0}, "level"),
    ({"n_boot": 0}, "n_boot"),
    ({"concept": "sentiment"}, "concept must be"),
])  # fmt: skip
def test_bad_arguments_are_refused_before_any_generation(toy_lm, vec, monkeypatch, kwargs,
                                                         message):  # fmt: skip
    def refuse(*args, **kw):
        raise AssertionError("generated before checking its arguments")

    monkeypatch.setattr(type(toy_lm), "generate", refuse)
    args = {"alphas": [0, 4], **kwargs}
    with pytest.raises((ValueError, TypeError), match=message):
        steerability(toy_lm, vec, PROMPTS, **args)


@pytest.mark.parametrize("answer", [np.float32(0.5), np.float64(0.5), torch.tensor(0.5), 0.5])
def test_a_scorer_may_answer_any_real_number(toy_lm, vec, answer):
    res = steerability(toy_lm, vec, PROMPTS, [0, 4], concept=lambda text: answer,
                       max_new_tokens=3, n_boot=10, progress=False)  # fmt: skip
    assert [r["concept"] for r in res.summary] == [0.5, 0.5]
    assert all(type(r["concept"]) is float for r in res.rows)


def test_a_scorer_may_say_nan_for_no_evidence(toy_lm, vec):
    res = steerability(toy_lm, vec, PROMPTS, [0, 4], concept=lambda text: np.float32("nan"),
                       max_new_tokens=3, n_boot=10, progress=False)  # fmt: skip
    assert all(math.isnan(r["concept"]) for r in res.summary)


@pytest.mark.parametrize(("answer", "named"), [
    (None, "NoneType None"),
    ("0.5", "str '0.5'"),
    (True, "bool True"),
    ([0.5], "list [0.5]"),
    (np.array([0.5, 0.5]), "ndarray array([0.5, 0.5])"),
    (float("inf"), "float inf"),
    (np.float32("-inf"), "float32 np.float32(-inf)"),
])  # fmt: skip
def test_a_scorer_that_answers_no_number_is_refused_before_any_generation(
    toy_lm, vec, monkeypatch, answer, named
):
    def refuse(*args, **kw):
        raise AssertionError("generated before checking the scorer's answer")

    monkeypatch.setattr(type(toy_lm), "generate", refuse)
    with pytest.raises(
        TypeError, match=rf"concept must return .*it returned {re.escape(named)} for"
    ):
        steerability(toy_lm, vec, PROMPTS, [0, 4], concept=lambda text: answer, progress=False)


def test_a_scorer_that_fails_on_one_completion_names_it(toy_lm, vec):
    def scorer(text: str) -> float | None:
        return None if text != PROMPTS[0] else 0.5  # fine on the probe, not on completions

    with pytest.raises(TypeError, match="it returned NoneType None for"):
        steerability(toy_lm, vec, PROMPTS, [0, 4], concept=scorer, max_new_tokens=3,
                     progress=False)  # fmt: skip


def test_steers_are_refused_by_what_is_wrong(toy_lm, vec):
    with pytest.raises(sl.SteerError, match="needs a steer"):
        steerability(toy_lm, None, PROMPTS)
    with pytest.raises(sl.SteerError, match="list of alphas"):
        steerability(toy_lm, vec.steers(alpha=[1, 2]), PROMPTS)


def test_a_steer_alpha_multiplies_like_a_vector_scale(toy_lm, vec):
    steer = sl.Steer(SITE, vec.directions[SITE], alpha=2.0)
    a = steerability(toy_lm, steer, PROMPTS, [1.0, 3.0], temperature=0, max_new_tokens=8,
                     n_boot=10, progress=False)  # fmt: skip
    b = steerability(toy_lm, 2 * vec, PROMPTS, [1.0, 3.0], temperature=0, max_new_tokens=8,
                     n_boot=10, progress=False)  # fmt: skip
    assert [r["text"] for r in a.rows] == [r["text"] for r in b.rows]


def test_mean_interval_matches_scipys_percentile_bootstrap():
    scipy_stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(7).normal(1.0, 2.0, size=40)
    ours = mean_interval(list(x), n_boot=20_000, seed=1)
    theirs = scipy_stats.bootstrap((x,), np.mean, n_resamples=20_000, method="percentile",
                                   confidence_level=0.95, rng=2).confidence_interval  # fmt: skip
    assert ours.value == pytest.approx(x.mean())
    assert ours.low == pytest.approx(theirs.low, abs=0.05)
    assert ours.high == pytest.approx(theirs.high, abs=0.05)


def test_intervals_say_nothing_from_one_value_and_skip_nan():
    one = mean_interval([0.3, math.nan])
    assert one.value == 0.3 and math.isnan(one.low) and math.isnan(one.high)
    assert math.isnan(mean_interval([math.nan]).value)
    ppl = perplexity_interval([(2.0, 2), (4.0, 2)], n_boot=500)
    assert ppl.value == pytest.approx(math.exp(6 / 4))
    assert math.exp(2 / 2) <= ppl.low <= ppl.value <= ppl.high <= math.exp(4 / 2)


def test_trade_off_figure_draws_the_summary(toy_lm, vec):
    res = steerability(toy_lm, vec, PROMPTS, [-4, 0, 4], concept=concept_score, samples=4,
                       max_new_tokens=10, n_boot=100, progress=False)  # fmt: skip
    fig = sl.plots.steerability(res)
    rows = [r for r in res.summary if not math.isnan(r["concept"])]
    line = fig.data[0]
    assert list(line.x) == [r["perplexity"] for r in rows]
    assert list(line.y) == [r["concept"] for r in rows]
    assert list(line.text) == [f"α={r['alpha']:g}" for r in rows]
    highs = [0.0 if math.isnan(r["concept_high"]) else r["concept_high"] - r["concept"]
             for r in rows]  # fmt: skip
    assert list(line.error_y.array) == pytest.approx(highs)
    assert fig.data[1].name == "unsteered" and fig.data[1].x[0] == res.summary[1]["perplexity"]


def test_trade_off_figure_leaves_room_for_the_alpha_labels_over_its_highest_points():
    """The labels sit above each point; an axis sized to the data alone clipped the top ones."""
    from steerlab.plots.steerability import steerability_tradeoff

    summary = [{"alpha": a, "concept": c, "concept_low": c - 0.1, "concept_high": min(c + 0.1, 1.0),
                "perplexity": p} for a, c, p in [(0, 0.5, 3.0), (2, 1.0, 3.5), (4, 1.0, 80.0)]]  # fmt: skip
    fig = steerability_tradeoff(summary)
    low, high = fig.layout.yaxis.range
    assert high >= 1.0 + 0.1 * (1.0 - 0.4) and low < 0.4
    assert fig.data[0].cliponaxis is False
    assert fig.layout.legend.yref == "container"  # under the axis title, not over it


# --- the judge -------------------------------------------------------------------------


def _fake_judge(replies: dict[str, str], seen: list[dict]):
    """An OpenAI-compatible chat endpoint replying by criterion (which the question names)."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        body = await request.json()
        seen.append({"body": body, "auth": request.headers.get("authorization")})
        question = body["messages"][0]["content"]
        which = ("concept" if "about a given concept" in question
                 else "instruction" if "topic of the request" in question else "fluency")  # fmt: skip
        text = question.split("<<<\n")[-1]
        reply = replies[which](text) if callable(replies[which]) else replies[which]
        return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": reply}}]}  # fmt: skip

    return app


def test_judge_rates_axbench_style_with_the_harmonic_mean(toy_lm, vec):
    from steerlab.server.background import serve_in_background

    seen: list[dict] = []
    replies = {
        "concept": lambda text: "It is happy.\nRating: 2" if "smiled" in text else "Rating: 0",
        "instruction": "It continues the story.\n**Rating: [[1]]**",
        "fluency": "Readable. Rating: 2",
    }
    with serve_in_background(_fake_judge(replies, seen)) as url:
        judge = Judge(f"{url}/v1", "judge-model", api_key="k", max_workers=3)
        assert judge.rate("happiness", "Tell me a story", "Mia smiled.") == (2.0, 1.0, 2.0)
        assert judge.rate("happiness", "p", "Mia cried.") == (0.0, 1.0, 2.0)
        res = steerability(toy_lm, vec, PROMPTS, [0, 6], concept=judge.concept("happiness"),
                           max_new_tokens=10, samples=2, n_boot=50, progress=False)  # fmt: skip
    body = seen[0]["body"]
    assert body["model"] == "judge-model" and body["temperature"] == 0
    assert body["messages"][0]["role"] == "user" and seen[0]["auth"] == "Bearer k"
    assert res.metrics == ("concept", "instruction", "fluency", "judge")
    assert res.headline == "judge"
    for row in res.rows:
        want = 2.0 if "smiled" in row["text"] else 0.0
        assert row["concept"] == want
        assert row["judge"] == pytest.approx(statistics.harmonic_mean([want, 1.0, 2.0]))
    assert "judge" in repr(res.table())
    assert len(seen) == 2 * 3 + len(res.rows) * 3  # three questions per completion


def test_judge_errors_name_what_went_wrong():
    from steerlab.server.background import serve_in_background

    seen: list[dict] = []
    replies = {"concept": "I think it is fine.", "instruction": "Rating: 1", "fluency": "Rating: 1"}
    with serve_in_background(_fake_judge(replies, seen)) as url:
        concept, instruction, fluency = Judge(f"{url}/v1", "m").rate("the sea", "p", "text")
        assert math.isnan(concept) and (instruction, fluency) == (1.0, 1.0)  # unreadable: nan
        with pytest.raises(JudgeError, match="answered 404"):
            Judge(f"{url}/v2", "m").ask("hi")
    with pytest.raises(JudgeError, match="did not answer"):
        Judge(url + "/v1", "m", timeout=2, max_retries=0).ask("hi")  # the server is gone
    with pytest.raises(ValueError, match="http"):
        Judge("localhost:8000", "m")
    with pytest.raises(ValueError, match="non-empty"):
        Judge("http://127.0.0.1:1/v1", "m").concept(" ")


def test_judge_speaks_to_a_steerlab_server(toy_lm):
    """steerlab's own OpenAI-compatible chat endpoint takes the judge's requests. The toy model
    answers stories, not ratings, which is refused by name; its 128-token window cannot hold
    a rating question, and the server's 400 saying so reaches the user."""
    from server_helpers import KEY, served

    with served(toy_lm) as url:
        judge = Judge(f"{url}/v1", "steerlab-tiny", api_key=KEY, max_tokens=8)
        reply = judge.ask("Rate this.")
        assert isinstance(reply, str)
        assert parse_rating(judge.ask("Once upon a time")) is None  # a story, not a rating
        with pytest.raises(JudgeError, match="answered 400.*context window"):
            judge.rate("happiness", "p", "Mia smiled.")


def test_judge_retries_rate_limits_and_passing_errors_but_not_refusals():
    from fastapi.responses import JSONResponse

    from steerlab.server.background import serve_in_background

    answers: list[int] = []  # the statuses to answer with, in order; then 200
    calls: list[int] = []
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        calls.append(1)
        if answers:
            return JSONResponse({"error": "busy"}, status_code=answers.pop(0),
                                headers={"Retry-After": "0"})  # fmt: skip
        return {"choices": [{"message": {"role": "assistant", "content": "Rating: 1"}}]}

    with serve_in_background(app) as url:
        judge = Judge(f"{url}/v1", "m", max_retries=2)
        answers[:] = [429, 503]
        assert judge.ask("q") == "Rating: 1" and len(calls) == 3  # two retries, then the answer
        calls.clear()
        answers[:] = [429, 429, 429]
        with pytest.raises(JudgeError, match="answered 429"):
            judge.ask("q")
        assert len(calls) == 3  # the first try and max_retries more
        calls.clear()
        answers[:] = [400]
        with pytest.raises(JudgeError, match="answered 400"):
            judge.ask("q")
        assert len(calls) == 1  # a refusal is final
    with pytest.raises(ValueError, match="max_retries"):
        Judge(url, "m", max_retries=-1)
