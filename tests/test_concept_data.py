"""A concept's benchmark data: written by an LLM (``sl.evals.write_concept_data``), read from
AxBench's released layout (``ConceptData.from_axbench``), and written offline by the toy
(``steerlab.toy.ToyWriter``).

- ``from_axbench`` against a fixture folder in AxBench's layout, whose rows are literal data
  in ``fixtures/axbench_concept/write_fixture.py`` (pyarrow writes the files), with the
  expected rows selected here in plain Python by AxBench's rule (``scripts/train.py``);
- ``write_concept_data`` against stub writers: the counts, AxBench's genre shares, the
  writer's ``max_workers`` at once, empty replies and refusals asked again then reported, an
  unreachable writer and bad input refused before any request, pairs from the model's own
  greedy replies;
- the whole recipe on the toy: ``ToyWriter`` feeds a benchmark judged by ``ToyJudge``, and
  the README's real-model recipe runs with the toy's names put in.
"""

from __future__ import annotations

import re
import runpy
import socket
import threading
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

import steerlab as sl
from steerlab.core.errors import SteerError
from steerlab.core.writing import Question, question, read_question
from steerlab.evals import Judge, JudgeError

FIXTURE = Path(__file__).parent / "fixtures" / "axbench_concept"
ROWS = runpy.run_path(str(FIXTURE / "write_fixture.py"))
README = Path(__file__).parents[1] / "README.md"
SITE = "blocks.2.hook_resid_pre"
# AxBench's released columns (axbench/concept10/prod_2b_l10_v1, read with pandas)
AXBENCH_TRAIN = ["input", "output", "output_concept", "concept_genre", "category",
                 "dataset_category", "concept_id"]  # fmt: skip
AXBENCH_LATENT = [*AXBENCH_TRAIN, "sae_link", "sae_id"]
HAPPY_ASKS = ["Tell me a happy story.", "Tell me a sad story.", "Tell me a cheerful story.",
              "Tell me a gloomy story."]  # fmt: skip
OTHER_ASKS = ["Tell me a lovely story.", "Tell me a lonely story.", "Tell me a bright story.",
              "Tell me a scared story."]  # fmt: skip


# --- from_axbench ------------------------------------------------------------------------


def _expected(concept_id: int) -> tuple[str, list[str], list[str], list[str]]:
    """AxBench's selection, by hand: the concept's positive rows; the shared negatives
    (concept_id -1, output_concept EEEEE) of its first genre."""
    (meta,) = [m for m in ROWS["METADATA"] if m["concept_id"] == concept_id]
    name = meta["concept"]
    genre = meta["concept_genres_map"][name][0]
    pos = [r for r in ROWS["TRAIN"] if r[4] == "positive" and r[5] == concept_id]
    neg = [r[1] for r in ROWS["TRAIN"] if r[4] == "negative" and r[5] == -1 and r[2] == "EEEEE"
           and r[3] == genre]  # fmt: skip
    return name, [r[0] for r in pos], [r[1] for r in pos], neg


def test_the_fixture_is_axbenchs_layout_and_holds_the_literal_rows():
    import json

    import pyarrow.parquet as pq

    train = pq.read_table(FIXTURE / "generate" / "train_data.parquet")
    latent = pq.read_table(FIXTURE / "inference" / "latent_eval_data.parquet")
    assert train.column_names == AXBENCH_TRAIN and latent.column_names == AXBENCH_LATENT
    assert str(train.schema.field("concept_id").type) == "int64"
    rows = [tuple(r[c] for c in AXBENCH_TRAIN if c != "dataset_category")
            for r in train.to_pylist()]  # fmt: skip
    assert rows == ROWS["TRAIN"]
    assert set(train.column("dataset_category").to_pylist()) == {"instruction"}
    assert len(latent) == len(ROWS["LATENT"])
    lines = (FIXTURE / "generate" / "metadata.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == ROWS["METADATA"]


@pytest.mark.parametrize("concept_id", [0, 1, 2])
def test_from_axbench_equals_the_fixtures_rows(concept_id):
    name, inputs, outputs, negatives = _expected(concept_id)
    by_name = sl.evals.ConceptData.from_axbench(FIXTURE, concept=name)
    by_id = sl.evals.ConceptData.from_axbench(str(FIXTURE), concept_id=concept_id)
    for data in (by_name, by_id):
        assert data.name == name
        assert list(data.positives) == outputs
        assert list(data.negatives) == negatives
        assert list(data.instructions) == inputs
        assert data.pairs == ()
    assert len(negatives) == 2  # the fixture's shared negatives of one genre, of six


def test_from_axbench_keeps_given_instructions():
    data = sl.evals.ConceptData.from_axbench(FIXTURE, concept_id=1, instructions=HAPPY_ASKS)
    assert list(data.instructions) == HAPPY_ASKS


def test_from_axbench_pairs_each_positive_with_the_models_greedy_reply(toy_lm):
    from steerlab.core.prompts import rendered

    name, inputs, outputs, _ = _expected(0)
    data = sl.evals.ConceptData.from_axbench(FIXTURE, concept=name, lm=toy_lm, max_new_tokens=8)
    own = toy_lm.generate(inputs, max_new_tokens=8, temperature=0.0, chat=True).text
    want = [(rendered(toy_lm.tokenizer, i, chat=True), o, r)
            for i, o, r in zip(inputs, outputs, own)]  # fmt: skip
    assert [(p.prompt, p.chosen, p.rejected) for p in data.pairs] == want
    assert list(data.instructions) == inputs


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"concept": "references to the sea"},
     r"not in .*closest are \['references to the ocean'"),
    ({"concept_id": 7}, r"concept_id 7 is not in .*ids: 0 to 2"),
    ({}, "exactly one of concept="),
    ({"concept": "references to the ocean", "concept_id": 0}, "exactly one of concept="),
    ({"concept_id": "0"}, "concept_id must be an int"),
])  # fmt: skip
def test_from_axbench_refuses_an_unknown_concept_naming_the_closest(kwargs, match):
    with pytest.raises(SteerError, match=match):
        sl.evals.ConceptData.from_axbench(FIXTURE, **kwargs)


def test_from_axbench_refuses_a_folder_without_axbenchs_files(tmp_path):
    with pytest.raises(SteerError, match="not an AxBench dataset folder"):
        sl.evals.ConceptData.from_axbench(tmp_path, concept_id=0)


# --- the writer's questions ----------------------------------------------------------------


@pytest.mark.parametrize("asked", [Question("positive", "the sea", "Tell me a story.", "text", 1),
                                   Question("negative", "happiness", "Sum\n>> 2 and 2.", "math", 3),
                                   Question("negative", "the sea", "Print it.", "code", 1)])  # fmt: skip
def test_a_writers_question_reads_back_as_asked(asked):
    assert read_question(question(*vars(asked).values())) == asked


# --- write_concept_data against stub writers ----------------------------------------------


class Writer:
    """Answers every question with a reply that names its kind and request, and counts."""

    max_workers = 1

    def __init__(self, reply=None):
        self.asked: list[str] = []
        self.lock = threading.Lock()
        self.reply = reply or (lambda q, n: f"A {read_question(q).kind} reply number {n}.")

    def ask(self, text: str) -> str:
        with self.lock:
            self.asked.append(text)
            n = len(self.asked)
        return self.reply(text, n)


class Untouchable:
    max_workers = 1

    def ask(self, text: str) -> str:
        raise AssertionError("asked before refusing")


def test_write_concept_data_writes_the_counts_in_axbenchs_genre_shares():
    writer = Writer()
    data = sl.evals.write_concept_data("the sea", writer=writer, instructions=HAPPY_ASKS,
                                       n_positives=72, n_negatives=72, progress=False)  # fmt: skip
    assert (len(data.positives), len(data.negatives), len(data.pairs)) == (72, 72, 0)
    assert list(data.instructions) == HAPPY_ASKS
    asked = [read_question(q) for q in writer.asked]
    assert len(asked) == 144
    positives = [a for a in asked if a.kind == "positive"]
    negatives = [a for a in asked if a.kind == "negative"]
    assert len(positives) == len(negatives) == 72
    assert {a.concept for a in asked} == {"the sea"}
    # AxBench: int(0.15 n) math, as many code, the rest text (72 -> 10, 10, 52)
    genres = [a.genre for a in negatives]
    assert (genres.count("math"), genres.count("code"), genres.count("text")) == (10, 10, 52)
    # the requests are the instructions in turn; a repeated one asks for another version
    assert [a.instruction for a in positives] == [HAPPY_ASKS[i % 4] for i in range(72)]
    assert [a.version for a in positives] == [i // 4 + 1 for i in range(72)]
    assert len(set(writer.asked)) == 144
    assert set(data.positives) | set(data.negatives) == {writer.reply(q, i + 1)
                                                         for i, q in enumerate(writer.asked)}  # fmt: skip


def test_the_writer_answers_the_prompts_when_given():
    writer = Writer()
    data = sl.evals.write_concept_data("the sea", writer=writer, instructions=HAPPY_ASKS,
                                       prompts=OTHER_ASKS, n_positives=3, n_negatives=2,
                                       progress=False)  # fmt: skip
    assert {read_question(q).instruction for q in writer.asked} <= set(OTHER_ASKS)
    assert list(data.instructions) == HAPPY_ASKS


def test_requests_run_under_the_writers_max_workers():
    class Parallel(Writer):
        max_workers = 4

        def __init__(self):
            super().__init__()
            self.barrier = threading.Barrier(4)  # passes only when 4 asks are in flight at once
            self.now = self.most = self.entered = 0

        def ask(self, text):
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
                first, self.entered = self.entered < 4, self.entered + 1
            try:
                if first:
                    self.barrier.wait(timeout=60)
                return super().ask(text)
            finally:
                with self.lock:
                    self.now -= 1

    writer = Parallel()
    sl.evals.write_concept_data("the sea", writer=writer, instructions=HAPPY_ASKS,
                                n_positives=10, n_negatives=10, progress=False)  # fmt: skip
    assert writer.most == 4 and len(writer.asked) == 20


def test_empty_replies_and_refusals_are_asked_again():
    tries: dict[str, int] = {}

    def reply(q, n):
        tries[q] = tries.get(q, 0) + 1
        if tries[q] == 1:
            return "  " if read_question(q).kind == "positive" else "I'm sorry, I can't help."
        return f"reply {n}"

    writer = Writer(reply)
    writer.max_retries = 1
    data = sl.evals.write_concept_data("the sea", writer=writer, instructions=HAPPY_ASKS,
                                       n_positives=3, n_negatives=3, progress=False)  # fmt: skip
    assert set(tries.values()) == {2} and len(tries) == 6
    assert all(t.startswith("reply ") for t in (*data.positives, *data.negatives))


def test_replies_that_stay_empty_or_refused_are_reported_with_the_concept_and_count():
    def reply(q, n):
        asked = read_question(q)
        if asked.kind == "negative" and asked.genre == "text":  # 6 of 8 negatives (AxBench)
            return "As an AI, I cannot write that."
        return "" if asked.instruction == HAPPY_ASKS[1] and asked.kind == "positive" else "ok"

    writer = Writer(reply)
    writer.max_retries = 2
    with pytest.raises(JudgeError, match=r"to 7 of 12 requests for the concept 'the sea', each "
                                         r"asked 3 times"):  # fmt: skip
        sl.evals.write_concept_data("the sea", writer=writer, instructions=HAPPY_ASKS + OTHER_ASKS,
                                    n_positives=4, n_negatives=8, progress=False)  # fmt: skip
    assert len(writer.asked) == 5 + 7 * 3


def test_a_judge_writes_over_http_with_the_judges_retry_rules():
    """``sl.evals.Judge`` is a writer: its ``ask`` over an OpenAI-compatible endpoint, each
    request answered 503 once (retried after the server's Retry-After), then a reply."""
    from steerlab.server.background import serve_in_background

    app, seen = FastAPI(), []

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "stub", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        text = (await request.json())["messages"][0]["content"]
        seen.append(text)
        if seen.count(text) == 1:
            return JSONResponse({"error": "busy"}, status_code=503, headers={"Retry-After": "0"})
        asked = read_question(text)
        reply = f"{asked.kind} {asked.genre} answer to {asked.instruction}"
        return {"id": "x", "object": "chat.completion", "created": 0, "model": "stub",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": reply}}]}  # fmt: skip

    with serve_in_background(app) as url:
        judge = Judge(f"{url}/v1", "stub", max_workers=4, max_retries=1)
        data = sl.evals.write_concept_data("the sea", writer=judge, instructions=HAPPY_ASKS,
                                           n_positives=4, n_negatives=7, progress=False)  # fmt: skip
    assert len(seen) == 2 * 11 and len(set(seen)) == 11
    assert list(data.positives) == [f"positive text answer to {a}" for a in HAPPY_ASKS]
    genres = sorted(t.split(" ")[1] for t in data.negatives)
    assert genres == ["code", "math"] + ["text"] * 5  # int(7 × 0.15) = 1 each


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_writer_is_refused_before_any_work(toy_lm, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("generated before refusing")

    monkeypatch.setattr(type(toy_lm), "generate", never)
    writer = Judge(f"http://127.0.0.1:{_closed_port()}/v1", "gone", max_retries=0)
    monkeypatch.setattr(writer, "ask", Untouchable().ask)
    with pytest.raises(JudgeError, match="unreachable"):
        sl.evals.write_concept_data("the sea", writer=writer, instructions=HAPPY_ASKS,
                                    lm=toy_lm, progress=False)  # fmt: skip


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"n_positives": 0}, "n_positives must be an int >= 1"),
    ({"n_negatives": 2.0}, "n_negatives must be an int >= 1"),
    ({"n_positives": True}, "n_positives must be an int >= 1"),
    ({"instructions": "Tell me a story."}, "instructions must be a list"),
    ({"instructions": []}, "instructions must hold at least one"),
    ({"instructions": ["ok", " "]}, r"instructions\[1\] must be a non-empty string"),
    ({"prompts": []}, "prompts must hold at least one"),
    ({"concept": ""}, "concept must be a non-empty string"),
    ({"writer": object()}, "writer must have ask"),
    ({"max_new_tokens": 0}, "max_new_tokens must be an int >= 1"),
    ({"progress": "yes"}, "progress must be True or False"),
])  # fmt: skip
def test_bad_input_is_refused_by_name_before_any_request(kwargs, match):
    args = {"concept": "the sea", "writer": Untouchable(), "instructions": HAPPY_ASKS,
            "progress": False, **kwargs}  # fmt: skip
    concept = args.pop("concept")
    with pytest.raises(SteerError, match=match):
        sl.evals.write_concept_data(concept, **args)


def test_the_pairs_are_a_positive_against_the_models_own_greedy_reply(toy_lm):
    from steerlab.core.prompts import rendered

    writer = Writer(lambda q, n: f"The waves rolled and Mia smiled, {n}.")
    data = sl.evals.write_concept_data("the sea", writer=writer, instructions=HAPPY_ASKS,
                                       prompts=OTHER_ASKS[:3], n_positives=3, n_negatives=1,
                                       lm=toy_lm, max_new_tokens=6, progress=False)  # fmt: skip
    own = toy_lm.generate(OTHER_ASKS[:3], max_new_tokens=6, temperature=0.0, chat=True).text
    assert [(p.prompt, p.chosen, p.rejected) for p in data.pairs] == [
        (rendered(toy_lm.tokenizer, a, chat=True), c, r)
        for a, c, r in zip(OTHER_ASKS[:3], data.positives, own)]  # fmt: skip


# --- the toy's writer ------------------------------------------------------------------------


def test_toy_writer_writes_the_concept_in_and_out():
    from steerlab.toy import ToyWriter, concept_score

    data = sl.evals.write_concept_data("the sea", writer=ToyWriter(), instructions=HAPPY_ASKS,
                                       n_positives=8, n_negatives=8, progress=False)  # fmt: skip
    assert [concept_score(t, "setting") for t in data.positives] == [1.0] * 8
    assert [concept_score(t, "setting") for t in data.negatives] == [0.0] * 8
    # the story keeps the request's sentiment: happy asks happy, sad asks sad
    assert [concept_score(t, "sentiment") for t in data.positives[:4]] == [1.0, 0.0, 1.0, 0.0]
    assert len(set(data.positives)) == 8  # another version, another story
    again = sl.evals.write_concept_data("the sea", writer=ToyWriter(), instructions=HAPPY_ASKS,
                                        n_positives=8, n_negatives=8, progress=False)  # fmt: skip
    assert again == data
    with pytest.raises(ValueError, match="ToyWriter knows the toy's concepts"):
        ToyWriter().ask(question("positive", "the moon", "Tell me a story."))


def test_toy_writer_data_feeds_a_full_benchmark(toy_lm):
    from steerlab.evals.methods import BUILT_IN
    from steerlab.toy import ToyJudge, ToyWriter

    data = sl.evals.write_concept_data("the sea", writer=ToyWriter(), instructions=HAPPY_ASKS,
                                       prompts=OTHER_ASKS, n_positives=6, n_negatives=6,
                                       lm=toy_lm, progress=False)  # fmt: skip
    assert len(data.pairs) > 0 and not set(data.instructions) & set(OTHER_ASKS)

    def quick_reps(lm, data, site):  # RePS on the written pairs, 2 epochs
        return sl.train.reps(lm, list(data.pairs), site=site, epochs=2, progress=False)[0]

    grid = [0.4, 1.0, 2.0]
    methods = [BUILT_IN["mean_diff"].__class__("mean_diff", BUILT_IN["mean_diff"].make, grid,
                                               ("positives", "negatives"), True),
               sl.evals.Method("reps", make=quick_reps, factors=[2.0, 8.0], needs=("pairs",)),
               "prompt", "random"]  # fmt: skip
    result = sl.evals.benchmark(toy_lm, [data], methods, site=SITE, judge=ToyJudge(toy_lm),
                                max_new_tokens=12, seed=0, n_boot=50, progress=False)  # fmt: skip
    assert {r["method"] for r in result.leaderboard} == {"mean_diff", "reps", "prompt", "random"}
    assert {s["instruction"] for s in result.samples} == set(HAPPY_ASKS)
    assert {r["concept"] for r in result.table} == {"the sea"}
    assert {r["method"] for r in result.detection} >= {"mean_diff", "reps"}


def _swap(block: str, old: str, new: str) -> str:
    assert old in block, f"the README's recipe no longer has {old!r}"
    return block.replace(old, new)


def test_the_readmes_real_model_recipe_runs_on_the_toy(monkeypatch):
    """The recipe as written, with the toy's names put in: the toy model for Gemma,
    ToyWriter and ToyJudge for gpt-4o-mini, toy asks for Alpaca's, the toy's concept and
    site, and sizes and lengths the toy can afford."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "write_concept_data" in b]
    for old, new in [
        ("from datasets import load_dataset", "import steerlab.toy as toy  #"),
        ('sl.load("google/gemma-2-2b-it", backend="hf")', 'sl.load("steerlab-tiny", backend="hf")'),
        ('sl.evals.Judge("https://api.openai.com/v1", "gpt-4o-mini")', "toy.ToyJudge(lm)"),
        ('[r["instruction"] for r in load_dataset("tatsu-lab/alpaca", split="train") if not r["input"]]',
         "TOY_ASKS"),
        ("writer=judge", "writer=toy.ToyWriter()"),
        ('"references to the ocean"', '"the sea"'),
        ("n_positives=72, n_negatives=72", "n_positives=4, n_negatives=4"),
        ('"blocks.10.hook_resid_pre"', f'"{SITE}"'),
        ("max_new_tokens=128", "max_new_tokens=8, progress=False"),
    ]:  # fmt: skip
        block = _swap(block, old, new)
    asks = [f"Tell me a {w} story." for w in ("happy", "sad", "cheerful", "gloomy", "lovely",
                                              "terrible", "bright", "lonely", "wonderful", "scared")]  # fmt: skip
    toy_asks = asks + [f"Tell me a {w} story about the woods." for w in ("happy", "sad")] * 36
    namespace = {"sl": sl, "TOY_ASKS": toy_asks}
    # RePS's 18 epochs, as the recipe trains them, on the toy's 4 pairs
    exec(compile(block, str(README), "exec"), namespace)
    data, result = namespace["data"], namespace["result"]
    assert (len(data.positives), len(data.negatives)) == (4, 4)
    assert list(data.instructions) == asks
    assert not set(data.instructions) & {p for p in toy_asks[10:82]}
    assert {r["method"] for r in result.leaderboard} == {"mean_diff", "reps", "prompt", "random"}
