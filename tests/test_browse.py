"""``BenchmarkResult.browse()`` and ``to_pandas()``, without a browser.

The widget's state (which cell, which factor, which samples in which order, which text beside
each) is read back from its controls and the HTML it renders, and checked against the samples
recomputed here in plain Python. ``tests/browser/test_sample_browser.py`` drives it in JupyterLab.
"""

from __future__ import annotations

import html
import re

import pytest

import steerlab as sl
from steerlab.core.table import Table
from steerlab.evals import BenchmarkResult

ASKS = ["Tell me a story about the sea.", "Tell me a story about the forest.",
        "Tell me a story about the beach.", "Tell me a story about the woods."]  # fmt: skip
PROMPT = "Talk about the sea."


def _sample(method, concept, factor, i, text, score, model_input=None, **extra):
    return {"method": method, "concept": concept, "factor": factor, "instruction_index": i,
            "split": "selection" if i < 2 else "test", "instruction": ASKS[i],
            "model_input": ASKS[i] if model_input is None else model_input, "text": text,
            "concept_rating": score, "instruction_rating": 2.0, "fluency_rating": 2.0,
            "score": score, "parse_failed": False, **extra}  # fmt: skip


def _result(extra_arms=True) -> BenchmarkResult:
    """mean_diff at factors 0, 1, 2 and the prompting arm on two concepts; with
    ``extra_arms``, an unsteered arm (the instruction alone) on "the sea" too."""
    samples = []
    for concept in ("the sea", "happiness"):
        for i in range(4):
            for factor in (0.0, 1.0, 2.0):
                # scores that order the instructions differently at each factor
                score = (((3 + 2 * factor) * i + factor) % 4) / 2
                samples.append(_sample("mean_diff", concept, factor, i,
                                       f"md {concept} f{factor:g} i{i}", score))  # fmt: skip
            samples.append(_sample("prompt", concept, 1.0, i, f"prompted {concept} i{i}", 1.5,
                                   model_input=f"{PROMPT}\n\nQuestion: {ASKS[i]}"))  # fmt: skip
            if extra_arms and concept == "the sea":
                samples.append(_sample("unsteered", concept, 0.0, i, f"plain i{i}", 0.5))
    methods = ["mean_diff", "prompt", *(["unsteered"] if extra_arms else [])]
    table = Table("t", ["method", "concept", "factor", "score"], [
        {"method": m, "concept": c, "factor": 1.0 if m == "mean_diff" else
         (0.0 if m == "unsteered" else 1.0), "score": 1.0}
        for m in methods for c in ("the sea", "happiness")
        if m != "unsteered" or c == "the sea"])  # fmt: skip
    board = Table("b", ["method", "score"], [{"method": m, "score": s} for m, s in
                                             (("prompt", 1.5), ("mean_diff", 1.0),
                                              ("unsteered", 0.5))[: len(methods)]])  # fmt: skip
    steers = {("mean_diff", c): object() for c in ("the sea", "happiness")}
    steers |= {(m, c): None for m in methods[1:] for c in ("the sea", "happiness")}
    prompts = {("prompt", c): PROMPT for c in ("the sea", "happiness")}
    return BenchmarkResult(table, board, samples, steers, Table("d", [], []), 0, prompts)


def _listed(browser) -> list[dict[str, str]]:
    """Each listed sample: its instruction, steered text and the text beside it, as shown."""
    out = []
    for block in browser.listing.value.split("class='steerlab-browse-sample'")[1:]:
        panes = re.findall(r"class='steerlab-pane [^']*'[^>]*>(.*?)</div>", block, re.S)
        instruction = re.search(r"<b>instruction</b> (.*?)</div>", block, re.S)
        out.append({"instruction": html.unescape(instruction[1]),
                    "steered": html.unescape(panes[0]),
                    "beside": html.unescape(re.sub(r"<[^>]+>", "", panes[1])) if len(panes) > 1
                    else None})  # fmt: skip
    return out


def _expected(result, method, concept, factor):
    rows = [
        s
        for s in result.samples
        if (s["method"], s["concept"], s["factor"]) == (method, concept, factor)
    ]
    return sorted(rows, key=lambda s: (-s["score"], s["instruction_index"]))


def test_the_first_cell_is_the_leaderboards_top_at_its_chosen_factor():
    result = _result()
    browser = result.browse()
    assert browser.cell.value == ("prompt", "the sea")
    assert browser.factor.value == 1.0 and browser.factor.disabled  # one factor: nothing to move
    assert [o[1] for o in browser.cell.options] == [
        ("prompt", "the sea"), ("prompt", "happiness"), ("mean_diff", "the sea"),
        ("mean_diff", "happiness"), ("unsteered", "the sea")]  # fmt: skip
    expected = "SampleBrowser(5 cells; showing prompt · the sea at factor 1: 4 samples)"
    assert repr(browser) == expected


def test_samples_are_listed_best_first_and_the_slider_shows_other_factors():
    result = _result()
    browser = result.browse(method="mean_diff", concept="happiness")
    assert browser.factor.value == 1.0  # the table's choice
    assert list(browser.factor.options) == [("0", 0.0), ("1", 1.0), ("2", 2.0)]
    for factor in (1.0, 2.0, 0.0):
        browser.factor.value = factor
        shown = _listed(browser)
        expected = _expected(result, "mean_diff", "happiness", factor)
        assert [s["steered"] for s in shown] == [s["text"] for s in expected]
        assert [s["instruction"] for s in shown] == [s["instruction"] for s in expected]
        scores = [s["score"] for s in expected]
        assert scores == sorted(scores, reverse=True) and len(set(scores)) > 1
    summary = browser.summary.value
    assert "at factor <b>0</b>:" in summary and "chosen" not in summary


def test_beside_each_sample_the_same_instruction_from_an_arm_that_did_not_steer():
    result = _result()
    browser = result.browse(method="mean_diff", concept="the sea", factor=2.0)
    labels = [label for label, _ in browser.reference.options]
    # unsteered arms first (the instruction alone, then the method's own factor 0), then
    # the prompting arm, each named for what it is
    assert labels == ["unsteered: mean_diff at factor 0",
                      "unsteered: unsteered, the instruction alone",
                      "prompting: prompt, the concept in its prompt"]  # fmt: skip
    for label, text in (("unsteered: mean_diff at factor 0", "md the sea f0 i{i}"),
                        ("unsteered: unsteered, the instruction alone", "plain i{i}"),
                        ("prompting: prompt, the concept in its prompt", "prompted the sea i{i}")):  # fmt: skip
        browser.reference.label = label
        for shown in _listed(browser):
            i = ASKS.index(shown["instruction"])
            assert shown["beside"].endswith(text.format(i=i))
            assert shown["steered"] == f"md the sea f2 i{i}"
    # the prompting arm's model input (its prompt) is shown before its text, in grey
    assert html.escape(PROMPT) in browser.listing.value
    # a concept with no unsteered arm but prompting: the prompting arm is beside it
    browser.cell.value = ("prompt", "happiness")
    assert [label for label, _ in browser.reference.options] == [
        "unsteered: mean_diff at factor 0"]  # fmt: skip
    assert browser.factor.value == 1.0


def test_a_run_without_an_arm_to_compare_says_so():
    samples = [_sample("reps", "the sea", f, i, f"t{f}{i}", 1.0) for f in (2.0, 4.0)
               for i in range(4)]  # fmt: skip
    table = Table("t", ["method"], [{"method": "reps", "concept": "the sea", "factor": 4.0}])
    result = BenchmarkResult(table, Table("b", [], [{"method": "reps"}]), samples,
                             {("reps", "the sea"): object()}, Table("d", [], []), 0)  # fmt: skip
    browser = result.browse()
    assert browser.factor.value == 4.0 and not browser.factor.disabled
    assert "no unsteered or prompting arm" in browser.summary.value
    assert all(s["beside"] is None for s in _listed(browser))


def test_ratings_judge_replies_and_empty_texts_are_shown_escaped():
    result = _result(extra_arms=False)
    target = next(s for s in result.samples if s["method"] == "mean_diff" and s["factor"] == 1.0
                  and s["concept"] == "the sea" and s["instruction_index"] == 1)  # fmt: skip
    target["judge_replies"] = ["<b>waves</b> Rating: 2", "on topic. Rating: 1", "Rating: 2"]
    target["text"] = "  "
    target["parse_failed"] = True
    browser = result.browse(method="mean_diff", concept="the sea")
    page = browser.listing.value
    assert "&lt;b&gt;waves&lt;/b&gt; Rating: 2" in page and "<b>waves</b>" not in page
    assert "on topic. Rating: 1" in page
    assert "(empty generation)" in page and "unreadable rating" in page
    assert page.count("steerlab-browse-judge") == 1  # the other samples kept none
    assert "not kept" not in browser.summary.value
    browser.factor.value = 2.0
    assert "not kept in this run" in browser.summary.value


def test_bad_cells_and_factors_are_refused_by_name():
    result = _result()
    with pytest.raises(sl.SteerError, match="concept='the moon'.*concepts: "):
        result.browse(method="mean_diff", concept="the moon")
    with pytest.raises(sl.SteerError, match="factor=3.0"):
        result.browse(method="mean_diff", concept="the sea", factor=3.0)


def test_to_pandas_has_every_sample_with_its_columns():
    pd = pytest.importorskip("pandas")
    result = _result()
    result.samples[0]["judge_replies"] = ["a", "b", "c"]
    frame = result.to_pandas()
    assert isinstance(frame, pd.DataFrame)
    assert len(frame) == len(result.samples)
    assert list(frame.columns[:8]) == ["method", "concept", "factor", "split",
                                       "instruction_index", "instruction", "model_input", "text"]  # fmt: skip
    assert frame.columns[-1] == "judge_replies" and frame["judge_replies"][0] == ["a", "b", "c"]
    assert frame.to_dict("records")[5] | {"judge_replies": None} == result.samples[5] | {
        "judge_replies": None}  # fmt: skip


def test_browse_on_a_toy_benchmark(toy_lm):
    """A real run: mean difference at factor 0 (unsteered) and 4, beside the prompting arm."""
    from steerlab.evals.methods import BUILT_IN
    from steerlab.toy import ToyJudge, concept_data

    data = concept_data("sentiment", lm=toy_lm)
    data = sl.evals.ConceptData(data.name, positives=data.positives[:8],
                                negatives=data.negatives[:8], instructions=data.instructions[:4])  # fmt: skip
    mean_diff = BUILT_IN["mean_diff"]
    methods = [sl.evals.Method("mean_diff", make=mean_diff.make, factors=[0, 4],
                               needs=mean_diff.needs),
               sl.evals.Prompting(prompt="Tell me a happy story.")]  # fmt: skip
    result = sl.evals.benchmark(toy_lm, [data], methods, site="blocks.2.hook_resid_pre",
                                judge=ToyJudge(toy_lm), max_new_tokens=8, n_boot=50,
                                progress=False)  # fmt: skip
    browser = result.browse(method="mean_diff", factor=4.0)
    assert browser.cell.value == ("mean_diff", "happiness")
    beside = {r.label: r for _, r in browser.reference.options}
    assert list(beside) == ["unsteered: mean_diff at factor 0",
                            "prompting: prompt, the concept in its prompt"]  # fmt: skip
    unsteered = {s["instruction_index"]: s["text"] for s in result.samples
                 if s["method"] == "mean_diff" and s["factor"] == 0}  # fmt: skip
    for shown in _listed(browser):
        i = data.instructions.index(shown["instruction"])
        assert shown["beside"].endswith(unsteered[i])
    assert len(result.to_pandas()) == len(result.samples) == 4 * 2 + 4
