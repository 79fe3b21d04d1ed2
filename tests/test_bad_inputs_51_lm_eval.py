"""Issue 51, in-process lm-eval: every bad argument refused by name with steerlab's error,
before lm-eval runs; a toy task named without its folder answered with where it is."""

from __future__ import annotations

import math

import numpy as np
import pytest

import steerlab as sl
from steerlab.evals import harness

pytest.importorskip("lm_eval")


@pytest.fixture
def no_run(monkeypatch):
    """lm-eval's evaluation, which no refused call may reach."""
    import lm_eval

    def refuse(*args, **kwargs):
        raise AssertionError("lm-eval ran for a call that should have been refused")

    monkeypatch.setattr(lm_eval, "simple_evaluate", refuse)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_fewshot": -1}, "num_fewshot"),
        ({"num_fewshot": 1.5}, "num_fewshot"),
        ({"limit": math.nan}, "limit"),
        ({"limit": math.inf}, "limit"),
        ({"alpha": "4"}, "alpha"),
        ({"alpha": math.nan}, "alpha"),
        ({"tasks": None}, "tasks"),
        ({"tasks": 5}, "tasks"),
    ],
)
def test_a_bad_argument_is_refused_by_name(toy_lm, lm_eval_tasks, no_run, kwargs, name):
    call = {"tasks": ["toy_sentiment"], "include_path": lm_eval_tasks, **kwargs}
    tasks = call.pop("tasks")
    with pytest.raises(sl.SteerError, match=name) as error:
        sl.evals.lm_eval(toy_lm, tasks, **call)
    assert error.value.field == name


def test_numpy_numbers_are_numbers(toy_lm, lm_eval_tasks, monkeypatch):
    """``limit=np.int64(2)``, ``alpha=np.float32(2)``, ``num_fewshot=np.int64(0)`` run, as
    plain numbers reach lm-eval."""
    import lm_eval

    seen = {}

    def record(**kwargs):
        seen.update(kwargs)
        return {"results": {}}

    monkeypatch.setattr(lm_eval, "simple_evaluate", record)
    sl.evals.lm_eval(toy_lm, ["toy_sentiment"], limit=np.int64(2), num_fewshot=np.int64(0),
                     alpha=np.float32(2), include_path=lm_eval_tasks)  # fmt: skip
    assert type(seen["limit"]) is int and type(seen["num_fewshot"]) is int


def test_a_toy_task_without_its_folder_points_to_the_toy(toy_lm, monkeypatch, tmp_path, no_run):
    from lm_eval.tasks import TaskManager

    # lm-eval's own registry, which has no toy task (an empty one: indexing the real one
    # takes seconds, and says "Did you mean 'darija_sentiment'")
    monkeypatch.setattr(harness, "_task_manager",
                        lambda _, names, path: TaskManager(include_path=str(tmp_path),
                                                           include_defaults=False))  # fmt: skip
    with pytest.raises(sl.SteerError, match=r"steerlab\.toy\.tasks\.lm_eval_tasks\(\)"):
        sl.evals.lm_eval(toy_lm, ["toy_sentiment"])
    with pytest.raises(sl.SteerError, match=r"include_path .* does not hold it"):
        sl.evals.lm_eval(toy_lm, "toy_stories", include_path=tmp_path)


def test_an_in_process_result_names_no_preset():
    run = {"results": {"t": {"acc,none": 0.5}}}
    local = harness.HarnessResult(run, run, "steerlab-tiny", None, "blocks.2.hook_resid_pre at "
                                  "alpha 4")  # fmt: skip
    title = repr(local).splitlines()[0]
    assert "preset" not in title and "steered" in title and "alpha 4" in title
    served = harness.HarnessResult(run, run, "steerlab-tiny", "happy")
    assert repr(served).splitlines()[0] == "lm-eval: steerlab-tiny vs preset 'happy'"
