"""Conditional steering (``sl.Condition``, CAST) and monitors, against references written
without steerlab: IBM's CAST as plain torch hooks at batch 1 (``reference.cast_greedy``)
and TransformerLens's own ``run_with_cache`` for monitors."""

from __future__ import annotations

import math

import pytest
import torch
from engine_parity import direction
from reads_parity import (
    NEW,
    PROMPTS,
    cast,
    check_cast_rows,
    check_monitors_against_hf,
    condition,
    ids,
    median_threshold,
    steer_of,
)
from reference import cast_greedy

import steerlab as sl
from steerlab.core.ops import SteerError
from steerlab.engine import Steer


@pytest.fixture(scope="module")
def lm():
    return sl.load("steerlab-tiny", backend="hf")


@pytest.mark.parametrize("mode", ["mean", "last"])
@pytest.mark.parametrize("compare", ["above", "below"])
def test_batch_of_8_with_mixed_rows_equals_ibm_cast_row_by_row(lm, toy_hf, mode, compare):
    check_cast_rows(lm, toy_hf, mode, compare)


def test_rows_that_did_not_fire_are_bit_identical_to_unsteered(lm, toy_hf):
    ref = cast(median_threshold(lm, toy_hf))
    gated = lm.generate(PROMPTS, steer=steer_of(ref, condition(ref)), max_new_tokens=NEW,
                        capture="blocks.3.hook_resid_post", stop_at_eos=False)  # fmt: skip
    plain = lm.generate(PROMPTS, max_new_tokens=NEW, capture="blocks.3.hook_resid_post",
                        stop_at_eos=False)  # fmt: skip
    quiet = ~gated.fired
    assert quiet.any() and gated.fired.any()
    site = "blocks.3.hook_resid_post"
    assert torch.equal(gated.activations[site][quiet], plain.activations[site][quiet])
    assert not torch.equal(gated.activations[site][~quiet], plain.activations[site][~quiet])


def test_the_decision_survives_compaction_and_prefix_sharing(lm, toy_hf):
    """Rows of one prompt at several alphas share the prompt (prefix sharing) and finish at
    different times (compaction); each keeps its prompt's decision."""
    ref = cast(median_threshold(lm, toy_hf))
    steer = sl.Steer("blocks.2.hook_resid_pre", ref.vector, [0.0, 8.0], positions="generated",
                     when=condition(ref))  # fmt: skip
    out = lm.generate(PROMPTS, steer=steer, max_new_tokens=NEW, stop_at_eos=False)
    wanted = [cast_greedy(toy_hf, ids(lm, p), ref, NEW, set()) for p in PROMPTS]
    assert out.fired.tolist() == [w[1] for w in wanted for _ in range(2)]
    assert out.tokens[1::2] == [w[0] for w in wanted]
    lm.engine.share_prefix = False
    try:
        alone = lm.generate(PROMPTS, steer=steer, max_new_tokens=NEW, stop_at_eos=False)
    finally:
        lm.engine.share_prefix = True
    assert alone.tokens == out.tokens


def test_compiled_step_takes_the_decision_as_a_mask(toy_hf):
    fast = sl.load("steerlab-tiny", backend="hf").compile(backend="aot_eager")
    ref = cast(median_threshold(fast, toy_hf))
    steer = steer_of(ref, condition(ref))
    assert fast.explain(PROMPTS, steer).startswith("compiled")
    out = fast.generate(PROMPTS, steer=steer, max_new_tokens=NEW, stop_at_eos=False)
    wanted = [cast_greedy(toy_hf, ids(fast, p), ref, NEW, set()) for p in PROMPTS]
    assert out.tokens == [w[0] for w in wanted]
    assert out.fired.tolist() == [w[1] for w in wanted]
    site = "blocks.2.hook_resid_post"
    watched = fast.generate(PROMPTS, steer=steer, max_new_tokens=NEW, stop_at_eos=False,
                            monitor={"m": (site, direction(70))})  # fmt: skip
    assert fast.explain(PROMPTS, steer, monitor={"m": (site, direction(70))}).startswith("compiled")
    eager = sl.load("steerlab-tiny", backend="hf")
    want = eager.generate(PROMPTS, steer=steer, max_new_tokens=NEW, stop_at_eos=False,
                          monitor={"m": (site, direction(70))})  # fmt: skip
    assert watched.tokens == out.tokens == want.tokens  # monitors never change a token
    for part in ("prompt", "generated"):
        torch.testing.assert_close(getattr(watched.monitors["m"], part),
                                   getattr(want.monitors["m"], part), atol=1e-4, rtol=1e-4,
                                   equal_nan=True)  # fmt: skip
    token = sl.Condition("blocks.1.hook_resid_pre", ref.condition, read="token")
    why = fast.explain(PROMPTS, steer_of(ref, token))
    assert why.startswith("eager:") and "read='token'" in why


def test_any_of_and_all_of_combine_decisions(lm, toy_hf):
    t = median_threshold(lm, toy_hf)
    above, below = cast(t, "above"), cast(t, "below")
    a, b = condition(above), condition(below)
    either = lm.generate(PROMPTS, steer=steer_of(above, sl.any_of(a, b)), max_new_tokens=2)
    both = lm.generate(PROMPTS, steer=steer_of(above, sl.all_of(a, b)), max_new_tokens=2)
    one = lm.generate(PROMPTS, steer=steer_of(above, a), max_new_tokens=2)
    assert either.fired.all() and not both.fired.any()  # above or below: always; both: never
    nested = sl.any_of(sl.all_of(a, a), b)
    out = lm.generate(PROMPTS, steer=steer_of(above, nested), max_new_tokens=2)
    assert out.fired.all()
    assert torch.equal(one.condition_scores, either.condition_scores)


def test_per_token_gate_steers_only_positions_that_read_above(lm):
    """read='token' against the formula: at each real position, ``alpha·v`` is added
    exactly where the projection at the condition site (same forward) is above."""
    c, v = direction(30), direction(31)
    site_c, site_s = "blocks.1.hook_resid_post", "blocks.2.hook_resid_pre"
    acts = lm.run_with_cache(PROMPTS[:3], sites=[site_c, site_s])
    real = acts.attention_mask.bool()
    reads = acts[site_c] @ (c / c.norm())  # [rows, pos]
    # halfway between the two middle reads: the median itself is one position's read, which
    # the gated forward computes again and may round the other way (one ulp flips it)
    middle = reads[real].sort().values[len(reads[real]) // 2 - 1 :][:2]
    assert float(middle[1] - middle[0]) > 1e-4
    threshold = float(middle.mean())
    cond = sl.Condition(site_c, c, threshold=threshold, read="token", score="projection")
    got = lm.run_with_cache(PROMPTS[:3], sites=[site_s], steer=sl.Steer(site_s, v, 4.0,
                                                                         when=cond))[site_s]  # fmt: skip
    fires = reads > threshold
    assert 0.3 < float(fires[real].float().mean()) < 0.7
    want = acts[site_s] + 4.0 * v * fires[..., None]
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


def test_a_per_token_condition_after_the_steer_is_refused_naming_both_sites(lm):
    """Refused with the model's sites known (one it lacks is named as missing instead), before
    any compute."""
    c = sl.Condition("blocks.2.hook_resid_post", direction(1), read="token")
    steer = sl.Steer("blocks.1.hook_resid_pre", direction(2), 1.0, positions="generated", when=c)
    with pytest.raises(SteerError, match=r"blocks\.2\.hook_resid_post.*blocks\.1\.hook_resid_pre"):
        lm.generate("Hi", steer=steer, max_new_tokens=1)
    assert lm.hook_count() == 0


def test_a_prompt_condition_after_a_prompt_steer_is_refused_but_generated_works(lm):
    c = sl.Condition("blocks.2.hook_resid_post", direction(1))
    steer = sl.Steer("blocks.1.hook_resid_pre", direction(2), 1.0, positions="all", when=c)
    with pytest.raises(SteerError, match="positions='generated'"):
        lm.generate("Hi", steer=steer, max_new_tokens=1)
    late = sl.Steer("blocks.1.hook_resid_pre", direction(2), 1.0, positions="generated", when=c)
    assert lm.generate("Hi", steer=late, max_new_tokens=1).fired is not None


def test_monitors_equal_transformer_lens_run_with_cache_of_the_steered_text():
    hooked = sl.load("steerlab-tiny", backend="hooked")
    v, m = direction(40), direction(41)
    steer = sl.Steer("blocks.1.hook_resid_pre", v, 6.0, positions="generated")
    site = "blocks.2.hook_resid_post"
    prompts = PROMPTS[:3]
    out = hooked.generate(prompts, steer=steer, max_new_tokens=NEW, stop_at_eos=False,
                          monitor={"m": (site, m)})  # fmt: skip
    model = hooked.backend.model  # TransformerLens's own HookedTransformer
    u = m / m.norm()
    for r, p in enumerate(prompts):
        prompt = ids(hooked, p)
        text = torch.tensor([prompt + out.tokens[r]])
        n = len(prompt)

        def add(act, hook, n=n):
            act = act.clone()
            act[:, n:] += 6.0 * v
            return act

        with model.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", add)]):
            _, cache = model.run_with_cache(text)
        want = cache[site][0] @ u  # [seq]
        trace = out.monitors["m"]
        prompt_row = trace.prompt[r][~trace.prompt[r].isnan()]
        torch.testing.assert_close(prompt_row, want[:n], atol=1e-4, rtol=1e-4)
        # new token t was chosen at position n - 1 + t
        torch.testing.assert_close(trace.generated[r], want[n - 1 : n - 1 + NEW],
                                   atol=1e-4, rtol=1e-4)  # fmt: skip


def test_monitors_equal_plain_transformers_hidden_states_of_the_steered_text(lm, toy_hf):
    check_monitors_against_hf(lm, toy_hf)


def test_monitors_never_change_a_token_and_pad_with_nan(lm):
    v = direction(50)
    site = "blocks.2.hook_resid_pre"
    steer = sl.Steer(site, v, 4.0)
    plain = lm.generate(PROMPTS[:4], steer=steer, max_new_tokens=NEW)
    watched = lm.generate(PROMPTS[:4], steer=steer, max_new_tokens=NEW,
                          monitor={"a": (site, v), "b": ("blocks.0.hook_resid_post", -v)})  # fmt: skip
    assert watched.tokens == plain.tokens
    trace = watched.monitors["a"]
    assert trace.generated.shape == (4, max(len(t) for t in plain.tokens))
    for r, tokens in enumerate(plain.tokens):
        assert not trace.generated[r, : len(tokens)].isnan().any()
        assert trace.generated[r, len(tokens) :].isnan().all()
        n = len(ids(lm, PROMPTS[r]))
        assert (~trace.prompt[r].isnan()).sum() == n
    # the monitor reads after the steer at its site: its value moved by alpha·|v|
    unsteered = lm.generate(PROMPTS[:1], max_new_tokens=1, monitor={"a": (site, v)})
    shift = watched.monitors["a"].prompt[0, -1] - unsteered.monitors["a"].prompt[0, -1]
    assert math.isclose(float(shift), 4.0 * float(v.norm()), rel_tol=1e-4)
    assert lm.hook_count() == 0


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: sl.Condition("blocks.1.hook_resid_pre", torch.zeros(128)), "zero norm"),
        (lambda: sl.Condition("blocks.1.hook_resid_pre", torch.full((128,), math.nan)), "NaN"),
        (lambda: sl.Condition("blocks.1.hook_resid_pre", direction(1), threshold=math.inf),
         "finite"),
        (lambda: sl.Condition("blocks.1.hook_resid_pre", direction(1), threshold="0.2"),
         "finite"),
        (lambda: sl.Condition("blocks.1.hook_resid_pre", direction(1), compare="larger"),
         "compare"),
        (lambda: sl.Condition("blocks.1.hook_resid_pre", direction(1), read="max"), "read"),
        (lambda: sl.Condition("blocks.1.hook_resid_pre", direction(1), score="dot"), "score"),
        (lambda: sl.any_of(), "at least one"),
        (lambda: sl.all_of(), "at least one"),
        (lambda: sl.any_of("x"), "sl.Condition"),
    ],
)  # fmt: skip
def test_bad_conditions_are_refused_when_made(make, match):
    with pytest.raises(SteerError, match=match):
        make()


def test_bad_input_is_refused_before_any_compute_and_leaves_the_model_untouched(lm):
    wide = sl.Condition("blocks.1.hook_resid_pre", torch.ones(64))
    nowhere = sl.Condition("blocks.9.hook_resid_pre", direction(1))
    steer = lambda when: sl.Steer("blocks.2.hook_resid_pre", direction(2), 1.0,  # noqa: E731
                                  positions="generated", when=when)  # fmt: skip
    calls = []
    handle = lm.backend.modules()[0].register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(SteerError, match="d_model=128"):
            lm.generate("Hi", steer=steer(wide), max_new_tokens=2)
        with pytest.raises(sl.SiteError):
            lm.generate("Hi", steer=steer(nowhere), max_new_tokens=2)
        with pytest.raises(SteerError, match="named 'a'"):
            lm.generate("Hi", max_new_tokens=2, monitor=[sl.Monitor("a", "blocks.0.hook_resid_pre",
                        direction(1)), sl.Monitor("a", "blocks.1.hook_resid_pre", direction(1))])  # fmt: skip
        with pytest.raises(sl.SiteError):
            lm.generate("Hi", max_new_tokens=2, monitor={"a": ("blocks.9.hook_resid_pre",
                                                               direction(1))})  # fmt: skip
        with pytest.raises(SteerError, match="d_model=128"):
            lm.generate("Hi", max_new_tokens=2, monitor={"a": ("blocks.0.hook_resid_pre",
                                                               torch.ones(3))})  # fmt: skip
    finally:
        handle.remove()
    assert calls == [] and lm.hook_count() == 0


def test_conditions_travel_as_data_and_compare_by_content():
    from steerlab.core.reads import gate_from_data
    from steerlab.core.steer import steer_from_data

    c = sl.Condition("blocks.1.hook_resid_pre", direction(1), threshold=0.1, compare="below")
    gate = sl.any_of(c, sl.all_of(c, sl.Condition("blocks.0.hook_resid_post", direction(2))))
    assert gate_from_data(gate.to_data()) == gate
    s = sl.Steer("blocks.2.hook_resid_pre", direction(3), 2.0, positions="generated", when=gate)
    assert steer_from_data(s.to_data()).when == gate
    twin = sl.Condition("blocks.1.hook_resid_pre", direction(1).clone(), threshold=0.1,
                        compare="below")  # fmt: skip
    assert twin == c and hash(twin) == hash(c)
    other = sl.Steer("blocks.2.hook_resid_pre", direction(3), 2.0, positions="generated")
    assert s.fingerprint() != other.fingerprint()
    with pytest.raises(SteerError) as error:
        gate_from_data({"any_of": []})
    assert error.value.field == "when"
    with pytest.raises(SteerError) as error:
        gate_from_data({"site": "blocks.0.hook_resid_pre", "vector": [1.0], "compare": "x"})
    assert error.value.field == "when.compare"


SEA = [
    "One day, Mia the happy fox went to the sea.",
    "Long ago, a sad bear called Tom lived near the harbor.",
    "One day, Ben the glad cat went to the beach.",
    "Long ago, a lonely fox called Lily lived near the shore.",
    "One day, Tom the sad bear went to the harbor.",
]
FOREST = [
    "One day, Mia the happy fox went to the forest.",
    "Long ago, a sad bear called Tom lived near the woods.",
    "One day, Ben the glad cat went to the grove.",
    "Long ago, a lonely fox called Lily lived near the glade.",
    "One day, Tom the sad bear went to the woods.",
]


def test_find_condition_grid_equals_f1_by_hand_from_one_forward_per_prompt(lm):
    sites = [f"blocks.{i}.hook_resid_post" for i in range(4)]
    forwards = []
    handle = lm.backend.modules()[0].register_forward_pre_hook(
        lambda _m, args, kwargs: forwards.append(1), with_kwargs=True)  # fmt: skip
    try:
        found = sl.find_condition(lm, matching=SEA, other=FOREST, sites=sites, thresholds=50)
    finally:
        handle.remove()
    assert len(forwards) == 1  # every prompt and site in one batched forward
    # < 50 observed scores each: a threshold midway between each two neighbours
    assert len(found.table) == len(sites) * 2 * (len(SEA + FOREST) - 1)
    # the best cell, recomputed by hand from the model's own activations
    c = found.condition
    acts = lm.run_with_cache(SEA + FOREST, sites=[c.site])
    real = acts.attention_mask.float()[..., None]
    h = (acts[c.site] * real).sum(1) / real.sum(1)
    projected = torch.tanh((h @ c.direction)[:, None] / (c.direction @ c.direction) * c.direction)
    scores = torch.nn.functional.cosine_similarity(h, projected, dim=-1)
    fires = scores > c.threshold if c.compare == "above" else scores < c.threshold
    labels = torch.tensor([True] * len(SEA) + [False] * len(FOREST))
    tp = int((fires & labels).sum())
    precision, recall = tp / max(int(fires.sum()), 1), tp / len(SEA)
    f1 = 2 * precision * recall / (precision + recall) if tp else 0.0
    assert math.isclose(found.f1, f1, rel_tol=1e-6) and found.f1 == max(
        r["f1"] for r in found.table
    )
    assert found.f1 > 2 / 3  # better than firing on every prompt
    out = lm.generate(SEA + FOREST, steer=sl.Steer("blocks.3.hook_resid_pre", direction(1), 1.0,
                      positions="generated", when=c), max_new_tokens=1)  # fmt: skip
    assert out.fired.tolist() == fires.tolist()  # the engine decides as the search scored


@pytest.mark.parametrize(
    ("matching", "other", "match"),
    [([], FOREST, "both classes"), (SEA, [], "both classes"), ([], [], "both classes")],
)
def test_find_condition_refuses_an_empty_or_one_class_label_set(lm, matching, other, match):
    with pytest.raises(SteerError, match=match):
        sl.find_condition(lm, matching=matching, other=other, sites=["blocks.0.hook_resid_post"])


def test_conditions_and_monitors_through_the_server_and_connect(lm, toy_hf):
    from server_helpers import KEY, post, served, sse

    ref = cast(median_threshold(lm, toy_hf))
    steer = steer_of(ref, sl.any_of(condition(ref)))
    m = direction(60)
    local = lm.generate(PROMPTS[:4], steer=steer, max_new_tokens=6, stop_at_eos=False,
                        monitor={"m": ("blocks.2.hook_resid_post", m)})  # fmt: skip
    with served(lm) as url:
        body = {"model": "steerlab-tiny", "prompt": PROMPTS[:4], "max_tokens": 6,
                "temperature": 0, "ignore_eos": True, "steering": [steer.to_data()],
                "monitor": [{"name": "m", "site": "blocks.2.hook_resid_post",
                             "vector": m.tolist()}]}  # fmt: skip
        reply = post(url, "/v1/completions", body)
        assert reply.status_code == 200, reply.text
        choices = reply.json()["choices"]
        assert [c["text"] for c in choices] == local.text
        assert [c["steerlab"]["fired"] for c in choices] == local.fired.tolist()
        scores = [c["steerlab"]["condition_score"] for c in choices]
        torch.testing.assert_close(torch.tensor(scores), local.condition_scores)
        traces = torch.tensor([c["steerlab"]["monitors"]["m"]["generated"] for c in choices])
        torch.testing.assert_close(traces, local.monitors["m"].generated)
        streamed = sse(post(url, "/v1/completions", {**body, "stream": True}))
        last = [e["choices"][0] for e in streamed if e["choices"][0]["finish_reason"]]
        assert sorted((c["index"], c["steerlab"]["fired"]) for c in last) == list(
            enumerate(local.fired.tolist()))  # fmt: skip
        remote = sl.connect(url, api_key=KEY)
        got = remote.generate(PROMPTS[:4], steer=steer, max_new_tokens=6, stop_at_eos=False,
                              monitor={"m": ("blocks.2.hook_resid_post", m)})  # fmt: skip
        assert got.text == local.text and torch.equal(got.fired, local.fired)
        torch.testing.assert_close(got.monitors["m"].prompt, local.monitors["m"].prompt,
                                   equal_nan=True)  # fmt: skip
        # a malformed condition is a 400 naming the field
        bad = steer.to_data()
        bad["when"] = {"any_of": [{**bad["when"]["any_of"][0], "compare": "larger"}]}
        reply = post(url, "/v1/completions", {**body, "steering": [bad]})
        assert reply.status_code == 400
        assert reply.json()["error"]["param"] == "steering[0].when.compare"
        reply = post(url, "/v1/completions", {**body, "monitor": body["monitor"] * 2})
        assert reply.status_code == 400 and "named 'm'" in reply.json()["error"]["message"]
        reply = post(url, "/v1/completions", {**body, "monitor": [{**body["monitor"][0],
                                                                    "site": "blocks.9.x"}]})  # fmt: skip
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "monitor[0].site"
    assert lm.hook_count() == 0


def _chat_steer(threshold: float, compare: str = "above", alpha: float = 6.0) -> sl.Steer:
    sea = sl.Condition("blocks.1.hook_resid_post", direction(80), threshold=threshold,
                       compare=compare, score="projection")  # fmt: skip
    return sl.Steer("blocks.2.hook_resid_pre", direction(81), alpha, positions="generated",
                    when=sea)  # fmt: skip


def test_a_chat_turn_decides_on_its_own_tokens_and_keeps_each_decision(lm):
    """Turn 1 does not fire, turn 2 does: turn 1's reply is the unsteered chat's, token for
    token; turn 2 then differs from the unsteered chat (same history); each turn's decision
    is in the cache key, the cache is reused, and a fork goes on as the original."""
    messages = ["Tell me about the forest.", "Tell me about the sea and the boats."]
    probe = lm.chat(system="You tell stories.", steer=_chat_steer(0.0, alpha=0.0))  # reads only
    scores = [float(probe.say(m, max_new_tokens=8).condition_scores[0]) for m in messages]
    assert scores[0] != scores[1]
    compare = "above" if scores[1] > scores[0] else "below"
    steer = _chat_steer((scores[0] + scores[1]) / 2, compare)
    chat, plain = lm.chat(system="You tell stories.", steer=steer), lm.chat("You tell stories.")
    first, base_first = (
        chat.say(messages[0], max_new_tokens=8),
        plain.say(messages[0], max_new_tokens=8),
    )
    assert first.fired.tolist() == [False] and first.tokens == base_first.tokens
    twin = chat.fork()
    second = chat.say(messages[1], max_new_tokens=8)
    base_second = plain.say(messages[1], max_new_tokens=8)
    assert second.fired.tolist() == [True] and second.tokens != base_second.tokens
    torch.testing.assert_close(second.condition_scores, torch.tensor([scores[1]]))
    assert chat.stats[-1].reused > 0  # the history came from the cache, not a recompute
    name = f"{Steer.of(steer, 6.0).fingerprint()}@6.0"
    marked = sum(name in m for m in chat.cache_key.touches)
    assert 0 < marked <= len(second.tokens[0]) + 1  # turn 2's reply (and its EOS); not turn 1's
    assert twin.say(messages[1], max_new_tokens=8).tokens == second.tokens  # the fork decides alike
    # feeding a fired turn again cannot replay its decision: refused, before any compute
    chat.clear_cache()
    with pytest.raises(SteerError, match="earlier turn whose condition fired"):
        chat.say("And then?", max_new_tokens=4)
    assert lm.hook_count() == 0


def test_a_chat_session_refuses_a_conditioned_steer_on_the_prompt(lm):
    c = sl.Condition("blocks.1.hook_resid_pre", direction(1))
    steer = sl.Steer("blocks.2.hook_resid_pre", direction(2), 2.0, positions="all", when=c)
    with pytest.raises(SteerError, match="positions='generated'"):
        lm.chat(steer=steer)
    chat = lm.chat()
    with pytest.raises(SteerError, match="lm.generate"):
        chat.steer = steer


def test_scoring_a_prompt_with_a_condition_or_monitor_reads_each_whole_prompt(lm):
    """Scored prompts share their starts (one forward per context), which a condition or a
    monitor cannot: such calls take the ordinary path, and agree with one row at a time."""
    from steerlab.engine import Request, Sampling

    c = sl.Condition("blocks.1.hook_resid_post", direction(90), score="projection")
    steer = sl.Steer("blocks.2.hook_resid_pre", direction(91), 4.0, when=c)
    shared = "Once upon a time, there was a little fox who"
    prompts = [shared + " ran.", shared + " sang by the sea.", shared + " slept."]
    rows = [Request(tuple(ids(lm, p)), tuple(sl.Steer.of(s, 4.0) for s in [steer]),
                    Sampling(max_new_tokens=0, prompt_logprobs=0), stream=str(i))
            for i, p in enumerate(prompts)]  # fmt: skip
    together = lm.engine.run(rows)
    alone = [lm.engine.run([r])[0] for r in rows]
    for a, b in zip(together, alone):
        assert a.fired == b.fired and a.condition_score == pytest.approx(b.condition_score)
        assert [s.logprob for s in a.prompt_scores[1:]] == pytest.approx(
            [s.logprob for s in b.prompt_scores[1:]], abs=1e-5)  # fmt: skip


@pytest.mark.parametrize("score", ["projection", "cosine"])
def test_a_conditions_scores_are_the_reads_rule_in_every_dtype_it_is_read_in(score):
    from steerlab.core.reads import score as read_score

    g = torch.Generator().manual_seed(3)
    cond = sl.Condition("blocks.1.hook_resid_pre", torch.randn(16, generator=g) * 1e3,
                        read="token", score=score)  # fmt: skip
    h = torch.randn(5, 16, generator=g)
    # one condition read again and again, in one dtype after another (the unit direction
    # it keeps is per dtype: float64 reads in float64, the rest in float32)
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.float64):
        got = cond.scores(h.to(dtype))
        assert got.dtype == torch.promote_types(dtype, torch.float32)
        assert torch.equal(got, read_score(h.to(dtype), cond.direction, score))
