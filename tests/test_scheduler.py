"""The engine's scheduler on the fake backend: in-process callers share batches, each row
equals its run alone, a failing request fails alone, and the server answers through it."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import torch
from server_helpers import HEADERS, post, served

import steerlab as sl
from steerlab.engine import Request, Sampling, Steer
from steerlab.engine.scheduler import Done, Job, Scheduler
from steerlab.testing import FakeBackend, char_tokenizer

SITE = FakeBackend.site


@pytest.fixture
def lm():
    return sl.SteerableModel(FakeBackend(), char_tokenizer())


def _request(lm, text: str, alpha: float = 0.0, op=None, n: int = 6) -> Request:
    ids = tuple(lm.tokenizer(text)["input_ids"])
    vector = torch.zeros(lm.d_model)
    vector[7] = 1.0
    steers = (Steer(SITE, vector, alpha, "all", op or sl.Add()),) if alpha else ()
    return Request(ids, steers, Sampling(max_new_tokens=n, stop_at_eos=False), stream=text)


def test_concurrent_callers_share_batches_and_each_equals_its_run_alone(lm):
    jobs = [[_request(lm, "hello", 0.0)], [_request(lm, "abc", 30.0)], [_request(lm, "xy", 0.0)]]
    alone = [lm.engine.run(requests) for requests in jobs]
    scheduler = Scheduler(lambda _: lm.engine, window_s=0.3).start()
    results: list = [None] * len(jobs)

    def caller(i: int) -> None:
        results[i] = scheduler.run(jobs[i], timeout=30)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(jobs))]
    forwards = len(lm.backend.forwards)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    scheduler.stop()
    assert [[c.tokens for c in r] for r in results] == [[c.tokens for c in r] for r in alone]
    assert scheduler.batches < len(jobs)  # the window put at least two callers in one batch
    assert len(lm.backend.forwards) - forwards < 3 * 6  # fewer forwards than three runs
    assert lm.hook_count() == 0


def test_a_failing_request_fails_alone_and_the_others_are_answered(lm):
    def poison(act, direction, alpha):
        return act * float("nan")

    good, bad = [_request(lm, "hello", 30.0)], [_request(lm, "abc", 1.0, op=poison)]
    want = lm.engine.run(good)
    scheduler = Scheduler(lambda _: lm.engine, window_s=0.3).start()
    outcome: dict[str, object] = {}

    def run(name: str, requests: list[Request]) -> None:
        try:
            outcome[name] = scheduler.run(requests, timeout=30)
        except Exception as error:  # the job's own error comes back to its caller
            outcome[name] = error

    threads = [threading.Thread(target=run, args=a) for a in (("good", good), ("bad", bad))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    scheduler.stop()
    assert isinstance(outcome["bad"], FloatingPointError)
    assert [c.tokens for c in outcome["good"]] == [c.tokens for c in want]  # type: ignore[union-attr]
    assert lm.hook_count() == 0


def test_jobs_with_different_keys_decode_on_their_own_engines(lm):
    other = sl.SteerableModel(FakeBackend(), char_tokenizer())
    scheduler = Scheduler(lambda key: (lm if key == "a" else other).engine).start()
    scheduler.run([_request(lm, "hello")], key="a")
    scheduler.run([_request(lm, "abc")], key="b")
    scheduler.stop()
    assert lm.backend.forwards and other.backend.forwards


def test_the_server_answers_through_the_scheduler_on_the_fake_backend(lm):
    with served(lm) as url:
        body = {"model": "model", "prompts": ["hello", "abc"], "max_tokens": 5, "ignore_eos": True}
        reply = post(url, "/v1/batch", body).json()
    want = lm.generate(["hello", "abc"], max_new_tokens=5, stop_at_eos=False)
    assert [r["rows"][0]["token_ids"] for r in reply["results"]] == want.tokens


def test_the_after_batch_sweep_leaves_another_calls_hooks_alone(toy_lm):
    """A batch's hook sweep while another call holds the model (a paused stream here, a
    thread's generate in a server) must not strip that call's steering."""
    steer = sl.Steer("blocks.2.hook_resid_pre", torch.randn(toy_lm.d_model) * 8.0)
    want = toy_lm.generate("Once upon a time", steer=steer, max_new_tokens=12).text[0]
    stream = toy_lm.stream("Once upon a time", steer=steer, max_new_tokens=12)
    first = next(stream)  # the stream is paused holding the model, its hooks on
    held = toy_lm.hook_count()
    assert held > 0
    scheduler = Scheduler(lambda _: toy_lm.engine)
    scheduler._check_hooks(toy_lm.engine)
    assert toy_lm.hook_count() == held
    *_, last = [first, *stream]
    assert last.result().text[0] == want
    assert toy_lm.hook_count() == 0
    assert toy_lm.engine.sweep_hooks() == 0  # nothing left, nothing in flight


def test_the_after_batch_sweep_never_holds_an_idle_model(toy_lm, monkeypatch):
    """With no hooks to remove, a sweep takes no hold: another thread's call that starts
    at that moment is never refused."""
    import steerlab.engine.local.engine as local

    def refuse(*args, **kwargs):
        raise AssertionError("the sweep held the model with nothing to remove")

    monkeypatch.setattr(local, "calling", refuse)
    assert toy_lm.engine.sweep_hooks() == 0


def test_an_announced_window_waits_for_announced_jobs_and_for_nothing_else(lm):
    """With callers announcing their jobs, the window (an hour here) closes as soon as nothing
    is queued or announced, after batches of one job: a lone job is answered at once, an
    announcement withdrawn is not waited for, and two announced jobs share one batch however
    far apart they come. After a batch of several, the window is waited for again."""
    scheduler = Scheduler(lambda _: lm.engine, window_s=3600, announced=True).start()

    def two_jobs(announced: bool) -> None:  # submitted 0.2 s apart: one batch
        done = [threading.Event() for _ in range(2)]
        jobs = [Job([_request(lm, text)], None, lambda e, d=d: d.set() if isinstance(e, Done) else None)
                for text, d in zip(["abc", "xy"], done)]  # fmt: skip
        before = scheduler.batches
        scheduler.submit(jobs[0], expected=announced)
        time.sleep(0.2)  # the engine thread takes it, and waits for the other
        scheduler.submit(jobs[1], expected=announced)
        assert all(d.wait(60) for d in done)
        assert scheduler.batches == before + 1

    try:
        scheduler.run([_request(lm, "hello")], timeout=60)  # an hour's window: not waited out
        scheduler.expect()
        scheduler.unexpect()
        scheduler.run([_request(lm, "hello")], timeout=60)
        scheduler.expect()
        scheduler.expect()
        two_jobs(announced=True)
        scheduler.window_s = 1.0  # clients side by side: the next batch waits out its window
        two_jobs(announced=False)
    finally:
        scheduler.stop()


def test_the_server_answers_one_request_at_a_time_without_waiting_out_its_window(lm):
    """A minute's window: each request is answered as soon as it is planned, and a request
    that fails validation leaves nothing announced behind."""
    with served(lm, window_ms=60_000) as url:
        body = {"model": "model", "prompt": "hello", "max_tokens": 2, "ignore_eos": True}
        for _ in range(2):  # a reply within 30 s, for a window of 60
            for sent, status in ((body, 200), ({**body, "max_tokens": -1}, 400)):
                reply = httpx.post(f"{url}/v1/completions", json=sent, headers=HEADERS, timeout=30)
                assert reply.status_code == status
