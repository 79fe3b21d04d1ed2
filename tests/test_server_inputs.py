"""Bad input to the server and its command line (issue 31): every numeric flag is checked at
start, a dead engine thread is a 503 (and /health says so), JSON values of the wrong type
are a 400 naming the field (pydantic's strict mode), batch ``alphas`` are honoured or
refused, a malformed pin is a 400, and a feature clamp's dtype is checked by name."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from reference import RefSteer, greedy
from server_helpers import HEADERS, post, served

import steerlab as sl
from steerlab import cli, loading
from steerlab.core.request import Sampling
from steerlab.core.rows import lay_out
from steerlab.engine.scheduler import EngineStopped, Scheduler
from steerlab.server import ServedModels, create_app

MODEL = "steerlab-tiny"
SITE = "blocks.1.hook_resid_pre"
# The serve command's options that take text, not numbers.
TEXT_FLAGS = {"--help", "--backend", "--host", "--api-key", "--amplify-before", "--preset",
              "--device", "--dtype", "--vllm-mode", "--graph", "--graph-kinds"}  # fmt: skip


# --- the command line ----------------------------------------------------------------


def _serve_parser():
    top = cli.parser()
    (commands,) = [a for a in top._actions if a.dest == "command"]
    return commands.choices["serve"]


def _numeric_flags() -> list[str]:
    flags = [a.option_strings[-1] for a in _serve_parser()._actions if a.option_strings]
    return [f for f in flags if f not in TEXT_FLAGS]


@pytest.fixture
def no_load(monkeypatch):
    """Loading a model fails the test: the checks under test come before it."""

    def load(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr(loading, "load", load)
    monkeypatch.setattr(sl, "load", load)


def test_every_numeric_flag_is_one_of_the_checked_ones():
    assert set(_numeric_flags()) == {
        "--port", "--beta", "--tensor-parallel-size", "--pipeline-parallel-size",
        "--max-model-len", "--idle-timeout", "--window-ms", "--max-batch-rows", "--max-n",
        "--max-rows", "--max-tokens", "--max-body-mb", "--max-vectors", "--max-vector-mb",
    }  # fmt: skip


@pytest.mark.parametrize("flag", _numeric_flags())
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "1e400", "big"])
def test_a_numeric_flag_out_of_range_exits_with_one_line_before_loading(
    flag, value, capsys, no_load
):
    if flag == "--beta" and value == "-1":  # a negative beta is a setting
        return
    with pytest.raises(SystemExit) as exit:
        cli.main(["serve", MODEL, f"{flag}={value}"])
    assert exit.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"steerlab serve: error: argument {flag}: must be ")
    assert repr(value) in error


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--window-ms", "10001"), ("--port", "0"), ("--port", "65536"), ("--max-n", "2.5"),
     ("--idle-timeout", "0"), ("--max-body-mb", "0"), ("--max-tokens", "0")],
)  # fmt: skip
def test_numeric_flags_are_checked_against_their_range(flag, value, capsys, no_load):
    with pytest.raises(SystemExit) as exit:
        cli.main(["serve", MODEL, flag, value])
    assert exit.value.code == 2
    assert f"argument {flag}: must be" in capsys.readouterr().err


def test_settings_in_range_are_kept():
    args = _serve_parser().parse_args(
        [MODEL, "--window-ms", "0", "--max-vectors", "0", "--max-vector-mb", "0.5", "--beta",
         "-2", "--port", "65535", "--idle-timeout", "0.25", "--max-body-mb", "1e-3"]
    )  # fmt: skip
    assert (args.window_ms, args.max_vectors, args.max_vector_mb, args.beta) == (0, 0, 0.5, -2)
    assert (args.port, args.idle_timeout, args.max_body_mb) == (65535, 0.25, 1e-3)
    assert type(args.max_vectors) is int and type(args.window_ms) is float


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "calm=a.safetensors@1", "--preset", "calm=b.safetensors@2"],
         "--preset: Preset 'calm' is given twice"),
        (["--preset", f"{MODEL}=a.safetensors@1"], f"--preset: Preset '{MODEL}' is the served"),
        (["--beta", "2"], "--beta is amplification's default; it needs --amplify-before"),
    ],
)  # fmt: skip
def test_flags_that_clash_exit_with_one_line_before_loading(argv, message, no_load):
    with pytest.raises(SystemExit) as exit:
        cli.main(["serve", MODEL, *argv])
    assert str(exit.value.code).startswith(f"steerlab serve: {message}")
    assert "\n" not in str(exit.value.code)


def test_a_scheduler_refuses_a_window_it_could_never_wait_out():
    for window in (float("nan"), float("inf"), -1.0, 1e300):
        with pytest.raises(ValueError, match="window_s must be"):
            Scheduler(lambda _: None, window_s=window)


# --- a dead engine thread --------------------------------------------------------------


def _dying_collect(self):
    """The engine thread takes a job, then dies (as ``--window-ms inf`` made it)."""
    self._queue.get()
    raise OverflowError("timeout value is too large")


def test_a_dead_engine_thread_makes_health_and_every_request_a_503(toy_lm, monkeypatch):
    monkeypatch.setattr(Scheduler, "_collect", _dying_collect)
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4}
    with served(toy_lm) as url:
        waiting = httpx.post(url + "/v1/completions", json=body, headers=HEADERS, timeout=60)
        health = httpx.get(url + "/health", headers=HEADERS, timeout=60)
        later = post(url, "/v1/completions", body)
        streamed = post(url, "/v1/completions", {**body, "stream": True})
        batch = post(url, "/v1/batch", {"model": MODEL, "prompts": ["Hi"], "max_tokens": 2})
    for reply in (waiting, later, streamed, batch):
        assert reply.status_code == 503, reply.text
        error = reply.json()["error"]
        assert error["type"] == "engine_stopped" and "OverflowError" in error["message"]
    assert health.status_code == 503
    assert health.json()["status"] == "unhealthy" and "OverflowError" in health.json()["error"]


def test_in_process_callers_of_a_dead_scheduler_get_an_error_not_a_hang(toy_lm, monkeypatch):
    monkeypatch.setattr(Scheduler, "_collect", _dying_collect)
    scheduler = Scheduler(lambda _: toy_lm.engine).start()
    try:
        requests = lay_out(toy_lm, ["Hi"], [], chat=False, new_tokens=0).requests(Sampling(2))
        for _ in range(2):  # the job it took as it died, then one submitted after
            with pytest.raises(EngineStopped, match="OverflowError"):
                scheduler.run(requests, timeout=60)
        assert not scheduler.running
    finally:
        scheduler.stop()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_DYING_SERVER = """
import sys
from steerlab.core.request import Sampling
from steerlab.core.rows import lay_out
from steerlab.engine.scheduler import EngineStopped, Scheduler
from steerlab import cli

def collect(self):
    self._queue.get()
    raise OverflowError("timeout value is too large")

Scheduler._collect = collect
sys.exit(cli.main(["serve", "steerlab-tiny", "--port", sys.argv[1]]))
"""


def test_a_server_whose_engine_thread_died_answers_503_and_stops_on_sigterm():
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    server = subprocess.Popen([sys.executable, "-c", _DYING_SERVER, str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        for _ in range(600):  # until it listens (loading the toy model takes seconds)
            try:
                httpx.get(url + "/v1/models", timeout=5)
                break
            except httpx.TransportError:
                assert server.poll() is None, server.stdout.read().decode()  # type: ignore[union-attr]
                time.sleep(0.2)
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4}
        reply = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert reply.status_code == 503, reply.text
        assert httpx.get(url + "/health", timeout=60).status_code == 503
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)  # uvicorn shuts down, then re-raises the signal
        log = server.stdout.read().decode()  # type: ignore[union-attr]
        assert code in (0, -signal.SIGTERM) and "Application shutdown complete" in log, log
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


# --- request bodies ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(toy_lm):
    with TestClient(create_app(ServedModels(toy_lm))) as test_client:
        yield test_client


def _refused(client, path, body, param):
    reply = client.post(path, json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    return error


BASE = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 2, "temperature": 0}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
STEER = {"site": SITE, "vector": [1.0] * 128}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {**BASE, "logprobs": "3"}, "logprobs"),
        ("/v1/completions", {**BASE, "logprobs": True}, "logprobs"),
        ("/v1/completions", {**BASE, "n": True}, "n"),
        ("/v1/completions", {**BASE, "max_tokens": "3"}, "max_tokens"),
        ("/v1/completions", {**BASE, "max_tokens": 3.0}, "max_tokens"),
        ("/v1/completions", {**BASE, "prompt": [True, False]}, "prompt"),
        ("/v1/completions", {**BASE, "prompt": [[1, True]]}, "prompt"),
        ("/v1/completions", {**BASE, "temperature": "0"}, "temperature"),
        ("/v1/completions", {**BASE, "temperature": False}, "temperature"),
        ("/v1/completions", {**BASE, "echo": "true"}, "echo"),
        ("/v1/completions", {**BASE, "echo": 1}, "echo"),
        ("/v1/completions", {**BASE, "seed": True}, "seed"),
        ("/v1/completions", {**BASE, "stream": "false"}, "stream"),
        ("/v1/completions", {**BASE, "stop": [1]}, "stop"),
        ("/v1/completions", {**BASE, "top_k": "2"}, "top_k"),
        ("/v1/completions", {**BASE, "stream": True, "stream_options": {"include_usage": "yes"}},
         "stream_options.include_usage"),
        ("/v1/completions", {**BASE, "steering": [{**STEER, "alpha": "2"}]}, "steering[0].alpha"),
        ("/v1/completions", {**BASE, "steering": [{**STEER, "positions": True}]},
         "steering[0].positions"),
        ("/v1/completions", {**BASE, "steering": [{**STEER, "vector": [True] * 128}]},
         "steering[0].vector"),
        ("/v1/completions", {**BASE, "amplify": {"beta": "1"}}, "amplify.beta"),
        ("/v1/chat/completions", {**CHAT, "logprobs": "true"}, "logprobs"),
        ("/v1/chat/completions", {**CHAT, "logprobs": 1}, "logprobs"),
        ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": "2"},
         "top_logprobs"),
        ("/v1/chat/completions", {**CHAT, "max_completion_tokens": True},
         "max_completion_tokens"),
        ("/v1/batch", {"model": MODEL, "prompts": ["Hi"], "chat": "no"}, "chat"),
        ("/v1/batch", {"model": MODEL, "prompts": ["Hi"], "alphas": ["1"], "steering": [STEER]},
         "alphas[0]"),
        ("/v1/batch", {"model": MODEL, "prompts": [{"prompt": "Hi", "max_tokens": "3"}]},
         "prompts[0].max_tokens"),
        ("/v1/batch", {"model": MODEL, "prompts": ["Hi", {"prompt": "Hi", "steering": [
            {**STEER, "alpha": "2"}]}]}, "prompts[1].steering[0].alpha"),
        ("/tokenize", {"prompt": "Hi", "add_special_tokens": "false"}, "add_special_tokens"),
        ("/tokenize", {"prompt": 7}, "prompt"),
        ("/detokenize", {"tokens": [True]}, "tokens[0]"),
        ("/detokenize", {"tokens": ["5"]}, "tokens[0]"),
        ("/detokenize", {"tokens": [5.0]}, "tokens[0]"),
    ],
)  # fmt: skip
def test_a_value_of_the_wrong_json_type_is_a_400_naming_its_field(client, path, body, param):
    _refused(client, path, body, param)


def test_json_numbers_of_the_right_kind_are_still_taken(client, toy_lm):
    """An int where a float belongs is a number (lm-eval sends ``"temperature": 0``)."""
    reply = client.post("/v1/completions", json={**BASE, "temperature": 0, "top_p": 1,
                                                 "logprobs": 0, "echo": True})  # fmt: skip
    assert reply.status_code == 200, reply.text
    ids = toy_lm.tokenizer("Once upon")["input_ids"]
    assert client.post("/detokenize", json={"tokens": ids}).json()["prompt"] == (
        toy_lm.tokenizer.decode(ids)
    )


# --- /v1/batch alphas ---------------------------------------------------------------------


def _batch(**fields):
    return {"model": MODEL, "prompts": ["Once upon a time"], "max_tokens": 3, **fields}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_batch(alphas=[], steering=[STEER]), "alphas"),
        (_batch(alphas=[0, 4]), "alphas"),  # no steering: one unsteered row would come back
        (_batch(alphas=[0, 4], steering=[{**STEER, "alpha": 2.0}]), "alphas"),  # none takes them
        (_batch(prompts=[{"prompt": "Hi", "alphas": []}], steering=[STEER]), "prompts[0].alphas"),
        (_batch(prompts=[{"prompt": "Hi", "alphas": [1, 2]}]), "prompts[0].alphas"),
    ],
)  # fmt: skip
def test_batch_alphas_that_nothing_would_honour_are_a_400(client, body, param):
    _refused(client, "/v1/batch", body, param)


def test_batch_alphas_are_honoured_where_a_steer_takes_them(client, toy_lm, toy_hf):
    """An item's own alphas scale the shared steering, as the shared alphas do: rows equal
    plain transformers with a hook adding alpha * v."""
    vector = torch.randn(128, generator=torch.Generator().manual_seed(3))
    steer = {"site": SITE, "vector": vector.tolist()}
    shared = client.post("/v1/batch", json=_batch(alphas=[0, 4], steering=[steer])).json()
    own = client.post("/v1/batch", json=_batch(
        prompts=[{"prompt": "Once upon a time", "alphas": [0, 4]}], steering=[steer])).json()  # fmt: skip
    ids = shared["results"][0]["prompt_token_ids"]
    want = [greedy(toy_hf, ids, [RefSteer(SITE, vector, alpha)], 3, toy_lm.eos_ids)
            for alpha in (0.0, 4.0)]  # fmt: skip
    assert want[0] != want[1]
    for reply in (shared, own):
        rows = reply["results"][0]["rows"]
        assert [r["token_ids"] for r in rows] == want
        assert [r["alphas"] for r in rows] == [[0.0], [4.0]]


# --- pins and ops ------------------------------------------------------------------------


def _uploaded(client, tmp_path):
    vector = sl.SteeringVector({SITE: torch.randn(128, generator=torch.Generator().manual_seed(5))})
    data = vector.save(tmp_path / "v.safetensors").read_bytes()
    assert client.post("/v1/vectors", params={"name": "v"}, content=data).status_code == 200
    return vector


@pytest.mark.parametrize("pin", ["not-a-hash", "", "0" * 63, "0" * 65, "g" * 64, " " + "0" * 63])
def test_a_pin_that_is_no_sha256_is_a_400_not_a_409(client, tmp_path, pin):
    _uploaded(client, tmp_path)
    body = {**BASE, "steering": [{"vector": "v", "alpha": 1.0, "sha256": pin}]}
    _refused(client, "/v1/completions", body, "steering[0].sha256")


def test_a_well_formed_pin_is_checked_against_the_vector(client, tmp_path):
    vector = _uploaded(client, tmp_path)
    body = {**BASE, "steering": [{"vector": "v", "alpha": 1.0}]}
    for pin in (vector.sha256, vector.sha256.upper()):
        reply = client.post("/v1/completions", json={**body, "steering": [
            {**body["steering"][0], "sha256": pin}]})  # fmt: skip
        assert reply.status_code == 200, reply.text
    stale = client.post("/v1/completions", json={**body, "steering": [
        {**body["steering"][0], "sha256": "0" * 64}]})  # fmt: skip
    assert stale.status_code == 409 and stale.json()["error"]["param"] == "steering[0].vector"


def _clamp(dtype: str) -> dict:
    return {"name": "feature_clamp", "value": 1.0, "index": 0, "encoder": [0.1] * 128,
            "bias": 0.0, "b_dec_in": [0.0] * 128, "dtype": dtype}  # fmt: skip


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "int32", "bool", "complex64"])
def test_a_clamp_in_a_dtype_no_model_computes_in_is_a_400_naming_the_op(client, dtype):
    body = {**BASE, "steering": [{**STEER, "op": _clamp(dtype)}]}
    error = _refused(client, "/v1/completions", body, "steering[0].op")
    assert dtype in error["message"]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_a_clamp_in_a_float_dtype_runs(client, dtype):
    body = {**BASE, "steering": [{**STEER, "op": _clamp(dtype)}]}
    reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
