"""``sl.evals.benchmark(..., run=)``: a run kept in a folder, resumed, refused, read back.

- a run interrupted (the judge failing for good, a method's make raising, Ctrl-C, SIGKILL
  in a subprocess) and resumed gives the tables of a run never interrupted, to the bit;
  nothing stored is generated or rated again (counted by a counting engine and judge);
- other settings in a run folder are refused by name; new concepts and methods add only
  their cells;
- ``load_run`` reads what a finished or interrupted run holds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from helpers import NoGeneration

import steerlab as sl
from steerlab.evals.benchmark import EmptyGenerationWarning

SITE = "blocks.2.hook_resid_pre"
HAPPY = ["Mia smiled and sang.", "Tom laughed, glad and warm.", "The day was bright and happy."]
SAD = ["Mia cried and sighed.", "Tom frowned, scared and cold.", "The day was gloomy and sad."]
SEA = ["The waves rolled over the sand.", "Gulls flew over the sea.", "The tide rose."]
FOREST = ["The owl hooted in the woods.", "Pines stood in the forest.", "Moss grew."]
ASKS = ["Tell me a story about the sea.", "Tell me a story about the forest.",
        "Tell me a story.", "Tell me a happy story."]  # fmt: skip
REPO = Path(__file__).resolve().parents[1]


def concepts() -> list[sl.evals.ConceptData]:
    return [sl.evals.ConceptData("happiness", positives=HAPPY, negatives=SAD, instructions=ASKS),
            sl.evals.ConceptData("the sea", positives=SEA, negatives=FOREST,
                                 instructions=ASKS[1:])]  # fmt: skip


def _extract(lm, data, site):
    return sl.extract(lm, list(data.positives), list(data.negatives), [site], token="mean",
                      progress=False)  # fmt: skip


def methods() -> list:
    return [sl.evals.Method("vector", make=_extract, factors=[0.0, 4.0, 8.0],
                            needs=("positives", "negatives")),
            sl.evals.Prompting(),  # the judge writes the prompt
            sl.evals.Prompting("Be cheerful.", name="told")]  # fmt: skip


class CountingJudge:
    """Ratings by rules of the text alone (so any process gives the same), every ask
    counted; ``fail_after`` asks, every later one raises."""

    max_workers = 3
    model = "counting"

    def __init__(self, fail_after: int | None = None) -> None:
        self.asked: list[tuple[str, str, str]] = []
        self.written: list[str] = []
        self.fail_after = fail_after
        self._lock = threading.Lock()

    def rate(self, concept, instruction, text):
        with self._lock:
            if self.fail_after is not None and len(self.asked) >= self.fail_after:
                raise sl.evals.JudgeError("the judge answered 503 for good")
            self.asked.append((concept, instruction, text))
        return float(len(text) % 3), 2.0 if "sea" in instruction else 1.0, 1.0 + len(text) % 2

    def write_prompt(self, concept):
        self.written.append(concept)
        return f"Always talk about {concept}."


class CountingEngine:
    """Counts every generated row by wrapping the model's ``generate``."""

    def __init__(self, monkeypatch, lm) -> None:
        self.rows = 0
        self.calls = 0
        original = lm.generate

        def counted(*args, **kwargs):
            out = original(*args, **kwargs)
            self.calls += 1
            self.rows += len(out.text)
            return out

        monkeypatch.setattr(lm, "generate", counted)


OPTIONS = {"site": SITE, "max_new_tokens": 6, "temperature": 1.0, "seed": 3, "n_boot": 50,
           "progress": False}  # fmt: skip


def same(a, b) -> None:
    """Two results' tables and samples equal to the bit (nan equal to nan)."""
    for name in ("table", "leaderboard", "detection"):
        assert repr(list(getattr(a, name))) == repr(list(getattr(b, name))), name
    assert repr(a.samples) == repr(b.samples)
    assert a.parse_failures == b.parse_failures and a.prompts == b.prompts


@pytest.fixture(scope="module")
def reference(toy_lm, tmp_path_factory):
    """One run never interrupted, kept in a folder."""
    folder = tmp_path_factory.mktemp("reference") / "run"
    judge = CountingJudge()
    result = sl.evals.benchmark(toy_lm, concepts(), methods(), judge=judge, run=folder, **OPTIONS)
    return result, folder, judge


def test_a_run_kept_in_a_folder_equals_one_kept_in_memory(reference, toy_lm):
    result, folder, judge = reference
    plain = sl.evals.benchmark(toy_lm, concepts(), methods(), judge=CountingJudge(), **OPTIONS)
    same(result, plain)
    assert len(judge.asked) == len(result.samples) == (3 * 4 + 4 + 4) + (3 * 3 + 3 + 3)
    assert (folder / "run.sqlite").is_file()
    assert sorted(p.suffix for p in (folder / "steers").iterdir()) == [".safetensors"] * 2
    assert result.samples[0]["judge_replies"] is None  # this judge gives no replies


def test_the_same_call_again_makes_generates_and_rates_nothing(reference, toy_lm, monkeypatch):
    result, folder, _ = reference
    engine, judge = CountingEngine(monkeypatch, toy_lm), CountingJudge()
    made = []
    mine = methods()
    mine[0] = sl.evals.Method("vector", make=lambda *a: made.append(1) or _extract(*a),
                              factors=[0.0, 4.0, 8.0], needs=("positives", "negatives"))  # fmt: skip
    again = sl.evals.benchmark(toy_lm, concepts(), mine, judge=judge, run=folder, **OPTIONS)
    same(again, result)
    assert (engine.calls, judge.asked, judge.written, made) == (0, [], [], [])
    assert (
        again.steers[("vector", "happiness")]
        .directions[SITE]
        .equal(result.steers[("vector", "happiness")].directions[SITE])
    )
    same(sl.evals.load_run(folder), result)


def test_a_judge_failing_for_good_keeps_the_work_and_the_run_resumes(reference, toy_lm, tmp_path,
                                                                    monkeypatch):  # fmt: skip
    result, _, _ = reference
    folder = tmp_path / "run"
    engine = CountingEngine(monkeypatch, toy_lm)
    first = CountingJudge(fail_after=13)
    with pytest.raises(sl.evals.JudgeError, match="503") as caught:
        sl.evals.benchmark(toy_lm, concepts(), methods(), judge=first, run=folder, **OPTIONS)
    note = " ".join(caught.value.__notes__)
    assert "same arguments to resume" in note and "load_run" in note and str(folder) in note
    partial = sl.evals.load_run(folder)
    assert len(partial.samples) == 13  # every rating that arrived is kept
    rows_before = engine.rows
    second = CountingJudge()
    resumed = sl.evals.benchmark(toy_lm, concepts(), methods(), judge=second, run=folder,
                                 **OPTIONS)  # fmt: skip
    same(resumed, result)
    assert len(second.asked) == len(result.samples) - 13  # none asked twice
    assert engine.rows == len(result.samples)  # each text generated once, over both calls
    assert rows_before < engine.rows
    assert first.written == ["happiness", "the sea"] and second.written == []


def test_a_method_whose_make_raises_keeps_the_finished_cells(reference, toy_lm, tmp_path,
                                                             monkeypatch):  # fmt: skip
    result, _, _ = reference
    folder = tmp_path / "run"

    def broken(lm, data, site):
        if data.name == "the sea":
            raise RuntimeError("out of memory")
        return _extract(lm, data, site)

    mine = methods()
    mine[0] = sl.evals.Method("vector", make=broken, factors=[0.0, 4.0, 8.0],
                              needs=("positives", "negatives"))  # fmt: skip
    with pytest.raises(RuntimeError, match="out of memory") as caught:
        sl.evals.benchmark(toy_lm, concepts(), mine, judge=CountingJudge(), run=folder,
                           **OPTIONS)  # fmt: skip
    assert "load_run" in " ".join(caught.value.__notes__)
    done = {(s["method"], s["concept"]) for s in sl.evals.load_run(folder).samples}
    assert done == {("vector", "happiness"), ("prompt", "happiness"), ("told", "happiness")}
    engine, judge = CountingEngine(monkeypatch, toy_lm), CountingJudge()
    resumed = sl.evals.benchmark(toy_lm, concepts(), methods(), judge=judge, run=folder,
                                 **OPTIONS)  # fmt: skip
    same(resumed, result)
    assert engine.calls == 3 and {c for c, _, _ in judge.asked} == {"the sea"}


def test_ctrl_c_keeps_the_work(reference, toy_lm, tmp_path, monkeypatch):
    result, _, _ = reference
    folder = tmp_path / "run"

    class Interrupting(CountingJudge):
        def rate(self, concept, instruction, text):
            if concept == "the sea":
                raise KeyboardInterrupt
            return super().rate(concept, instruction, text)

    with pytest.raises(KeyboardInterrupt) as caught:
        sl.evals.benchmark(toy_lm, concepts(), methods(), judge=Interrupting(), run=folder,
                           **OPTIONS)  # fmt: skip
    assert "resume" in " ".join(caught.value.__notes__)
    judge = CountingJudge()
    same(sl.evals.benchmark(toy_lm, concepts(), methods(), judge=judge, run=folder, **OPTIONS),
         result)  # fmt: skip
    assert {c for c, _, _ in judge.asked} == {"the sea"}


def test_a_new_concept_or_method_runs_only_its_cells(reference, toy_lm, tmp_path, monkeypatch):
    result, _, _ = reference
    folder = tmp_path / "run"
    sl.evals.benchmark(toy_lm, concepts()[:1], methods()[:2], judge=CountingJudge(),
                       run=folder, **OPTIONS)  # fmt: skip
    engine, judge = CountingEngine(monkeypatch, toy_lm), CountingJudge()
    grown = sl.evals.benchmark(toy_lm, concepts(), methods(), judge=judge, run=folder, **OPTIONS)
    same(grown, result)
    assert engine.calls == 4  # told × happiness, and the sea's three cells
    assert judge.written == ["the sea"]
    loaded = sl.evals.load_run(folder)
    assert [r["method"] for r in loaded.table] == [r["method"] for r in result.table]


@pytest.mark.parametrize(("change", "match"), [
    ({"seed": 4}, "seed=3.*seed=4"),
    ({"temperature": 0.5}, "temperature=1.0.*temperature=0.5"),
    ({"max_new_tokens": 5}, "max_new_tokens=6.*max_new_tokens=5"),
    ({"site": "blocks.1.hook_resid_pre"}, "site="),
    ({"chat": False}, "chat=true.*chat=false"),
    ({"selection": 0.75}, "selection="),
    ({"judge": type("Other", (CountingJudge,), {"model": "gpt-4o"})()}, "judge="),
    ({"concepts": [sl.evals.ConceptData("happiness", positives=HAPPY, negatives=SAD,
                                        instructions=ASKS[:3])]}, "concept 'happiness' with other data"),
    ({"methods": [sl.evals.Method("vector", make=_extract, factors=[1.0],
                                  needs=("positives", "negatives"))]}, "method 'vector' with other settings"),
])  # fmt: skip
def test_other_settings_in_a_run_folder_are_refused_by_name(reference, toy_lm, monkeypatch,
                                                            change, match):  # fmt: skip
    _, folder, _ = reference
    engine = CountingEngine(monkeypatch, toy_lm)
    call = {"concepts": concepts(), "methods": methods(), "judge": CountingJudge(), **OPTIONS,
            "chat": True, "run": folder, **change}  # fmt: skip
    with pytest.raises(sl.SteerError, match=match):
        sl.evals.benchmark(toy_lm, **call)
    assert engine.calls == 0
    # progress is no setting
    sl.evals.benchmark(toy_lm, concepts(), methods(), judge=CountingJudge(), run=folder,
                       **{**OPTIONS, "progress": True})  # fmt: skip


def test_another_model_or_a_file_as_the_run_folder_is_refused(reference, toy_lm, tmp_path,
                                                               monkeypatch):  # fmt: skip
    _, folder, _ = reference
    monkeypatch.setattr(toy_lm, "name", "another-model")
    with pytest.raises(sl.SteerError, match="model 'steerlab-tiny'.*'another-model'"):
        sl.evals.benchmark(toy_lm, concepts(), methods(), judge=CountingJudge(), run=folder,
                           **OPTIONS)  # fmt: skip
    monkeypatch.undo()
    afile = tmp_path / "notes.txt"
    afile.write_text("hello")
    with pytest.raises(sl.SteerError, match="is a file, not a folder"):
        sl.evals.benchmark(toy_lm, concepts(), methods(), judge=CountingJudge(), run=afile,
                           **OPTIONS)  # fmt: skip
    with pytest.raises(sl.SteerError, match="holds no benchmark run"):
        sl.evals.load_run(tmp_path)


# --- SIGKILL at three random points ------------------------------------------------------

CHILD = """
import json, os, sys, time, hashlib
sys.path.insert(0, {tests!r})
import steerlab as sl
from test_benchmark_run import CountingJudge, OPTIONS, concepts, methods

run, log = sys.argv[1], sys.argv[2]
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

class Logged(CountingJudge):
    def rate(self, concept, instruction, text):
        time.sleep(0.02)
        values = super().rate(concept, instruction, text)
        os.write(fd, (json.dumps(["rate", concept, instruction, text]) + "\\n").encode())
        return values

lm = sl.load("steerlab-tiny", backend="hf")
generate = lm.generate
def logged(inputs, steer=None, **kw):
    out = generate(inputs, steer, **kw)
    key = repr((inputs, [(s.alpha, float(s.vector.sum())) for s in steer or []]))
    os.write(fd, (json.dumps(["generate", hashlib.sha256(key.encode()).hexdigest(),
                              len(out.text)]) + "\\n").encode())
    return out
lm.generate = logged
result = sl.evals.benchmark(lm, concepts(), methods(), judge=Logged(), run=run, **OPTIONS)
print(json.dumps({{"table": repr(list(result.table)), "board": repr(list(result.leaderboard)),
                  "samples": repr(result.samples)}}))
"""


def _child(script: Path, run: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, str(script), str(run), str(log)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _stored(run: Path) -> int:
    try:
        with sqlite3.connect(run / "run.sqlite") as db:
            return db.execute("SELECT count(*) FROM ratings").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_sigkill_at_three_random_points_then_resume_gives_the_uninterrupted_tables(
        reference, tmp_path):  # fmt: skip
    """The run in a subprocess, SIGKILLed three times at random points (after a random
    number of stored ratings, then a random pause, so a kill lands in a make, a generation
    or a rating), resumed each time; then finished. Its tables equal the run never
    interrupted, and across the tries each cell was generated at most once more per kill
    (the one in flight) and each rating asked at most ``max_workers`` more per kill."""
    result, _, _ = reference
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(tests=str(REPO / "tests")))
    rng = random.Random(7)
    run, log = tmp_path / "killed", tmp_path / "killed.log"
    kills = 0
    for threshold in sorted(rng.sample(range(1, len(result.samples)), 3)):
        child = _child(script, run, log)
        while child.poll() is None and _stored(run) < threshold:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            kills += 1
        child.communicate(timeout=60)
    last = _child(script, run, log)
    out, err = last.communicate(timeout=300)
    assert last.returncode == 0, err
    assert json.loads(out) == {"table": repr(list(result.table)),
                               "board": repr(list(result.leaderboard)),
                               "samples": repr(result.samples)}  # to the bit  # fmt: skip
    assert kills >= 2  # the run was really cut

    events = [json.loads(line) for line in log.read_text().splitlines()]
    rated = Counter(tuple(e[1:]) for e in events if e[0] == "rate")
    need = Counter((s["concept"], s["instruction"], s["text"]) for s in result.samples)
    assert not need - rated  # every rating asked
    assert sum((rated - need).values()) <= CountingJudge.max_workers * kills
    made = Counter(e[1] for e in events if e[0] == "generate")
    assert len(made) == len(result.table)  # one generation per cell
    assert sum(made.values()) - len(made) <= kills  # at most the cell in flight per kill


# --- checked before the first generation -------------------------------------------------


def test_a_judge_model_that_does_not_rate_is_refused_before_any_generation(toy_lm, monkeypatch):
    """``ping`` passes (the server answers /models), and the model name is misspelt: every
    rating is a 404. One real rating of a fixed text finds it before any generation."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from steerlab.server.background import serve_in_background

    app = FastAPI()

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model"}]}

    @app.post("/v1/chat/completions")
    def chat() -> JSONResponse:
        return JSONResponse({"error": {"message": "model 'gpt4o-mini' not found"}}, 404)

    NoGeneration.install(monkeypatch, toy_lm)
    with serve_in_background(app) as url:
        judge = sl.evals.Judge(f"{url}/v1", "gpt4o-mini", max_retries=0)
        with pytest.raises(sl.evals.JudgeError, match="404.*not found"):
            sl.evals.benchmark(toy_lm, concepts(), [sl.evals.Prompting("Be happy.")],
                               judge=judge, **OPTIONS)  # fmt: skip


def _refused(lm, monkeypatch, data, methods_, judge, match, error=sl.SteerError) -> None:
    NoGeneration.install(monkeypatch, lm)
    with pytest.raises(error, match=match):
        sl.evals.benchmark(lm, data, methods_, judge=judge, **OPTIONS)


def test_repeated_instructions_are_refused(toy_lm, monkeypatch):
    data = sl.evals.ConceptData("happiness", instructions=[ASKS[0], ASKS[1], ASKS[0]])
    _refused(toy_lm, monkeypatch, [data], ["prompt"], CountingJudge(),
             "'happiness' repeats the instruction 'Tell me a story about the sea.'")  # fmt: skip


def test_a_concept_toy_judge_does_not_know_is_refused(toy_lm, monkeypatch):
    from steerlab.toy import ToyJudge

    data = sl.evals.ConceptData("the ocean", instructions=ASKS)
    _refused(toy_lm, monkeypatch, [data], [sl.evals.Prompting("Be happy.")],
             ToyJudge(toy_lm), "ToyJudge knows the toy's concepts.*'the ocean'")  # fmt: skip


def test_texts_past_the_window_are_refused_naming_the_concept_and_the_method(toy_lm,
                                                                              monkeypatch):  # fmt: skip
    long = " ".join(["The waves rolled."] * 60)
    data = sl.evals.ConceptData("the sea", positives=[SEA[0], long], negatives=FOREST,
                                instructions=ASKS)  # fmt: skip
    _refused(toy_lm, monkeypatch, [data], ["prompt", "mean_diff"], CountingJudge(),
             r"'the sea': positives\[1\] is \d+ tokens, beyond .* 128; method 'mean_diff'")  # fmt: skip
    pairs = [sl.Preference("Tell me a story.", long, "The owl hooted.")]
    data = sl.evals.ConceptData("the sea", pairs=pairs, instructions=ASKS)
    _refused(toy_lm, monkeypatch, [data], ["reps"], CountingJudge(), r"pairs\[0\].*'reps'")


def test_a_written_prompt_waits_for_the_window_check(toy_lm, monkeypatch):
    """The judge writes the prompting arm's prompt (a paid call) only after the cheap
    checks: instructions past the window are refused before it is asked."""
    judge = CountingJudge()
    data = sl.evals.ConceptData("happiness", instructions=[ASKS[0], " ".join(ASKS * 12)])
    _refused(toy_lm, monkeypatch, [data], ["prompt"], judge, "context window",
             error=ValueError)  # fmt: skip
    assert judge.written == []


def test_a_steer_at_another_site_is_refused_unless_the_method_says_so(toy_lm, tmp_path):
    other = "blocks.1.hook_resid_pre"
    elsewhere = sl.evals.Method("elsewhere", make=lambda lm, d, s: _extract(lm, d, other),
                                factors=[1.0])  # fmt: skip
    with pytest.raises(sl.SteerError, match=rf"'elsewhere' made a steer at '{other}'.*"
                                            rf"'{SITE}'.*site='{other}'"):  # fmt: skip
        sl.evals.benchmark(toy_lm, concepts()[:1], [elsewhere], judge=CountingJudge(),
                           **OPTIONS)  # fmt: skip
    own = sl.evals.Method("own", make=_extract, factors=[1.0], site=other)
    result = sl.evals.benchmark(toy_lm, concepts()[:1], [own], judge=CountingJudge(),
                                **OPTIONS)  # fmt: skip
    assert list(result.steers[("own", "happiness")].directions) == [other]
    # its detection is measured where it steers: as a run whose site is the method's own
    there = sl.evals.benchmark(toy_lm, concepts()[:1],
                               [sl.evals.Method("own", make=_extract, factors=[1.0])],
                               judge=CountingJudge(), **{**OPTIONS, "site": other})  # fmt: skip
    assert len(result.detection) == 1
    assert list(result.detection) == list(there.detection)


# --- honest results -------------------------------------------------------------------


def test_empty_generations_are_counted_warned_and_marked(toy_lm, monkeypatch):
    """A model that writes nothing for most prompts: each cell counts its empty texts,
    the run warns once naming the cells, and a cell mostly empty is marked degenerate in
    the table, the leaderboard and the figure."""
    original = toy_lm.generate

    def mostly_empty(inputs, steer=None, **kwargs):
        out = original(inputs, steer, **kwargs)
        return dataclasses.replace(out, text=[t if i % 4 == 0 else "  "
                                              for i, t in enumerate(out.text)])  # fmt: skip

    monkeypatch.setattr(toy_lm, "generate", mostly_empty)
    with pytest.warns(EmptyGenerationWarning,
                      match="vector / happiness: 9.*told / the sea: 2") as caught:  # fmt: skip
        result = sl.evals.benchmark(toy_lm, concepts(), methods(), judge=CountingJudge(),
                                    **OPTIONS)  # fmt: skip
    assert len(caught) == 1
    rows = {(r["method"], r["concept"]): r for r in result.table}
    assert (
        rows[("vector", "happiness")]["empty"] == 9 and rows[("prompt", "happiness")]["empty"] == 3
    )
    assert all(r["degenerate"] for r in result.table)
    assert all(r["degenerate"] == 2 for r in result.leaderboard)
    fig = sl.plots.leaderboard(result)
    assert {s for trace in fig.data[1:] for s in trace.marker.symbol} == {"x"}
    assert all("2 degenerate" in a.text for a in fig.layout.annotations)


def test_the_samples_keep_the_judges_replies(toy_lm):
    from steerlab.toy import ToyJudge

    judge = ToyJudge(toy_lm)
    data = sl.evals.ConceptData("happiness", instructions=ASKS)
    result = sl.evals.benchmark(toy_lm, [data], [sl.evals.Prompting("Be happy.")], judge=judge,
                                **OPTIONS)  # fmt: skip
    from steerlab.evals.judge import parse_rating

    for s in result.samples:
        replies = s["judge_replies"]
        assert len(replies) == 3
        assert [parse_rating(r) for r in replies] == [s["concept_rating"],
                                                      s["instruction_rating"],
                                                      s["fluency_rating"]]  # fmt: skip


# --- shards -----------------------------------------------------------------------------


def test_shards_merged_give_the_unsharded_tables(reference, toy_lm, tmp_path):
    result, _, _ = reference
    parts = [tmp_path / "part0", tmp_path / "part1"]
    for i, part in enumerate(parts):
        alone = sl.evals.benchmark(toy_lm, concepts(), methods(), judge=CountingJudge(),
                                   run=part, shard=(i, 2), **OPTIONS)  # fmt: skip
        assert {r["concept"] for r in alone.table} == {concepts()[i].name}
    same(sl.evals.merge_runs(parts), result)
    same(sl.evals.merge_runs(parts[::-1]), result)  # the unsharded order, whatever the list's


@pytest.mark.parametrize(("shard", "run", "match"), [
    ((3, 2), "x", r"0 <= i < n.*shard=\(3, 2\)"),
    ((0, 0), "x", "0 <= i < n"),
    ("0/2", "x", "shard must be"),
    ((1, 2), None, "own run= folder"),
])  # fmt: skip
def test_a_bad_shard_is_refused(toy_lm, monkeypatch, tmp_path, shard, run, match):
    NoGeneration.install(monkeypatch, toy_lm)
    with pytest.raises(sl.SteerError, match=match):
        sl.evals.benchmark(toy_lm, concepts(), methods(), judge=CountingJudge(),
                           run=None if run is None else tmp_path / run, shard=shard, **OPTIONS)  # fmt: skip


def test_runs_of_other_settings_do_not_merge(reference, toy_lm, tmp_path):
    _, folder, _ = reference
    other = tmp_path / "other"
    sl.evals.benchmark(toy_lm, concepts(), methods(), judge=CountingJudge(), run=other,
                       shard=(1, 2), **{**OPTIONS, "seed": 4})  # fmt: skip
    with pytest.raises(sl.SteerError, match="seed=4.*seed=3.*only shards of one run merge"):
        sl.evals.merge_runs([folder, other])
    with pytest.raises(sl.SteerError, match="'happiness' is in .* and in another"):
        sl.evals.merge_runs([folder, folder])


def test_a_model_in_other_processes_is_shared_with_no_judge(toy_lm):
    """A vLLM model keeps its weights in its workers (``lm.model`` raises): a judge with an
    in-process model of its own does not share it, and the check does not fail on it."""
    from steerlab.evals.pipeline import _shares_model
    from steerlab.toy import ToyJudge

    class Elsewhere:
        backend = None

        @property
        def model(self):
            raise AttributeError("the model is in other processes")

    remote = Elsewhere()
    assert not _shares_model(ToyJudge(toy_lm), remote)
    assert _shares_model(type("J", (), {"lm": remote})(), remote)
    assert _shares_model(ToyJudge(toy_lm), toy_lm)
