"""``sl.evals.benchmark`` (AxBench's protocol) against things steerlab did not write.

- the aggregation and the factor choice against a stub OpenAI-compatible judge in a test
  thread, whose ratings follow rules written here, recomputed here in plain Python from the
  samples' texts (per-sample harmonic mean, the selection split's argmax factor, the test
  split's mean at it, the leaderboard's mean over concepts, the parse failures);
- ``parse_rating`` against AxBench's rule transcribed here;
- detection against ``sklearn.metrics.roc_auc_score`` on scores recomputed here from plain
  transformers;
- on the toy, with ``ToyJudge``: the random control against unsteered generations, and mean
  difference against the random control;
- bad input refused by name before any compute.
"""

from __future__ import annotations

import math
import re
import socket
from collections import Counter

import pytest
import torch
from fastapi import FastAPI, Request
from helpers import NoGeneration

import steerlab as sl
from steerlab.evals import Judge, JudgeError
from steerlab.evals.checks import PROBE
from steerlab.evals.detection import max_latents, token_activations
from steerlab.evals.judge import parse_rating
from steerlab.evals.methods import BUILT_IN

SITE = "blocks.2.hook_resid_pre"
BLOCK = 2  # SITE is the input of transformer.h[2]
HAPPY = ["Mia smiled and sang.", "Tom laughed, glad and warm.", "The day was bright and happy.",
         "Lily felt cheerful and smiled."]  # fmt: skip
SAD = ["Mia cried and sighed.", "Tom frowned, scared and cold.", "The day was gloomy and sad.",
       "Lily felt lonely and cried."]  # fmt: skip
SEA = ["The waves rolled over the sand.", "The boats rocked in the harbor.",
       "Gulls flew over the sea.", "The tide rose on the shore."]  # fmt: skip
FOREST = ["The owl hooted in the woods.", "Pines stood in the forest.",
          "A trail wound through the grove.", "Moss grew in the glade."]  # fmt: skip
ASKS = ["Tell me a story about the sea.", "Tell me a story about the forest.",
        "Tell me a story about the beach.", "Tell me a story about the woods.",
        "Tell me a story.", "Tell me a happy story."]  # fmt: skip
UNREAD = "Tell me a story about the woods."  # the stub rates its relevance unreadably
WRITTEN = "Always talk about {concept}."  # the stub's written prompt


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StubRater:
    """A judge object with no server: rates everything 2 (for bad-input tests)."""

    def rate(self, concept, instruction, text):
        return 2.0, 2.0, 2.0


# --- the stub judge's rules (the test's own) ---------------------------------------------

CONCEPT_WORDS = {"happy", "smiled", "glad", "sea", "waves", "sang", "laughed", "shore"}


def rule(criterion: str, concept: str, instruction: str, text: str) -> tuple[str, float | None]:
    """The stub's reply and the rating the test expects from it (None: unreadable)."""
    if criterion == "concept":  # 0.5, 1, 1.5 or 2 by the concept words the text uses
        hits = sum(w.strip(".,!?'\"").lower() in CONCEPT_WORDS for w in text.split())
        value = 0.5 + 0.5 * min(hits, 3)
        return f"It uses {hits} of the words.\nRating: [[{value:g}]]", value
    if criterion == "instruction":  # by the instruction: no Rating: line, 2 or 1
        if instruction == UNREAD:
            return "It is hard to say how it relates.", None
        value = 2.0 if "sea" in instruction or "beach" in instruction else 1.0
        return f"Rating: 0 would be wrong here.\nSo: Rating: **{value:g}**.\nThanks.", value
    if len(text) % 5 == 0:  # fluency: out of range for some texts, by their length
        return "Rating: 3", None
    return "Fluent.\nRating: 2", 2.0


def stub_judge(seen: list[tuple[str, str, str]]) -> FastAPI:
    """An OpenAI-compatible chat endpoint answering by ``rule``. The criterion is told apart
    by ``sl.evals.Judge``'s own question wording, the texts by its ``<<<``/``>>>`` fences."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        body = await request.json()
        question = body["messages"][0]["content"]
        fenced = re.findall(r"<<<\n(.*?)\n>>>", question, flags=re.S)
        if question.startswith("Write a short instruction"):
            concept = re.search(r"Concept: (.*)\n", question).group(1)
            seen.append(("write", concept, ""))
            reply = WRITTEN.format(concept=concept)
        elif "about a given concept" in question:
            concept = re.search(r"Concept: (.*)\n", question).group(1)
            seen.append(("concept", concept, fenced[0]))
            reply = rule("concept", concept, "", fenced[0])[0]
        elif "topic of the request" in question:
            instruction, text = fenced
            seen.append(("instruction", instruction, text))
            reply = rule("instruction", "", instruction, text)[0]
        else:
            (text,) = fenced
            seen.append(("fluency", "", text))
            reply = rule("fluency", "", "", text)[0]
        return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": reply}}]}  # fmt: skip

    return app


def _expected(sample: dict) -> tuple[list[float | None], float]:
    ratings = [rule(c, sample["concept"], sample["instruction"], sample["text"])[1]
               for c in ("concept", "instruction", "fluency")]  # fmt: skip
    values = [0.0 if r is None else r for r in ratings]
    score = 0.0 if 0.0 in values else 3.0 / sum(1.0 / v for v in values)
    return ratings, score


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _extract(lm, data, site):
    return sl.extract(lm, list(data.positives), list(data.negatives), [site], token="mean",
                      progress=False)  # fmt: skip


# --- aggregation and factor choice ------------------------------------------------------


@pytest.fixture(scope="module")
def stubbed(toy_lm):
    """One benchmark run rated by the stub judge: two concepts, a vector method over three
    factors, a written prompt and a judge-written prompt. Greedy, so the texts can be
    regenerated one factor at a time."""
    from steerlab.server.background import serve_in_background

    concepts = [
        sl.evals.ConceptData("happiness", positives=HAPPY, negatives=SAD, instructions=ASKS[:4]),
        sl.evals.ConceptData("the sea", positives=SEA, negatives=FOREST, instructions=ASKS[3:6]),
    ]
    methods = [
        sl.evals.Method(
            "vector", make=_extract, factors=[0.0, 6.0, 14.0], needs=("positives", "negatives")
        ),  # fmt: skip
        sl.evals.Prompting(),  # the judge writes the prompt
        sl.evals.Prompting("Be cheerful.", name="told"),
    ]
    seen: list[tuple[str, str, str]] = []
    with serve_in_background(stub_judge(seen)) as url:
        judge = Judge(f"{url}/v1", "stub", max_workers=8)
        result = sl.evals.benchmark(toy_lm, concepts, methods, site=SITE, judge=judge,
                                    selection=0.5, max_new_tokens=10, temperature=0.0, seed=0,
                                    n_boot=200, progress=False)  # fmt: skip
    return result, concepts, methods, seen


def test_every_sample_is_rated_by_the_protocols_rule(stubbed):
    result, concepts, methods, seen = stubbed
    samples = result.samples
    want = {("vector", "happiness"): 3 * 4, ("vector", "the sea"): 3 * 3, ("prompt", "happiness"): 4,
            ("prompt", "the sea"): 3, ("told", "happiness"): 4, ("told", "the sea"): 3}  # fmt: skip
    assert Counter((s["method"], s["concept"]) for s in samples) == want
    failures = 0
    for s in samples:
        data = next(d for d in concepts if d.name == s["concept"])
        i = s["instruction_index"]
        assert s["instruction"] == data.instructions[i]
        assert s["split"] == ("selection" if i < math.floor(len(data.instructions) * 0.5)
                              else "test")  # fmt: skip
        ratings, score = _expected(s)
        got = [s["concept_rating"], s["instruction_rating"], s["fluency_rating"]]
        assert got == [0.0 if r is None else r for r in ratings]  # unreadable: 0
        assert s["parse_failed"] == (None in ratings)
        assert s["score"] == pytest.approx(score)
        failures += sum(r is None for r in ratings)
    assert failures > 0 and result.parse_failures == failures  # counted, not a crash
    assert any(s["parse_failed"] for s in samples if s["instruction"] == UNREAD)
    # the judge saw each sample's own text, three questions each
    # and one fixed text before any generation: the judge's model really rates (PROBE)
    probe = [(kind, t) for kind, _, t in seen if t == PROBE[2]]
    assert probe == [("concept", PROBE[2]), ("instruction", PROBE[2]), ("fluency", PROBE[2])]
    rated = Counter(t for kind, _, t in seen if kind == "concept" and t != PROBE[2])
    assert rated == Counter(s["text"] for s in samples)
    assert Counter(kind for kind, _, t in seen if t != PROBE[2])["instruction"] == len(samples)


def test_the_factor_is_chosen_on_the_selection_split_and_scored_on_the_test_split(stubbed):
    result, concepts, methods, _ = stubbed
    assert len(result.table) == len(methods) * len(concepts)
    by_hand = {}
    for row in result.table:
        mine = [s for s in result.samples
                if s["method"] == row["method"] and s["concept"] == row["concept"]]  # fmt: skip
        n = len(next(d for d in concepts if d.name == row["concept"]).instructions)
        first = math.floor(n * 0.5)
        scores = {}  # factor -> [(instruction index, hand score)]
        for s in mine:
            scores.setdefault(s["factor"], []).append((s["instruction_index"], _expected(s)[1]))
        selection = {f: _mean([x for i, x in v if i < first]) for f, v in scores.items()}
        best = max(selection.values())
        assert row["factor"] in [f for f, x in selection.items() if x == best]
        assert row["selection"] == pytest.approx(best)
        test = [s for s in mine if s["factor"] == row["factor"] and s["instruction_index"] >= first]
        assert row["n"] == len(test) == n - first
        assert row["score"] == pytest.approx(_mean([_expected(s)[1] for s in test]))
        for k, name in enumerate(("concept_rating", "instruction_rating", "fluency_rating")):
            values = [_expected(s)[0][k] for s in test]
            assert row[name] == pytest.approx(_mean([0.0 if v is None else v for v in values]))
        by_hand[(row["method"], row["concept"])] = _mean([_expected(s)[1] for s in test])
    # the choice mattered somewhere: the vector's selection means differ across factors
    vector = [s for s in result.samples if s["method"] == "vector"]
    assert len({_expected(s)[1] for s in vector}) > 1
    # the leaderboard: the mean over concepts, best first, inside its interval
    board = list(result.leaderboard)
    assert [r["method"] for r in board] == sorted([m.name for m in methods],
                                                  key=lambda m: -_mean([by_hand[(m, d.name)]
                                                                        for d in concepts]))  # fmt: skip
    for r in board:
        assert r["score"] == pytest.approx(_mean([by_hand[(r["method"], d.name)]
                                                  for d in concepts]))  # fmt: skip
        assert r["low"] <= r["score"] <= r["high"] and r["concepts"] == 2


def test_each_row_is_the_text_its_factor_and_instruction_generate(stubbed, toy_lm):
    """Greedy: the benchmark's one call per method equals one ``lm.generate`` per factor."""
    result, concepts, _, _ = stubbed
    data = concepts[0]
    vec = result.steers[("vector", data.name)]
    for factor in (0.0, 14.0):
        steer = vec * factor if factor else None
        alone = toy_lm.generate(list(data.instructions), steer=steer, max_new_tokens=10,
                                temperature=0.0, chat=True).text  # fmt: skip
        mine = sorted((s for s in result.samples if s["method"] == "vector"
                       and s["concept"] == data.name and s["factor"] == factor),
                      key=lambda s: s["instruction_index"])  # fmt: skip
        assert [s["text"] for s in mine] == alone
    assert result.steers[("prompt", data.name)] is None


def test_the_prompting_arms_feed_their_prompt_with_the_template(stubbed):
    result, concepts, _, seen = stubbed
    writes = [c for kind, c, _ in seen if kind == "write"]
    assert sorted(writes) == sorted(d.name for d in concepts)  # one written prompt per concept
    for s in result.samples:
        if s["method"] == "prompt":
            prompt = WRITTEN.format(concept=s["concept"])
        elif s["method"] == "told":
            prompt = "Be cheerful."
        else:
            assert s["model_input"] == s["instruction"]
            continue
        assert s["model_input"] == f"{prompt}\n\nQuestion: {s['instruction']}"
        assert s["factor"] == 1.0


def test_a_judge_written_prompt_is_not_replaced_by_another_arms_given_prompt(toy_lm):
    """Two prompting arms: the one with a given prompt comes first, the judge writes the
    other's. Each arm must feed its own prompt."""

    class Writer(StubRater):
        def write_prompt(self, concept):
            return f"Always talk about {concept}."

    data = sl.evals.ConceptData("happiness", instructions=ASKS[:2])
    methods = [sl.evals.Prompting("Be cheerful.", name="told"), sl.evals.Prompting()]
    result = sl.evals.benchmark(toy_lm, [data], methods, site=SITE, judge=Writer(),
                                max_new_tokens=2, n_boot=10, progress=False)  # fmt: skip
    inputs = {s["method"]: s["model_input"].split("\n\n")[0] for s in result.samples}
    assert inputs == {"told": "Be cheerful.", "prompt": "Always talk about happiness."}


# --- the judge's parse rule --------------------------------------------------------------


def axbench_rating(reply: str) -> float | None:
    """AxBench's rule, transcribed from axbench/evaluators/lm_judge.py: the text after the
    last ``Rating:``, stripped, its first line, brackets removed, then a trailing full stop,
    quotes and stars stripped; a float in [0, 2], else nothing."""
    if "Rating:" not in reply:
        return None
    text = reply.split("Rating:")[-1].strip()
    text = text.split("\n")[0].strip()
    text = text.replace("[", "").replace("]", "")
    text = text.rstrip(".").strip('"').strip("'").strip("*").strip()
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value <= 2 else None


REPLIES = [
    ("Rating: 2", 2.0),
    ("It mentions the sea.\nRating: [[1]]", 1.0),
    ("Rating: **1.5**", 1.5),
    ("Rating: 1.", 1.0),
    ('Rating: "2"', 2.0),
    ("Rating: '0'", 0.0),
    ("Rating: [2]", 2.0),
    ("Rating: 0 at first glance.\nOn reflection, Rating: 2\nThat is all.", 2.0),  # the last
    ("Rating: 2\n1", 2.0),  # the first line after it
    ("Rating:\n1", 1.0),  # stripped before the first line is taken
    ("**Rating:** 1", 1.0),
    ("Rating: .5", 0.5),  # the full stop is stripped from the right only
    ("Rating: [[1]].", 1.0),
    ("Rating: 3", None),  # out of range
    ("Rating: -1", None),
    ("Rating: two", None),
    ("Rating: 2 out of 2", None),
    ("rating: 2", None),  # the rule reads "Rating:" only
    ("I would give it a 2.", None),
    ("Rating:", None),
    ("", None),
]  # fmt: skip


@pytest.mark.parametrize(("reply", "want"), REPLIES)
def test_parse_rating_follows_axbenchs_rule(reply, want):
    assert axbench_rating(reply) == want  # the transcription reads the cases as listed
    assert parse_rating(reply) == want


def test_judge_rate_reads_each_criterion_by_the_rule_and_says_nan_for_unreadable(toy_lm):
    from steerlab.server.background import serve_in_background

    replies = iter([])
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        return {"choices": [{"message": {"role": "assistant", "content": next(replies)}}]}

    with serve_in_background(app) as url:
        judge = Judge(f"{url}/v1", "stub", max_retries=0)
        cases = [REPLIES[i : i + 3] for i in range(0, len(REPLIES) - 2, 3)]
        for case in cases:
            replies = iter([r for r, _ in case])
            got = judge.rate("happiness", "Tell me a story.", "Mia smiled.")
            assert len(got) == 3 and all(isinstance(x, float) for x in got)
            for value, (_, want) in zip(got, case):
                assert (math.isnan(value) and want is None) or value == want


# --- detection ---------------------------------------------------------------------------


def test_roc_auc_equals_sklearn_with_ties():
    metrics = pytest.importorskip("sklearn.metrics")
    g = torch.Generator().manual_seed(0)
    for n_pos, n_neg in [(1, 1), (5, 9), (40, 23)]:
        pos = torch.randint(0, 6, (n_pos,), generator=g).double() / 2  # many ties
        neg = torch.randint(0, 5, (n_neg,), generator=g).double() / 2
        labels = [1] * n_pos + [0] * n_neg
        want = metrics.roc_auc_score(labels, pos.tolist() + neg.tolist())
        assert sl.evals.roc_auc(pos, neg) == pytest.approx(want, abs=1e-12)
        assert sl.evals.roc_auc(pos.tolist(), neg.tolist()) == pytest.approx(want, abs=1e-12)


def plain_latents(hf, tokenizer, texts: list[str], direction: torch.Tensor) -> list[float]:
    """Each text's max over its tokens after the BOS of h·v̂ at block 2's input, from plain
    transformers' hidden states (hidden_states[2] is block 2's input). One forward, padded on
    the right: a causal model's real tokens never see the pads after them."""
    unit = direction.double() / direction.double().norm()
    ids = [tokenizer(text)["input_ids"] for text in texts]
    assert all(row[0] == tokenizer.bos_token_id for row in ids)
    width = max(map(len, ids))
    batch = torch.tensor([row + [0] * (width - len(row)) for row in ids])
    with torch.no_grad():
        h = hf(batch, output_hidden_states=True).hidden_states[BLOCK].double()  # [n, pos, d]
    return [float((h[i, 1 : len(row)] @ unit).max()) for i, row in enumerate(ids)]


def test_detection_equals_sklearn_on_scores_from_plain_transformers(stubbed, toy_hf):
    metrics = pytest.importorskip("sklearn.metrics")
    result, concepts, _, _ = stubbed
    rows = {(r["method"], r["concept"]): r for r in result.detection}
    assert set(rows) == {("vector", d.name) for d in concepts}  # prompting has no direction
    from transformers import AutoTokenizer

    from steerlab.toy import asset_path

    tokenizer = AutoTokenizer.from_pretrained(asset_path("steerlab-tiny"))
    for data in concepts:
        vec = result.steers[("vector", data.name)]
        direction = vec.directions[SITE]
        pos = plain_latents(toy_hf, tokenizer, list(data.positives), direction)
        neg = plain_latents(toy_hf, tokenizer, list(data.negatives), direction)
        want = metrics.roc_auc_score([1] * len(pos) + [0] * len(neg), pos + neg)
        row = rows[("vector", data.name)]
        assert row["auroc"] == pytest.approx(want, abs=1e-12) and row["n"] == len(pos + neg)


# --- on the toy --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_run(toy_lm):
    """mean difference and the random control on the toy's sentiment concept, judged by
    ToyJudge: happy and sad stories as ``steerlab.toy.concept_data`` writes them (no pairs:
    neither method reads them), and the toy's ten setting asks (five in the test split)."""
    import random

    from steerlab.toy import ToyJudge
    from steerlab.toy.corpus import make_story

    rng = random.Random(0)
    stories = {on: [make_story(rng, positive=on).text for _ in range(12)] for on in (True, False)}
    asks = [f"Tell me a story about the {p}." for p in
            ("sea", "forest", "beach", "woods", "shore", "grove", "ocean", "glade", "harbor",
             "trail")]  # fmt: skip
    data = sl.evals.ConceptData("happiness", positives=stories[True], negatives=stories[False],
                                instructions=asks)  # fmt: skip
    # the built-in methods' own steers, on a shorter grid than AxBench's 14 factors (the
    # random control chooses at its low end, mean difference below 1)
    grid = [0.2, 0.4, 0.6, 1.0, 2.0, 5.0]
    methods = [sl.evals.Method(name, make=BUILT_IN[name].make, factors=grid,
                               needs=BUILT_IN[name].needs) for name in ("mean_diff", "random")]  # fmt: skip
    result = sl.evals.benchmark(toy_lm, [data], methods, site=SITE, judge=ToyJudge(toy_lm),
                                max_new_tokens=16, seed=0, n_boot=200, progress=False)  # fmt: skip
    return result, data


def test_mean_difference_scores_above_the_random_control(toy_run):
    result, _ = toy_run
    score = {r["method"]: r["score"] for r in result.leaderboard}
    assert score["mean_diff"] > score["random"]
    assert [r["method"] for r in result.leaderboard][0] == "mean_diff"


def test_the_random_control_stays_within_a_tenth_of_unsteered(toy_run, toy_lm):
    """The measure: the toy's concept score (``steerlab.toy.concept_score``, the happy share
    of a text's sentiment words; a text with none counts 0, as ToyJudge rates it), averaged
    over stories for the test split's instructions, the random control's steer at the factor
    it chose against the unsteered model. Five test samples carry too much sampling noise
    to tell 0.1 apart, so each test instruction is asked 20 times here (100 stories each
    way), sampled as the benchmark samples (temperature 1, the run's seed); rows of one
    prompt share its random stream, so each steered story is paired with the unsteered
    story drawn with the same numbers, and what differs is the steer's doing."""
    from steerlab.toy import concept_score

    result, data = toy_run
    (row,) = [r for r in result.table if r["method"] == "random"]
    steer = result.steers[("random", data.name)]
    inputs = [s["instruction"] for s in result.samples
              if s["method"] == "random" and s["factor"] == row["factor"]
              and s["split"] == "test"] * 20  # fmt: skip
    assert len(inputs) == 100
    options = {"max_new_tokens": 16, "temperature": 1.0, "seed": 0, "chat": True}
    plain = toy_lm.generate(inputs, **options).text
    steered = toy_lm.generate(inputs, steer=steer * row["factor"], **options).text

    def score(texts: list[str]) -> float:
        values = [concept_score(t, "sentiment") for t in texts]
        return _mean([0.0 if math.isnan(v) else v for v in values])

    assert steered != plain  # the steer acts
    assert abs(score(steered) - score(plain)) <= 0.1, (score(steered), score(plain), row["factor"])


def test_toy_detection_equals_sklearn_on_scores_from_plain_transformers(toy_run, toy_hf):
    metrics = pytest.importorskip("sklearn.metrics")
    from transformers import AutoTokenizer

    from steerlab.toy import asset_path

    result, data = toy_run
    tokenizer = AutoTokenizer.from_pretrained(asset_path("steerlab-tiny"))
    aurocs = {r["method"]: r["auroc"] for r in result.detection}
    assert set(aurocs) == {"mean_diff", "random"}
    for method in ("mean_diff", "random"):
        direction = result.steers[(method, data.name)].directions[SITE]
        pos = plain_latents(toy_hf, tokenizer, list(data.positives), direction)
        neg = plain_latents(toy_hf, tokenizer, list(data.negatives), direction)
        want = metrics.roc_auc_score([1] * len(pos) + [0] * len(neg), pos + neg)
        assert aurocs[method] == pytest.approx(want, abs=1e-12)
    assert aurocs["mean_diff"] > 0.9 > aurocs["random"]


# --- bad input ---------------------------------------------------------------------------


def _data(**fields) -> sl.evals.ConceptData:
    return sl.evals.ConceptData("happiness", **{"instructions": ASKS[:4], **fields})


@pytest.mark.parametrize(("concepts", "methods", "match"), [
    (_data(), ["mean_diff"], r"'mean_diff' needs ConceptData\.positives.*'happiness'"),
    (_data(positives=HAPPY), ["pca"], r"'pca' needs ConceptData\.negatives"),
    (_data(positives=HAPPY, negatives=SAD), ["reps"], r"'reps' needs ConceptData\.pairs"),
    (_data(positives=HAPPY, negatives=SAD), ["random", "bipo"], r"'bipo' needs .*pairs"),
    (_data(instructions=ASKS[:1]), ["prompt"], r"'happiness' has 1 instruction.*at least 2"),
    (_data(), ["mean_dif"], r"Unknown method 'mean_dif'\. Did you mean 'mean_diff'\?"),
    (_data(), ["rep"], r"Did you mean 'reps'\?"),
    (_data(), [], r"methods must be a non-empty list"),
])  # fmt: skip
def test_bad_benchmark_input_is_refused_by_name_before_any_compute(toy_lm, monkeypatch,
                                                                   concepts, methods, match):  # fmt: skip
    NoGeneration.install(monkeypatch, toy_lm)
    with pytest.raises(sl.SteerError, match=match):
        sl.evals.benchmark(toy_lm, [concepts], methods, site=SITE, judge=StubRater(),
                           progress=False)  # fmt: skip
    assert toy_lm.hook_count() == 0


@pytest.mark.parametrize(("factors", "match"), [
    ([], "factors is empty"),
    ([1.0, math.nan], "finite"),
    ([math.inf], "finite"),
    ("123", "list of numbers"),
])  # fmt: skip
def test_a_method_refuses_empty_or_non_finite_factors_by_name(factors, match):
    with pytest.raises(sl.SteerError, match=rf"Method 'mine' factors.*{match}|{match}"):
        sl.evals.Method("mine", make=_extract, factors=factors)


def test_an_unreachable_judge_is_refused_before_any_compute(toy_lm, monkeypatch):
    NoGeneration.install(monkeypatch, toy_lm)
    judge = Judge(f"http://127.0.0.1:{_closed_port()}/v1", "gone", max_retries=0)
    data = _data(positives=HAPPY, negatives=SAD)
    with pytest.raises(JudgeError, match="unreachable"):  # after the window check: 8 fit
        sl.evals.benchmark(toy_lm, [data], ["mean_diff"], site=SITE, judge=judge,
                           max_new_tokens=8, progress=False)  # fmt: skip
    assert toy_lm.hook_count() == 0


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"selection": 1.0}, sl.SteerError, "selection must be a share"),
    ({"selection": 0.1}, sl.SteerError, "each split needs at least one"),
    ({"max_new_tokens": 0}, sl.SteerError, "max_new_tokens must be"),
    ({"judge": object()}, sl.SteerError, "judge must have rate"),
    # steerlab's window and site errors are its own ValueErrors, not SteerErrors
    ({"max_new_tokens": 200}, ValueError, "max_new_tokens=200.*context window of 128"),
    ({"site": "blocks.9.hook_resid_pre"}, ValueError, "Layer 9 is out of range"),
])  # fmt: skip
def test_bad_settings_are_refused_by_name_before_any_compute(toy_lm, monkeypatch, kwargs, error,
                                                            match):  # fmt: skip
    NoGeneration.install(monkeypatch, toy_lm)
    options = {"site": SITE, "judge": StubRater(), "progress": False, **kwargs}
    with pytest.raises(error, match=match):
        sl.evals.benchmark(toy_lm, [_data(positives=HAPPY, negatives=SAD)], ["mean_diff"],
                           **options)  # fmt: skip
    assert toy_lm.hook_count() == 0


# --- review mends -----------------------------------------------------------------------


class NumpyRater:
    """A judge that answers with numpy numbers: they are ratings like any others."""

    def rate(self, concept, instruction, text):
        import numpy as np

        return np.float32(1.0), np.float64(2.0), np.int64(2)


def test_numpy_ratings_are_read_as_numbers_not_failures(toy_lm):
    data = _data(positives=HAPPY, negatives=SAD)
    res = sl.evals.benchmark(toy_lm, [data], [sl.evals.Prompting("Be happy.")], site=SITE,
                             judge=NumpyRater(), max_new_tokens=4, progress=False)  # fmt: skip
    assert res.parse_failures == 0
    assert {(s["concept_rating"], s["instruction_rating"]) for s in res.samples} == {(1.0, 2.0)}
    assert res.table[0]["score"] == pytest.approx(3 / (1 + 0.5 + 0.5))


def test_a_negated_steer_detects_along_its_own_push(toy_lm, toy_hf):
    """Detection scores h·v̂ along the direction the steer pushes: for -v, the max over tokens
    of h·(-v̂), from plain transformers."""
    metrics = pytest.importorskip("sklearn.metrics")
    from transformers import AutoTokenizer

    from steerlab.toy import asset_path

    data = _data(positives=HAPPY + SEA, negatives=SAD + FOREST)
    minus = sl.evals.Method("minus", make=lambda lm, d, site: -_extract(lm, d, site),
                            factors=[1.0])  # fmt: skip
    res = sl.evals.benchmark(toy_lm, [data], [minus], site=SITE, judge=StubRater(),
                             max_new_tokens=2, progress=False)  # fmt: skip
    direction = -res.steers[("minus", data.name)].directions[SITE]
    tokenizer = AutoTokenizer.from_pretrained(asset_path("steerlab-tiny"))
    pos = plain_latents(toy_hf, tokenizer, list(data.positives), direction)
    neg = plain_latents(toy_hf, tokenizer, list(data.negatives), direction)
    # Texts that share their first words tie in exact arithmetic (their max is on the shared
    # prefix), and a padded batch moves each side by ~1e-7: the AUROC of such near-ties
    # hangs on rounding. So steerlab's own scores are checked against plain transformers'
    # to 1e-5, and its AUROC against sklearn's on those scores.
    ours = [max_latents(token_activations(toy_lm, list(texts), SITE), direction).tolist()
            for texts in (data.positives, data.negatives)]  # fmt: skip
    assert ours[0] + ours[1] == pytest.approx(pos + neg, abs=1e-5)
    want = metrics.roc_auc_score([1] * len(pos) + [0] * len(neg), ours[0] + ours[1])
    assert res.detection[0]["auroc"] == pytest.approx(want, abs=1e-12)
    plus = plain_latents(toy_hf, tokenizer, list(data.positives), -direction)
    assert want != pytest.approx(
        metrics.roc_auc_score(
            [1] * len(pos) + [0] * len(neg),
            plus + plain_latents(toy_hf, tokenizer, list(data.negatives), -direction),
        )
    )


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"temperature": -1.0}, "temperature must be"),
    ({"seed": "x"}, "seed must be an int"),
])  # fmt: skip
def test_bad_sampling_is_refused_before_any_method_is_made(toy_lm, monkeypatch, kwargs, match):
    NoGeneration.install(monkeypatch, toy_lm)
    made = []
    method = sl.evals.Method("m", make=lambda lm, d, site: made.append(1), factors=[1.0])
    with pytest.raises(ValueError, match=match):
        sl.evals.benchmark(toy_lm, [_data()], [method], site=SITE, judge=StubRater(),
                           progress=False, **kwargs)  # fmt: skip
    assert not made


def test_the_random_control_differs_between_concepts_that_share_a_prefix(toy_lm):
    from steerlab.evals.methods import _random

    one = _data(positives=HAPPY, negatives=SAD)
    two = sl.evals.ConceptData("happiness, strongly", positives=HAPPY, negatives=SAD,
                               instructions=ASKS[:4])  # fmt: skip
    a, b = (_random(toy_lm, d, SITE)[SITE] for d in (one, two))
    assert abs(float(torch.nn.functional.cosine_similarity(a, b, dim=0))) < 0.5
