"""A LoReFT wherever a steer goes: ``sl.sweep``, ``sl.evals.steerability`` and chat.

Each is checked against plain transformers with the ReFT formula as a hand hook
(``reference.py``): the completions greedy decoding gives, and the first-token KL.
"""

from __future__ import annotations

import pytest
import torch
from reference import RefSteer, greedy, logprobs

import steerlab as sl
from steerlab.core.request import Steer

SITE = "blocks.2.hook_resid_post"
SPAN = "first:3+last:3"
PROMPTS = ["Once upon a time", "The happy fox"]
ALPHAS = [0.0, 0.5, 1.0]


def parts(seed: int = 0, rank: int = 4, d: int = 128):
    g = torch.Generator().manual_seed(seed)
    R = torch.linalg.qr(torch.randn(d, rank, generator=g))[0].T.contiguous()
    return R, 0.3 * torch.randn(rank, d, generator=g), 8.0 * torch.randn(rank, generator=g)


def ref_steer(alpha: float, tensors=None) -> RefSteer:
    tensors = tensors or parts()
    return RefSteer(SITE, tensors[0][0], alpha, SPAN, "loreft", reft=tensors)


@pytest.fixture(scope="module")
def reft() -> sl.LoReFT:
    return sl.LoReFT(SITE, *parts(), positions=SPAN)


def ids_of(lm: sl.SteerableModel, prompt: str) -> list[int]:
    return lm.tokenizer(prompt)["input_ids"]


def reference_texts(lm, hf, alpha: float, n: int) -> list[str]:
    eos = set(lm.eos_ids)
    return [lm.tokenizer.decode(greedy(hf, ids_of(lm, p), [ref_steer(alpha)], n, eos))
            for p in PROMPTS]  # fmt: skip


def reference_kl(lm, hf, prompt: str, alpha: float) -> float:
    """KL(steered || unsteered) of the first new token, from two hooked HF forwards."""
    ids = ids_of(lm, prompt)
    steered = logprobs(hf, ids, [ref_steer(alpha)])[-1].double()
    plain = logprobs(hf, ids, [])[-1].double()
    return float((steered.exp() * (steered - plain)).sum())


def test_sweep_takes_a_loreft_at_its_own_site(toy_lm, toy_hf, reft):
    res = sl.sweep(toy_lm, reft * 2, PROMPTS, ALPHAS, max_new_tokens=6, progress=False)
    assert [(r["site"], r["alpha"]) for r in res] == [(SITE, a) for a in ALPHAS]
    for alpha in ALPHAS:  # reft * 2 at alpha a is the formula at 2a
        assert res.completions[(SITE, alpha)] == reference_texts(toy_lm, toy_hf, 2 * alpha, 6)
    kls = {r["alpha"]: r["kl"] for r in res}
    assert kls[0.0] == 0.0
    want = sum(reference_kl(toy_lm, toy_hf, p, 2.0) for p in PROMPTS) / len(PROMPTS)
    assert kls[1.0] == pytest.approx(want, rel=1e-3, abs=1e-6) and want > 1e-3
    assert toy_lm.hook_count() == 0


def test_sweep_names_a_loreft_beside_a_vector_and_refuses_other_sites(toy_lm, reft):
    vec = sl.SteeringVector({SITE: torch.randn(128, generator=torch.Generator().manual_seed(1))})
    res = sl.sweep(toy_lm, {"vec": vec, "reft": reft}, PROMPTS[:1], [1.0], max_new_tokens=3,
                   progress=False)  # fmt: skip
    assert [(r["vector"], r["site"]) for r in res] == [("vec", SITE), ("reft", SITE)]
    for where in ({"layers": [1]}, {"sites": ["blocks.2.hook_resid_pre"]}):
        with pytest.raises(ValueError, match=f"trained at, {SITE}"):
            sl.sweep(toy_lm, reft, PROMPTS, [1.0], progress=False, **where)


def test_steerability_of_a_loreft_is_the_formula(toy_lm, toy_hf, reft):
    res = sl.evals.steerability(toy_lm, reft, PROMPTS, ALPHAS, concept=len, max_new_tokens=6,
                                temperature=0, n_boot=20, progress=False)  # fmt: skip
    for alpha in ALPHAS:
        assert res.texts(alpha) == reference_texts(toy_lm, toy_hf, alpha, 6)
    kl = {(r["prompt"], r["alpha"]): r["kl"] for r in res.rows}
    for p, prompt in enumerate(PROMPTS):
        assert kl[(p, 0.0)] == 0.0
        assert kl[(p, 1.0)] == pytest.approx(reference_kl(toy_lm, toy_hf, prompt, 1.0),
                                             rel=1e-3, abs=1e-6)  # fmt: skip


def _chat_turns(lm, first, second) -> tuple[list, sl.ChatSession]:
    chat = lm.chat(steer=first)
    one = chat.say("Tell me a story.", max_new_tokens=6)
    chat.steer = second
    two = chat.say("What happened next?", max_new_tokens=6)
    return [one, two], chat


def test_chat_with_a_loreft_equals_hooks_and_its_key_holds_w_and_b(toy_lm, toy_hf, reft):
    """Two LoReFTs that share R (so the same steer vector, R's first row) but differ in b:
    the cache key tells them apart, and the turn after the change is recomputed."""
    R, W, b = parts()
    other = sl.LoReFT(SITE, R, W, -b, positions=SPAN)
    (one, two), chat = _chat_turns(toy_lm, reft, other)
    eos = set(toy_lm.eos_ids)
    for reply, tensors in ((one, parts()), (two, (R, W, -b))):
        want = greedy(toy_hf, reply.prompt_tokens[0], [ref_steer(1.0, tensors)], 6, eos)
        assert reply.tokens[0] == want
    assert chat.stats[-1].reused == 0  # the first 3 tokens changed steer: nothing reusable
    (a,), (b_,) = reft.steers(), other.steers()
    assert Steer.of(a, 1.0).fingerprint() != Steer.of(b_, 1.0).fingerprint()
    assert toy_lm.hook_count() == 0


def test_the_server_takes_a_loreft_upload(tmp_path, toy_lm, toy_hf, reft):
    """Uploaded with ``sl.connect`` and over plain HTTP; named in ``steering`` it is the
    formula (hooked HF logprobs), and a client steering with it inline gets the same."""
    import httpx
    from server_helpers import HEADERS, KEY, post, served

    ids = ids_of(toy_lm, "The happy fox ran to the sea")
    want = logprobs(toy_hf, ids, [ref_steer(0.5)])
    body = {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0, "model": "steerlab-tiny"}
    path = reft.save(tmp_path / "happy.reft.safetensors")
    with served(toy_lm) as url:
        remote = sl.connect(url, api_key=KEY)
        sha = remote.upload_vector("happy", reft)
        again = httpx.post(f"{url}/v1/vectors", params={"name": "by-http"}, headers=HEADERS,
                           content=path.read_bytes()).json()  # fmt: skip
        listed = {v["id"]: v for v in remote.vectors()}
        named = post(
            url,
            "/v1/completions",
            {**body, "steering": [{"vector": "happy", "alpha": 0.5, "sha256": sha}]},
        )
        wrong_site = post(url, "/v1/completions", {**body, "steering": [
            {"vector": "happy", "site": "blocks.1.hook_resid_post"}]})  # fmt: skip
        as_monitor = post(url, "/v1/completions", {**body, "monitor": [
            {"name": "m", "site": SITE, "vector": "happy"}]})  # fmt: skip
        greedy_named = post(url, "/v1/completions", {
            "prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0, "model": "steerlab-tiny",
            "steering": [{"vector": "happy", "alpha": 0.5}]}).json()  # fmt: skip
        by_client = remote.generate(PROMPTS[0], steer=reft * 0.5, max_new_tokens=6,
                                    stop_at_eos=False)  # fmt: skip
    assert sha == reft.sha256 == again["sha256"] and listed["happy"]["op"] == "loreft"
    assert listed["happy"]["sites"] == [SITE] and listed["happy"]["positions"] == SPAN
    values = named.json()["choices"][0]["logprobs"]["token_logprobs"]
    for t in range(1, len(ids)):
        assert values[t] == pytest.approx(float(want[t - 1, ids[t]]), abs=1e-4)
    assert wrong_site.status_code == 400 and "trained at" in wrong_site.text
    assert as_monitor.status_code == 400 and "is a LoReFT" in as_monitor.text
    assert greedy_named["choices"][0]["text"] == by_client.text[0]
    assert toy_lm.hook_count() == 0


def test_a_loreft_moves_to_other_positions_by_a_name_of_its_own():
    # SteeringVector.at(site) picks a site; a LoReFT's positions change with at_positions,
    # and `at` (a site on a vector) is not a LoReFT method to misread.
    R = torch.linalg.qr(torch.randn(8, 2))[0].T.contiguous()
    reft = sl.LoReFT("blocks.1.hook_resid_post", R, torch.zeros(2, 8), torch.zeros(2),
                     positions="last:1")  # fmt: skip
    moved = reft.at_positions("first:2+last:2")
    assert moved.positions == "first:2+last:2" and reft.positions == "last:1"
    assert moved.site == reft.site and torch.equal(moved.R, reft.R)
    assert not hasattr(reft, "at")
