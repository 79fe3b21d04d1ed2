"""Issue 51, the benchmark's doors: the prompting template, judge-written prompts, ratings of
any real type, the judge's settings, detection's AUROC, factors, and the judge's HTTP client
(whole-request deadline, capped waits, deep JSON, header-illegal keys)."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
import torch

import steerlab as sl
import steerlab.evals.judge as judge_module
from steerlab.evals.detection import roc_auc
from steerlab.evals.judge import MAX_WAIT, Judge, JudgeError, retry_wait
from steerlab.evals.methods import Prompting
from steerlab.evals.pipeline import _Rater
from steerlab.evals.protocol import score_sample
from steerlab.evals.runstore import RunStore

SITE = "blocks.2.hook_resid_pre"
ASKS = ["Tell me a story about the sea.", "Tell me a story about the beach."]


def _never_compute(monkeypatch, lm) -> None:
    def never(*args, **kwargs):
        raise AssertionError("computed before refusing")

    monkeypatch.setattr(type(lm), "generate", never)
    monkeypatch.setattr(type(lm.model), "forward", never)


class Rater:
    """A judge object with no server: ``answer`` is what ``rate`` returns."""

    def __init__(self, answer=(2.0, 2.0, 2.0), max_workers=None, written=None) -> None:
        self.answer = answer
        if max_workers is not None:
            self.max_workers = max_workers
        self.written = written

    def rate(self, concept, instruction, text):
        return self.answer

    def write_prompt(self, concept):
        return self.written


# --- the prompting template --------------------------------------------------------------


def test_the_template_is_filled_by_name_and_every_other_brace_is_text():
    arm = Prompting(template='{"system": "{prompt}", "user": "{instruction}"} {0} {} {name}')
    got = arm.inputs("Be {cheerful}.", ["Say {prompt} and {0}."])
    # the values are put in as they are: a value is never read as a template again
    assert got == ['{"system": "Be {cheerful}.", "user": "Say {prompt} and {0}."} {0} {} {name}']
    default = Prompting().inputs("P {x}", ["Q {instruction}"])
    assert default == ["P {x}\n\nQuestion: Q {instruction}"]


@pytest.mark.parametrize("template", [
    "{instruction.__class__.__mro__}", "{instruction} {prompt.upper}", "{instruction[0]}",
    "{instruction!r}", "{prompt:>10} {instruction}",
])  # fmt: skip
def test_a_template_field_with_format_extras_is_refused_by_name(template):
    with pytest.raises(sl.SteerError, match="template has the field") as info:
        Prompting(template=template)
    assert info.value.field == "template"


@pytest.mark.parametrize("name", ["", "  ", None, 3])
def test_a_prompting_arm_needs_a_name(name):
    with pytest.raises(sl.SteerError, match="Prompting name must be a non-empty string"):
        Prompting("Be happy.", name=name)


# --- judge-written prompts ---------------------------------------------------------------


@pytest.mark.parametrize(("written", "match"), [
    (None, "wrote no prompt for the concept 'the sea'.*returned None"),
    ("", "wrote no prompt for the concept 'the sea'"),
    ("   ", "wrote no prompt for the concept 'the sea'"),
    (7, "wrote no prompt for the concept 'the sea'"),
    ("The text mentions the sea.\nRating: 1", "concept 'the sea' holds a 'Rating:'"),
    ("Always be cheerful and kind.", "concept 'the sea' names none of the concept's words"),
])  # fmt: skip
def test_a_judge_written_prompt_in_no_usable_form_is_refused_before_any_compute(
        toy_lm, monkeypatch, written, match):  # fmt: skip
    _never_compute(monkeypatch, toy_lm)
    data = sl.evals.ConceptData("the sea", instructions=ASKS)
    with pytest.raises(sl.SteerError, match=match):  # after the cheap checks: 8 tokens fit
        sl.evals.benchmark(toy_lm, [data], [Prompting()], site=SITE, max_new_tokens=8,
                           judge=Rater(written=written), progress=False)  # fmt: skip


def test_a_judge_written_prompt_naming_the_concept_is_used(toy_lm):
    data = sl.evals.ConceptData("oceans", instructions=ASKS)
    written = "  Always bring the ocean into every reply.  "
    result = sl.evals.benchmark(toy_lm, [data], [Prompting()], site=SITE,
                                judge=Rater(written=written), max_new_tokens=2, n_boot=10,
                                progress=False)  # fmt: skip
    assert result.prompts[("prompt", "oceans")] == written.strip()
    assert result.samples[0]["model_input"].startswith(written.strip() + "\n\nQuestion: ")


# --- ratings of any real type, and the judge's max_workers ------------------------------


def rate_samples(judge, samples: list[dict], done=None) -> int:
    """The benchmark's own path: its judge workers rate each sample into an in-memory run
    store, then AxBench's reading of the stored ratings; returns the unreadable count."""
    store = RunStore(None)
    rater = _Rater(judge, store, None)
    data = sl.evals.ConceptData("c", instructions=[s["instruction"] for s in samples])
    texts = [(r, 1.0, r, s["instruction"], s["text"]) for r, s in enumerate(samples)]
    try:
        rater.wait(rater.submit(("m", "c"), data, texts))
    finally:
        rater.pool.shutdown()
    rated = store.ratings(("m", "c"))
    return sum(score_sample(s, rated[r][0]) for r, s in enumerate(samples))


def _samples(n: int = 3) -> list[dict]:
    return [{"concept": "c", "instruction": f"i{k}", "text": f"t{k}"} for k in range(n)]


@pytest.mark.parametrize("answer", [
    (torch.tensor(1.0), torch.tensor(2), torch.tensor(0.5, dtype=torch.float16)),
    (Fraction(1, 2), Decimal("1"), np.array(2.0)),
    (np.float32(0.5), np.int64(1), np.float64(2.0)),
])  # fmt: skip
def test_ratings_of_any_real_number_type_are_read(answer):
    samples = _samples()
    assert rate_samples(Rater(answer), samples, lambda: None) == 0
    want = [float(a) for a in answer]
    assert [samples[0][k] for k in ("concept_rating", "instruction_rating",
                                    "fluency_rating")] == want  # fmt: skip
    assert samples[0]["score"] == pytest.approx(3 / sum(1 / w for w in want))


@pytest.mark.parametrize("answer", [
    (torch.tensor(math.nan), 1.0, 1.0), (torch.tensor([1.0]), 1.0, 1.0), (True, 1.0, 1.0),
    ("2", 1.0, 1.0), (Decimal("NaN"), 1.0, 1.0), (torch.tensor(3.0), 1.0, 1.0),
])  # fmt: skip
def test_ratings_that_are_no_number_in_range_are_counted_unreadable(answer):
    samples = _samples(2)
    assert rate_samples(Rater(answer), samples, lambda: None) == 2
    assert all(s["parse_failed"] and s["score"] == 0.0 for s in samples)


@pytest.mark.parametrize("workers", [0, -1, True, 2.5, "8", None])
def test_a_judge_with_a_bad_max_workers_is_refused_before_any_compute(toy_lm, monkeypatch,
                                                                     workers):  # fmt: skip
    judge = Rater()
    judge.max_workers = workers
    with pytest.raises(sl.SteerError, match="max_workers must be an int >= 1"):
        rate_samples(judge, _samples(), lambda: None)
    _never_compute(monkeypatch, toy_lm)
    data = sl.evals.ConceptData("the sea", instructions=ASKS)
    with pytest.raises(sl.SteerError, match="max_workers must be an int >= 1"):
        sl.evals.benchmark(toy_lm, [data], [Prompting("Talk about the sea.")], site=SITE,
                           judge=judge, progress=False)  # fmt: skip


def test_a_judge_without_max_workers_runs_eight_at_once():
    in_flight, most = [0], [0]
    lock = threading.Lock()

    class Slow(Rater):
        def rate(self, concept, instruction, text):
            with lock:
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
            time.sleep(0.05)
            with lock:
                in_flight[0] -= 1
            return 1.0, 1.0, 1.0

    assert rate_samples(Slow(), _samples(24), lambda: None) == 0
    assert 1 <= most[0] <= 8


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"timeout": math.nan}, "timeout"), ({"timeout": math.inf}, "timeout"),
    ({"timeout": 0}, "timeout"), ({"timeout": None}, "timeout"), ({"timeout": "5"}, "timeout"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 8.0}, "max_tokens"), ({"max_workers": 0}, "max_workers"),
    ({"max_workers": False}, "max_workers"), ({"max_retries": -1}, "max_retries"),
    ({"model": None}, "model"), ({"model": ""}, "model"),
])  # fmt: skip
def test_judge_settings_are_refused_at_construction_by_name(kwargs, name):
    options = {"base_url": "http://127.0.0.1:1/v1", "model": "m", **kwargs}
    with pytest.raises(sl.SteerError, match=name) as info:
        Judge(**options)
    assert info.value.field == name


def test_judge_settings_may_be_numpy_numbers():
    judge = Judge("http://127.0.0.1:1/v1", "m", timeout=np.float32(2.5), max_workers=np.int64(3))
    assert (judge.timeout, judge.max_workers) == (2.5, 3)


# --- detection ---------------------------------------------------------------------------


def test_roc_auc_equals_sklearn_on_random_scores_with_ties():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(51)
    for trial in range(200):
        n, m = rng.integers(1, 60, size=2)
        levels = int(rng.integers(1, 12))  # few levels: many ties, within and across sides
        pos, neg = rng.integers(0, levels, n) / 3.0, rng.integers(0, levels, m) / 3.0
        want = metrics.roc_auc_score([1] * n + [0] * m, np.concatenate([pos, neg]))
        assert roc_auc(torch.tensor(pos), list(neg)) == pytest.approx(want, abs=1e-12), trial


def test_roc_auc_memory_grows_with_n_plus_m_not_n_times_m():
    """400k x 400k scores: an n x m comparison would need 160 billion cells (over a
    terabyte); the rank statistic needs a few megabytes."""
    g = torch.Generator().manual_seed(0)
    pos = torch.randn(400_000, generator=g, dtype=torch.float64) + 1.0
    neg = torch.randn(400_000, generator=g, dtype=torch.float64)
    # P(X > Y) for X ~ N(1, 1), Y ~ N(0, 1) is Phi(1 / sqrt(2))
    want = 0.5 * (1 + math.erf(0.5))
    assert roc_auc(pos, neg) == pytest.approx(want, abs=3e-3)


@pytest.mark.parametrize(("positive", "negative", "match"), [
    ([1.0, math.nan], [0.0], r"positive scores must be finite real numbers; got nan at \[1\]"),
    (torch.tensor([1.0]), torch.tensor([math.nan, 0.0]), r"negative scores .* nan at \[0\]"),
    ([1.0], [math.inf], r"negative scores must be finite"),
    (["a"], [0.0], r"positive scores must be finite real numbers; got 'a'"),
    ([1.0], "ab", r"negative must be a list"),
    ([], [1.0], "positive scores are empty"),
    ([1.0], torch.tensor([], dtype=torch.float64), "negative scores are empty"),
    (torch.tensor([True]), [1.0], "positive scores must be real numbers"),
])  # fmt: skip
def test_roc_auc_refuses_what_is_not_a_finite_score_by_name(positive, negative, match):
    with pytest.raises(sl.SteerError, match=match):
        roc_auc(positive, negative)


def test_sklearn_refuses_a_nan_score_too():
    metrics = pytest.importorskip("sklearn.metrics")
    with pytest.raises(ValueError):
        metrics.roc_auc_score([1, 1, 0], [1.0, math.nan, 0.0])


def test_roc_auc_reads_numpy_and_torch_numbers_in_lists():
    assert roc_auc([np.float32(3.0), torch.tensor(2.0)], [np.int64(1), Fraction(2)]) == 0.875


# --- factors: one rule, everywhere -------------------------------------------------------


def _make(lm, data, site):
    return None


@pytest.mark.parametrize("build", [
    lambda f: sl.evals.Method("mine", make=_make, factors=f),
    lambda f: Prompting("Be happy.", factors=f),
])  # fmt: skip
def test_factors_are_any_finite_real_numbers(build):
    arm = build([np.float32(2.0), np.int64(2), Fraction(1, 2), torch.tensor(4), np.array([3.0])[0]])
    assert arm.factors == (2.0, 2.0, 0.5, 4.0, 3.0)
    assert all(type(f) is float for f in arm.factors)
    assert build(np.array([1, 2])).factors == (1.0, 2.0)


@pytest.mark.parametrize(("factors", "match"), [
    ([10**400], r"finite real numbers; got 1000.* at \[0\]"),
    ([1.0, math.nan], r"finite real numbers; got nan at \[1\]"),
    ([True], "finite real numbers; got True"),
    ([], "is empty"),
    ("12", "must be a list of numbers"),
    ({1.0}, "must be a list of numbers"),
    (np.ones((2, 2)), "shape"),
])  # fmt: skip
@pytest.mark.parametrize(("build", "what"), [
    (lambda f: sl.evals.Method("mine", make=_make, factors=f), "Method 'mine' factors"),
    (lambda f: Prompting("Be happy.", factors=f), "Prompting factors"),
])  # fmt: skip
def test_bad_factors_are_refused_at_construction_by_name(factors, match, build, what):
    with pytest.raises(sl.SteerError, match=f"{what} {match}|{what} .*{match}"):
        build(factors)


@pytest.mark.parametrize(("alphas", "match"), [
    ([0, 10**400], r"alphas must be finite real numbers; got 1000.* at \[1\]"),
    ([0, np.float32(4.0), np.float32(4.0)], "alphas repeat a value"),
])  # fmt: skip
def test_steerability_alphas_follow_the_same_rule(toy_lm, monkeypatch, alphas, match):
    vec = sl.SteeringVector({SITE: torch.ones(toy_lm.d_model)})
    _never_compute(monkeypatch, toy_lm)
    with pytest.raises(sl.SteerError, match=match):
        sl.evals.steerability(toy_lm, vec, ["Hi"], alphas, concept=lambda text: 0.0,
                              progress=False)  # fmt: skip


def test_steerability_reads_numpy_alphas():
    from steerlab.evals.steerability import _alphas

    assert _alphas([np.float32(-2.0), np.int64(0), torch.tensor(4)]) == [-2.0, 0.0, 4.0]


PAIRS = [
    sl.Preference("The day was", " happy and bright.", " sad and cold."),
    sl.Preference("Tom felt", " glad and warm, and he sang.", " scared."),
]


def test_reps_reads_numpy_factors_as_the_same_numbers(toy_lm):
    options = {"site": SITE, "epochs": 1, "batch_size": 2, "seed": 1, "progress": False}
    plain, _ = sl.train.reps(toy_lm, PAIRS, factors=[2.0, 4.0], **options)
    numpy, _ = sl.train.reps(toy_lm, PAIRS, factors=[np.float32(2.0), np.int64(4)], **options)
    assert torch.equal(plain.directions[SITE], numpy.directions[SITE])


def test_reft_reads_numpy_factors_as_the_same_numbers(toy_lm):
    options = {"site": "blocks.2.hook_resid_post", "rank": 2, "objective": "reps", "epochs": 1,
               "batch_size": 2, "seed": 0, "progress": False}  # fmt: skip
    plain, _ = sl.train.reft(toy_lm, PAIRS, factors=[0.5, 1.0], **options)
    numpy, _ = sl.train.reft(toy_lm, PAIRS, factors=np.array([0.5, 1.0], dtype=np.float32),
                             **options)  # fmt: skip
    assert all(torch.equal(plain.tensors()[n], numpy.tensors()[n]) for n in ("R", "W", "b"))


@pytest.mark.parametrize("train", [sl.train.reps, sl.train.reft])
def test_training_refuses_an_int_past_floats_range_by_name(toy_lm, monkeypatch, train):
    _never_compute(monkeypatch, toy_lm)
    extra = {} if train is sl.train.reps else {"objective": "reps"}
    with pytest.raises(sl.SteerError, match="factors must be finite real numbers"):
        train(toy_lm, PAIRS, site=SITE, factors=[2, 10**400], progress=False, **extra)


# --- the judge's HTTP client -------------------------------------------------------------


@contextmanager
def raw_server(answer: Callable[..., None]) -> Iterator[str]:
    """A loopback server speaking raw bytes: ``answer(conn, n)`` (or ``answer(conn, n,
    head)``, with the request's head) replies to the n-th request after reading it; yields
    the base URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    count = [0]

    def handle(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, rest = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
                while len(rest) < length:
                    rest += conn.recv(65536)
                count[0] += 1
                wants_head = answer.__code__.co_argcount == 3
                answer(conn, count[0], head) if wants_head else answer(conn, count[0])
            except OSError:  # the client hung up: what the deadline is for
                pass

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join()
        listener.close()


def _completion(text: str = "Rating: 2") -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()


def _reply(status: int, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}", "Connection: close",
             *(f"{k}: {v}" for k, v in (headers or {}).items())]  # fmt: skip
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _trickle(data: bytes, stop_sending: threading.Event) -> Callable[[socket.socket, int], None]:
    def answer(conn: socket.socket, n: int) -> None:
        for k in range(len(data)):
            if stop_sending.is_set():
                return
            conn.sendall(data[k : k + 1])
            time.sleep(0.1)

    return answer


@pytest.mark.parametrize("part", ["body", "headers"])
def test_a_trickled_reply_cannot_stretch_the_judges_timeout(part):
    """Each byte comes 0.1 s after the last, well within any per-read timeout: the whole
    reply would take about 30 s. The deadline is 1 s for the whole request."""
    done = threading.Event()
    body = _completion("x" * 150 + " Rating: 2")
    data = _reply(200, body)
    if part == "body":  # the headers at once, the body a byte at a time
        head, sep, rest = data.partition(b"\r\n\r\n")

        def answer(conn: socket.socket, n: int) -> None:
            conn.sendall(head + sep)
            _trickle(rest, done)(conn, n)
    else:  # the status line and headers a byte at a time (padded to last long)
        answer = _trickle(data.replace(b"Connection: close", b"Connection: close\r\nX-Pad: "
                                       + b"p" * 300), done)  # fmt: skip
    try:
        with raw_server(answer) as url:
            judge = Judge(url, "m", timeout=1, max_retries=0)
            with pytest.raises(JudgeError, match="did not answer"):
                judge.ask("q")
    finally:
        done.set()


def test_a_reply_within_the_deadline_is_read(monkeypatch):
    with raw_server(lambda conn, n: conn.sendall(_reply(200, _completion("Rating: 1")))) as url:
        assert Judge(url, "m", timeout=5).rate("c", "i", "t") == (1.0, 1.0, 1.0)


def test_retry_after_nan_is_read_as_absent(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(judge_module, "_sleep", waits.append)

    def answer(conn: socket.socket, n: int) -> None:
        if n == 1:
            conn.sendall(_reply(503, b"busy", {"Retry-After": "nan"}))
        else:
            conn.sendall(_reply(200, _completion("Rating: 1")))

    with raw_server(answer) as url:
        assert Judge(url, "m", max_retries=2).ask("q") == "Rating: 1"
    assert waits == [1.0]  # the backoff's first wait, as if no Retry-After were sent


@pytest.mark.parametrize("value", ["nan", "NaN", "-nan", "inf", "1e999", "-5", "soon", None])
def test_retry_after_is_always_a_wait_sleep_accepts_and_at_most_the_cap(value):
    for attempt in range(40):
        wait = retry_wait(value, attempt)
        assert math.isfinite(wait) and 0.0 <= wait <= MAX_WAIT


def test_endless_500s_back_off_exponentially_up_to_the_cap(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(judge_module, "_sleep", waits.append)
    server = raw_server(lambda conn, n: conn.sendall(_reply(500, b"down")))
    with server as url, pytest.raises(JudgeError, match="answered 500"):
        Judge(url, "m", max_retries=12).ask("q")
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60, 60]
    assert max(waits) == MAX_WAIT


def test_a_judge_that_never_connects_backs_off_up_to_the_cap_too(monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(judge_module, "_sleep", waits.append)
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
    with pytest.raises(JudgeError, match="did not answer"):
        Judge(f"http://127.0.0.1:{port}/v1", "m", max_retries=9, timeout=2).ask("q")
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]


def test_a_body_nested_too_deep_for_pythons_parser_is_a_judge_error():
    deep = b"[" * 100_000 + b"]" * 100_000
    server = raw_server(lambda conn, n: conn.sendall(_reply(200, deep)))
    with server as url, pytest.raises(JudgeError, match="not a chat completion"):
        Judge(url, "m", max_retries=0).ask("q")


@pytest.mark.parametrize("key", ["sk-abc\ndef", "sk-abc\r\nX-Evil: 1", "sk abc", " sk-abc",
                                 "sk-ключ", "sk-\x00", ""])  # fmt: skip
def test_an_api_key_a_header_cannot_carry_is_refused_at_construction(key):
    if key == "":  # an empty key sends no header at all: accepted
        Judge("http://127.0.0.1:1/v1", "m", api_key=key)
        return
    with pytest.raises(sl.SteerError, match="api_key has a character a header cannot") as info:
        Judge("http://127.0.0.1:1/v1", "m", api_key=key)
    assert info.value.field == "api_key"
    assert "abc" not in str(info.value)  # the key itself is never shown


def test_a_key_from_the_environment_is_checked_naming_the_variable(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-abc\n")
    with pytest.raises(sl.SteerError, match="OPENAI_API_KEY .*cannot carry"):
        Judge("http://127.0.0.1:1/v1", "m")


def test_the_key_is_sent_as_a_bearer_token():
    heads: list[bytes] = []

    def answer(conn: socket.socket, n: int, head: bytes) -> None:
        heads.append(head)
        conn.sendall(_reply(200, _completion()))

    with raw_server(answer) as url:
        assert Judge(url, "m", api_key="sk-good_key.1").ask("q") == "Rating: 2"
    assert b"\r\nAuthorization: Bearer sk-good_key.1\r\n" in heads[0] + b"\r\n"


def test_the_judge_goes_through_the_environments_proxy(monkeypatch):
    """As httpx did: a request to a judge goes to HTTP_PROXY in absolute form, with the
    proxy's credentials; a host in NO_PROXY is reached directly."""
    heads: list[bytes] = []

    def answer(conn: socket.socket, n: int, head: bytes) -> None:
        heads.append(head)
        conn.sendall(_reply(200, _completion()))

    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with raw_server(answer) as url:
        proxy = url.removesuffix("/v1").replace("http://", "http://me:s%40fe@")
        monkeypatch.setenv("http_proxy", proxy)
        assert Judge("http://judge.invalid/v1", "m").ask("q") == "Rating: 2"
        assert heads[0].startswith(b"POST http://judge.invalid/v1/chat/completions HTTP/1.1")
        assert b"Proxy-Authorization: Basic bWU6c0BmZQ==" in heads[0]  # me:s@fe
        monkeypatch.setenv("no_proxy", "judge.invalid")
        with pytest.raises(JudgeError, match="did not answer"):
            Judge("http://judge.invalid/v1", "m", max_retries=0).ask("q")  # no such host
    assert len(heads) == 1


def test_a_socks_proxy_in_the_environment_is_refused_by_name(monkeypatch):
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:1080")
    with pytest.raises(sl.SteerError, match="only http:// and https:// proxies") as info:
        Judge("http://judge.invalid/v1", "m")
    assert info.value.field == "base_url"


def test_a_template_without_prompt_is_the_instruction_alone_and_asks_no_judge():
    """``Prompting(template="{instruction}")``: the unsteered arm (tutorial 12); no prompt is
    written, and one given would never be used, so it is refused by name."""
    arm = sl.evals.Prompting(template="{instruction}", name="unsteered", factors=[0])
    assert not arm.asks_judge and sl.evals.Prompting().asks_judge

    class Mute:  # a judge that cannot write prompts: never asked
        def write_prompt(self, concept):
            raise AssertionError("asked to write a prompt")

    assert arm.prompt_for(Mute(), "the sea") == ""
    assert arm.inputs("", ["Tell me a story."]) == ["Tell me a story."]
    with pytest.raises(sl.SteerError, match=r"no \{prompt\}.*never be used") as caught:
        sl.evals.Prompting(prompt="Talk of the sea.", template="{instruction}")
    assert caught.value.field == "prompt"
