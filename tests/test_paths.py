"""One path choice (``engine/local/path.py``): the path ``lm.explain`` names is the one a call
takes, for the scored, shared-prefix and plain eager paths (the compiled one:
tests/test_compiled.py)."""

from __future__ import annotations

import pytest

from steerlab.core.request import Request, Sampling
from steerlab.engine.local import engine as engine_module
from steerlab.engine.local.engine import LocalEngine


def _spy(monkeypatch, name: str, owner=LocalEngine) -> list[int]:
    calls: list[int] = []
    original = getattr(owner, name)

    def spied(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, spied)
    return calls


def test_rows_sharing_a_prompt_are_explained_and_fed_once(toy_lm, monkeypatch):
    ids = tuple(toy_lm.tokenizer.encode("Once upon a time"))
    requests = [Request(ids, sampling=Sampling(max_new_tokens=2, seed=i)) for i in range(3)]
    line = toy_lm.engine.explain(requests)
    assert line == ("eager: the model is not compiled (lm.compile()); rows in runs of 3 share "
                    "a prompt, fed once")  # fmt: skip
    calls = _spy(monkeypatch, "_shared_prefix")
    toy_lm.engine.run(requests)
    assert calls == [1]


def test_distinct_prompts_take_the_plain_eager_batch(toy_lm, monkeypatch):
    requests = [Request(tuple(toy_lm.tokenizer.encode(t)), sampling=Sampling(max_new_tokens=2))
                for t in ("Once upon a time", "The sea")]  # fmt: skip
    assert toy_lm.engine.explain(requests) == "eager: the model is not compiled (lm.compile())"
    calls = _spy(monkeypatch, "_shared_prefix")
    toy_lm.engine.run(requests)
    assert calls == []


@pytest.mark.parametrize("capture", [(), ("blocks.0.hook_resid_post",)])
def test_scored_rows_are_explained_as_the_path_they_take(toy_lm, monkeypatch, capture):
    ids = tuple(toy_lm.tokenizer.encode("Once upon a time"))
    requests = [Request(ids, sampling=Sampling(max_new_tokens=0, prompt_logprobs=1))]
    line = toy_lm.engine.explain(requests, capture=capture)
    calls = _spy(monkeypatch, "prefill_scored", engine_module)
    list(toy_lm.engine.stream(requests, capture=capture))
    if capture:  # capturing reads every column of the batch: the eager path
        assert line.startswith("eager: scoring prompts with capture=") and calls == []
    else:
        assert line.startswith("scored: every row scores its prompt") and calls == [1]


def test_explain_takes_generate_options_and_names_a_misspelt_one(toy_lm):
    """``lm.explain`` takes what ``lm.generate`` takes: generation options go into the rows
    (a misspelt one is named with its close match, before any compute)."""
    line = toy_lm.explain("Once upon a time", max_new_tokens=8, temperature=0.7, top_p=0.9)
    assert line.startswith("eager: ")
    with pytest.raises(TypeError, match="did you mean 'temperature'"):
        toy_lm.explain("Once upon a time", temprature=0.7)
