"""One source for generation options (issue 27): every door shows ``core.request.OPTIONS``,
and ``min_p``, the first option built that way, means what HF's ``generate`` means by it."""

from __future__ import annotations

import inspect

import pytest
import torch
from engine_parity import prompt_ids
from server_helpers import KEY, post, served
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import steerlab as sl
from steerlab.chat import ChatSession
from steerlab.client import RemoteModel
from steerlab.core.errors import SamplingError
from steerlab.core.request import OPTIONS, Sampling
from steerlab.core.sampling import sample_next
from steerlab.server.schemas import BatchItem, ChatRequest, CompletionRequest

DOORS = [sl.SteerableModel.generate, sl.SteerableModel.stream, ChatSession.say,
         ChatSession.stream, RemoteModel.generate, RemoteModel.stream]  # fmt: skip


@pytest.mark.parametrize("door", DOORS, ids=lambda f: f.__qualname__)
def test_every_python_door_shows_every_option_with_its_default(door):
    params = inspect.signature(door).parameters
    for option in OPTIONS:
        assert option.name in params, (door.__qualname__, option.name)
        param = params[option.name]
        assert param.kind is inspect.Parameter.KEYWORD_ONLY
        assert param.default == option.default and param.annotation == option.annotation
    shown = [n for n in params if n in {o.name for o in OPTIONS}]
    assert shown == [o.name for o in OPTIONS]  # in one order everywhere
    assert "**" not in str(inspect.signature(door))  # nothing hidden behind **options


def test_generate_documents_every_option():
    doc = sl.SteerableModel.generate.__doc__
    for option in OPTIONS:
        assert f"{option.name}: {option.doc[:30]}" in " ".join(doc.split()), option.name
    assert "{options}" not in doc


@pytest.mark.parametrize("model", [CompletionRequest, ChatRequest, BatchItem])
def test_every_server_request_takes_every_option_by_its_wire_name(model):
    for option in OPTIONS:
        assert option.wire in model.model_fields, (model.__name__, option.wire)


def test_a_misspelt_option_is_refused_with_the_close_name(toy_lm):
    with pytest.raises(TypeError, match="unexpected keyword argument 'min_pp'.*'min_p'"):
        toy_lm.generate("Hi", max_new_tokens=2, min_pp=0.1)
    assert toy_lm.hook_count() == 0


def test_sampling_round_trips_through_its_wire_form():
    s = Sampling.of({"temperature": 0.7, "min_p": 0.1, "stop": ["x"], "stop_at_eos": False,
                     "logit_bias": {5: 1.0}, "seed": 3})  # fmt: skip
    given = {o.name: o.from_wire(s.wire()[o.wire]) for o in OPTIONS if s.wire()[o.wire] is not None}
    assert Sampling.of(given) == s


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), True, "0.1"])
def test_min_p_out_of_range_is_refused_by_name(toy_lm, value):
    with pytest.raises(SamplingError, match="min_p must be in"):
        toy_lm.generate("Hi", max_new_tokens=2, temperature=1.0, min_p=value)
    assert toy_lm.hook_count() == 0


def _hf_probs(logits, temperature, top_k, top_p, min_p):
    """The distribution HF's generate samples from: its warpers, in its order."""
    scores = logits.clone()
    warpers = [TemperatureLogitsWarper(temperature)]
    if top_k:
        warpers.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p))
    warpers.append(MinPLogitsWarper(min_p))
    for warp in warpers:
        scores = warp(None, scores)
    return scores.softmax(-1)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "min_p"),
    [(1.0, None, 1.0, 0.05), (0.7, None, 1.0, 0.2), (1.3, 20, 1.0, 0.1), (1.0, None, 0.9, 0.1)],
)
def test_min_p_samples_from_hf_warpers_distribution(temperature, top_k, top_p, min_p):
    """Inverse-CDF sampling over an even grid of uniforms reproduces the distribution it
    samples from to 1/n: it must be the one HF's warpers give, token for token."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 2.0
    n = 20000
    uniform = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    for row in range(3):
        picked = sample_next(logits[row].expand(n, -1), uniform, temperature=temperature,
                             top_k=top_k, top_p=top_p, min_p=min_p)  # fmt: skip
        freq = torch.bincount(picked, minlength=50).double() / n
        expected = _hf_probs(logits[row : row + 1], temperature, top_k, top_p, min_p)[0].double()
        assert set(freq.nonzero().flatten().tolist()) == set(expected.nonzero().flatten().tolist())
        torch.testing.assert_close(freq, expected, atol=2.0 / n, rtol=0)


def test_min_p_one_decodes_as_hf_generate_does(toy_lm, toy_hf):
    """At min_p 1 only the likeliest token is left, so HF's sampled generate is deterministic:
    steerlab's sampled rows equal it token for token (and differ without min_p)."""
    text = "Once upon a time"
    ids = list(prompt_ids(toy_lm, text))
    hf = toy_hf.generate(torch.tensor([ids]), max_new_tokens=30, do_sample=True, top_k=0,
                         temperature=1.5, min_p=1.0, pad_token_id=2)[0, len(ids):].tolist()  # fmt: skip
    hf = hf[: hf.index(1)] if 1 in hf else hf
    got = toy_lm.generate(text, max_new_tokens=30, temperature=1.5, min_p=1.0, seed=0)
    assert got.tokens[0] == hf
    loose = toy_lm.generate(text, max_new_tokens=30, temperature=1.5, seed=0)
    assert loose.tokens[0] != hf


def test_min_p_through_the_server_and_connect(toy_lm):
    greedy = toy_lm.generate("Once upon a time", max_new_tokens=12).text[0]
    with served(toy_lm) as url:
        body = {"model": "steerlab-tiny", "prompt": "Once upon a time", "max_tokens": 12,
                "temperature": 1.5, "min_p": 1.0, "seed": 0}  # fmt: skip
        reply = post(url, "/v1/completions", body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"] == greedy
        bad = post(url, "/v1/completions", {**body, "min_p": 2})
        assert bad.status_code == 400 and "min_p" in bad.text
        remote = sl.connect(url, api_key=KEY)
        out = remote.generate("Once upon a time", max_new_tokens=12, temperature=1.5, min_p=1.0)
        assert out.text[0] == greedy
        with pytest.raises(SamplingError, match="min_p"):
            remote.generate("Hi", max_new_tokens=2, min_p=-1.0)
