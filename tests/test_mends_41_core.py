"""Issue 41, the core's items: conditions, positions, rotations and the wide LM head. Each
test failed on the code before its mend."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import pytest
import torch

import steerlab as sl
import steerlab.evals as ev
import steerlab.train as tr
from steerlab.core.reads import Condition, gate_from_data, score

SITE = "blocks.1.hook_resid_post"
SEA = ["The sea was calm", "Waves rolled onto the sand", "The boat sailed out"]
FOREST = ["The forest was dark", "Tall pines stood still", "Moss grew on the oaks"]


def _vector(seed: int, d: int = 128) -> torch.Tensor:
    return torch.randn(d, generator=torch.Generator().manual_seed(seed))


# --- 1. find_condition refuses directions that are float noise -------------------------


def test_find_condition_refuses_two_identical_sets_read_in_another_order(toy_lm):
    prompts = ["The sea was calm", "The day was bright and warm today", "A cat sat"]
    acts = toy_lm.run_with_cache(prompts, sites=[SITE])
    real = acts.attention_mask.float()[..., None]
    means = (acts[SITE] * real).sum(1) / real.sum(1)
    # the same set summed in another order differs only in its last bits
    noise = means.mean(0) - means.flip(0).mean(0)
    assert float(noise.norm()) < 1e-5 * float(means.norm(dim=-1).mean())
    with pytest.raises(sl.SteerError, match="within the rounding of a float32 forward"):
        sl.find_condition(toy_lm, prompts, prompts[::-1], sites=[SITE], progress=False)


def test_find_condition_still_finds_sets_that_differ(toy_lm):
    found = sl.find_condition(toy_lm, SEA, FOREST, sites=[SITE], progress=False)
    assert found.f1 > 2 / 3


# --- 5. find_condition checks batch_size and the direction's width before compute -------


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, True, "2"])
def test_find_condition_refuses_a_bad_batch_size_before_compute(toy_lm, batch_size, monkeypatch):
    monkeypatch.setattr(toy_lm, "run_with_cache", _no_forward)
    with pytest.raises(sl.SteerError, match="batch_size must be an int >= 1"):
        sl.find_condition(toy_lm, SEA, FOREST, sites=[SITE], batch_size=batch_size)


def test_find_condition_refuses_a_direction_of_the_wrong_width_before_compute(toy_lm, monkeypatch):
    monkeypatch.setattr(toy_lm, "run_with_cache", _no_forward)
    with pytest.raises(sl.SteerError, match="has 7 values; this model has d_model=128"):
        sl.find_condition(toy_lm, SEA, FOREST, sites=[SITE], direction=torch.ones(7))
    with pytest.raises(sl.SiteError):
        sl.find_condition(toy_lm, SEA, FOREST, sites=["blocks.9.hook_resid_post"])


def _no_forward(*args, **kwargs):
    raise AssertionError("a forward ran before the arguments were checked")


# --- 3. Rotate reduces its angle exactly ------------------------------------------------


def _turned(h: torch.Tensor, u: torch.Tensor, toward: torch.Tensor, degrees: float):
    """Plain float64 torch: ``h``'s component in the plane of ``u`` and ``toward`` turned
    to ``degrees`` from ``u``, its length kept."""
    h, u, toward = h.double(), u.double(), toward.double()
    b1 = u / u.norm()
    b2 = toward - (toward @ b1) * b1
    b2 = b2 / b2.norm()
    x, y = h @ b1, h @ b2
    radius, theta = torch.hypot(x, y), math.radians(degrees)
    return h + (radius * math.cos(theta) - x)[:, None] * b1 + (
        radius * math.sin(theta) - y)[:, None] * b2  # fmt: skip


@pytest.mark.parametrize("angle", [1e10, -1e10, 1e300, 10**400, -(10**400) - 7, 3.5e15])
def test_rotate_turns_to_its_angle_reduced_exactly(angle):
    reduced = float(Fraction(angle) % 360)  # exact, by rational arithmetic
    h, u, toward = _vector(1, 16)[None].repeat(3, 1) * torch.tensor([[1.0], [-2.0], [3.0]]), \
        _vector(2, 16), _vector(3, 16)  # fmt: skip
    op = sl.Rotate(angle, toward=toward)
    got = op(h, u / u.norm(), torch.ones(3, 1))
    torch.testing.assert_close(got.double(), _turned(h, u, toward, reduced), atol=1e-5, rtol=0)


def test_a_huge_rotation_angle_steers_the_model_as_its_reduced_angle(toy_lm):
    toward, v = _vector(4), _vector(5)
    site = "blocks.1.hook_resid_pre"
    outs = [toy_lm.generate(["The sea was", "Once upon"], max_new_tokens=3, stop_at_eos=False,
                            steer=sl.Steer(site, v, op=sl.Rotate(a, toward=toward)),
                            capture=site) for a in (1e300, math.fmod(1e300, 360))]  # fmt: skip
    assert outs[0].tokens == outs[1].tokens
    assert torch.equal(outs[0].activations[site], outs[1].activations[site])


@pytest.mark.parametrize("angle", [float("nan"), float("inf"), "90", True, None])
def test_rotate_refuses_an_angle_that_is_not_a_finite_number(angle):
    with pytest.raises(sl.SteerError, match="Rotate angle must be a finite number"):
        sl.Rotate(angle, toward=torch.ones(4))


# --- 4. deep any_of / all_of ------------------------------------------------------------


@pytest.mark.parametrize("make", [sl.any_of, sl.all_of])
def test_a_gate_nested_thousands_deep_is_steerlabs_error(make):
    gate = sl.Condition(SITE, torch.ones(128))
    with pytest.raises(sl.SteerError, match="nests any_of / all_of 33 deep; the most is 32"):
        for _ in range(3000):
            gate = make(gate)


def test_a_deep_gate_from_the_wire_is_steerlabs_error():
    data: dict = {"site": SITE, "vector": [1.0] * 128}
    for _ in range(3000):
        data = {"any_of": [data]}
    with pytest.raises(sl.SteerError, match="nests any_of / all_of") as error:
        gate_from_data(data)
    assert error.value.field == "when"


def test_a_gate_32_deep_still_steers_as_its_condition(toy_lm):
    c = sl.Condition(SITE, _vector(6), threshold=0.0, score="projection")
    gate = c
    for k in range(32):
        gate = sl.any_of(gate) if k % 2 else sl.all_of(gate)
    assert gate_from_data(gate.to_data()) == gate
    steers = [sl.Steer("blocks.2.hook_resid_pre", _vector(7), 4.0, when=w) for w in (c, gate)]
    a, b = (toy_lm.generate(SEA + FOREST, steer=s, max_new_tokens=2) for s in steers)
    assert a.text == b.text and torch.equal(a.fired, b.fired)


# --- 6. every integer of the positions grammar is bounded while parsing -----------------


@pytest.mark.parametrize("positions", ["first:" + "9" * 30, "last:" + "9" * 30,
                                       "first:2+last:" + "9" * 12, 10**30, 2**31])  # fmt: skip
def test_a_position_count_past_any_context_is_refused_while_parsing(positions):
    with pytest.raises(sl.SteerError, match=r"counts past 2147483647 \(2\*\*31 - 1\)"):
        sl.Steer("blocks.1.hook_resid_pre", torch.ones(128), positions=positions)
    from steerlab.core.steer import steer_data, steer_from_data

    data = steer_data("blocks.1.hook_resid_pre", torch.ones(128), 1.0, "all", sl.Add())
    with pytest.raises(sl.SteerError, match="counts past"):
        steer_from_data({**data, "positions": positions})


def test_the_largest_position_count_runs(toy_lm):
    site = "blocks.1.hook_resid_pre"
    plain = toy_lm.generate(SEA, max_new_tokens=2, capture=site)
    for positions in (2**31 - 1, "first:2147483647"):
        steer = sl.Steer(site, _vector(8), 0.0 if positions == 2**31 - 1 else 1.0,
                         positions=positions)  # fmt: skip
        out = toy_lm.generate(SEA, steer=steer, max_new_tokens=2, capture=site)
        if positions == 2**31 - 1:
            assert torch.equal(out.activations[site], plain.activations[site])
        else:  # every prompt token is within the first 2**31 - 1
            assert out.text != plain.text or not torch.equal(out.activations[site],
                                                             plain.activations[site])  # fmt: skip


# --- 7. a condition at a site the model lacks is named as such --------------------------


def test_a_condition_at_a_missing_site_says_the_site_is_missing(toy_lm):
    when = sl.Condition("blocks.9.hook_resid_post", torch.ones(128))
    steer = sl.Steer("blocks.1.hook_resid_pre", torch.ones(128), when=when)
    with pytest.raises(sl.SiteError, match="blocks.9.hook_resid_post") as error:
        toy_lm.generate("Hi", steer=steer, max_new_tokens=1)
    assert "comes after" not in str(error.value)
    assert toy_lm.hook_count() == 0


def test_a_condition_after_the_steer_is_still_refused_before_compute(toy_lm):
    when = sl.Condition("blocks.3.hook_resid_post", torch.ones(128))
    with pytest.raises(sl.SteerError, match="comes after the steer"):
        steer = sl.Steer("blocks.1.hook_resid_pre", torch.ones(128), when=when)
        toy_lm.generate("Hi", steer=steer, max_new_tokens=1)
    assert toy_lm.hook_count() == 0
    late = sl.Steer("blocks.1.hook_resid_pre", torch.ones(128), positions="generated", when=when)
    assert len(toy_lm.generate("Hi", steer=late, max_new_tokens=1).fired) == 1


def test_the_server_says_a_condition_site_is_missing(toy_lm):
    from server_helpers import post, served

    when = sl.Condition("blocks.9.hook_resid_post", torch.ones(128))
    steer = sl.Steer("blocks.1.hook_resid_pre", torch.ones(128), when=when)
    body = {"model": "steerlab-tiny", "prompt": "Hi", "max_tokens": 1,
            "steering": [steer.to_data()]}  # fmt: skip
    with served(toy_lm) as url:
        reply = post(url, "/v1/completions", body)
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert "blocks.9.hook_resid_post" in message and "comes after" not in message


# --- 8 and 9. what a per-token gate reports; what the cosine score measures -------------


def test_a_per_token_gate_reports_no_row_decision_and_the_docs_say_so(toy_lm):
    when = sl.Condition("blocks.0.hook_resid_post", _vector(9), read="token")
    out = toy_lm.generate(SEA, steer=sl.Steer("blocks.1.hook_resid_pre", _vector(10),
                                              when=when), max_new_tokens=1)  # fmt: skip
    assert out.fired is None and out.condition_scores is None
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert 'A `read="token"` gate decides per position, not per' in readme
    assert "per-token); monitor the same direction" in " ".join(Condition.__doc__.split())
    assert 'A ``read="token"`` gate decides per position' in sl.Generation.__doc__


def test_the_cosine_score_is_blind_to_sign_and_the_docstring_says_when_to_project():
    h, c = torch.randn(6, 32, generator=torch.Generator().manual_seed(3)), _vector(11, 32)

    # CAST's cos(h, tanh(P h)), P = c c^T / c^T c, written out with torch alone
    def cast(x):
        return torch.nn.functional.cosine_similarity(
            x, torch.tanh((x @ c)[:, None] * c / (c @ c)), dim=-1)  # fmt: skip

    torch.testing.assert_close(score(h, c, "cosine"), cast(h))
    torch.testing.assert_close(score(-h, c, "cosine"), score(h, c, "cosine"))  # sign-blind
    torch.testing.assert_close(score(-h, c, "projection"), -score(h, c, "projection"))
    doc = " ".join(Condition.__doc__.split())
    assert "does not tell ``c`` from ``-c``" in doc and '"projection"`` is signed' in doc


# --- 10. the wide head calls a head that accelerate hooked ------------------------------


def test_the_wide_head_keeps_an_accelerate_hook_on_lm_head():
    from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module
    from transformers import GPT2Config, GPT2LMHeadModel

    from steerlab.backends.head import plain_head, wide
    from steerlab.engine.scoring import score_prompts
    from steerlab.testing import char_tokenizer

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=9000, n_positions=128,
                        bos_token_id=0, eos_token_id=1, pad_token_id=2)  # fmt: skip
    model = GPT2LMHeadModel(config).eval()

    class Shift(ModelHook):
        def post_forward(self, module, output):
            return output + torch.linspace(0, 3, output.shape[-1])

    lm = sl.wrap(model, char_tokenizer())
    ids = lm.tokenizer.encode("Once upon a time")
    add_hook_to_module(model.lm_head, Shift())
    try:
        assert plain_head(model) is None and not wide(model.lm_head, len(ids))
        with torch.inference_mode():
            own = model(torch.tensor([ids])).logits[0].log_softmax(-1)
        expected = own[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        got = torch.tensor([s.logprob for s in score_prompts(lm.engine, [ids])[0][1:]])
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    finally:
        remove_hook_from_module(model.lm_head)
    assert plain_head(model) is model.lm_head


@pytest.mark.parametrize("attach", ["forward", "_hf_hook", "backward", "global"])
def test_anything_attached_to_the_head_keeps_the_module_call(attach):
    from steerlab.backends.head import untouched, wide

    head = torch.nn.Linear(16, 9000)
    assert untouched(head) and wide(head, 8)
    undo = _attach(head, attach)
    try:
        assert not untouched(head) and not wide(head, 8)
    finally:
        undo()
    assert untouched(head) and wide(head, 8)


def _attach(head: torch.nn.Linear, how: str):
    if how == "forward":
        head.forward = lambda x: torch.nn.Linear.forward(head, x) + 1  # type: ignore[method-assign]
        return lambda: delattr(head, "forward")
    if how == "_hf_hook":
        head._hf_hook = object()
        return lambda: delattr(head, "_hf_hook")
    if how == "backward":
        return head.register_full_backward_hook(lambda *args: None).remove
    return torch.nn.modules.module.register_module_forward_pre_hook(lambda *args: None).remove


# --- 2. a bare string where a list belongs is refused, for every list argument ----------

PAIR = sl.Preference("The day was", " happy.", " sad.")
AT = "blocks.1.hook_resid_pre"
CONCEPT = dict(positives=["a"], negatives=["b"])
JUDGE = ev.Criterion(None, "happy")
RECORDS = [{"alpha": 0.0, "layer": 1, "site": AT, "score": 0.0, "perplexity": 2.0}]

# (the argument, a call with a bare string there) for each list argument of the public API
# where one string is not a documented form: the string was split into characters (or read
# as a number) before. ``lm`` is the toy model, ``v`` a vector extracted at ``AT``.
LIST_ARGUMENTS = [
    ("matching", lambda lm, v: sl.find_condition(lm, "sea", ["forest"], progress=False)),
    ("other", lambda lm, v: sl.find_condition(lm, ["sea"], "forest", progress=False)),
    ("sites", lambda lm, v: sl.find_condition(lm, ["sea"], ["forest"], AT, progress=False)),
    ("positive", lambda lm, v: sl.extract(lm, "happy", ["sad"], [AT], progress=False)),
    ("negative", lambda lm, v: sl.extract(lm, ["happy"], "sad", [AT], progress=False)),
    ("alphas", lambda lm, v: sl.sweep(lm, v, ["Hi"], "04", progress=False)),
    ("layers", lambda lm, v: sl.sweep(lm, v, ["Hi"], [0, 4], layers="1", progress=False)),
    ("sites", lambda lm, v: sl.sweep(lm, v, ["Hi"], [0, 4], sites=AT, progress=False)),
    ("pairs", lambda lm, v: tr.bipo(lm, "abc", site=AT, progress=False)),
    ("held_out", lambda lm, v: tr.bipo(lm, [PAIR], site=AT, held_out="abc", progress=False)),
    ("examples", lambda lm, v: tr.reft(lm, "abc", site=AT, progress=False)),
    ("factors", lambda lm, v: tr.reps(lm, [PAIR], site=AT, factors="12", progress=False)),
    ("instructions", lambda lm, v: tr.preference_pairs(lm, "Say hi", ["a"])),
    ("replies", lambda lm, v: tr.preference_pairs(lm, ["Say hi"], "a")),
    ("alphas", lambda lm, v: ev.steerability(lm, v.steers(), ["Hi"], "04", progress=False)),
    ("positives", lambda lm, v: ev.ConceptData("c", positives="ab", negatives=["b"])),
    ("instructions", lambda lm, v: ev.ConceptData("c", **CONCEPT, instructions="ab")),
    ("concepts", lambda lm, v: ev.benchmark(lm, "concept", site=AT, judge=JUDGE)),
    ("positive", lambda lm, v: ev.roc_auc("12", [0.5])),
    ("negative", lambda lm, v: ev.roc_auc([0.5], "12")),
    ("values", lambda lm, v: ev.mean_interval("12")),
    ("nlls", lambda lm, v: ev.perplexity_interval("12")),
    ("factors", lambda lm, v: ev.Method("m", lambda *a: None, factors="12")),
    ("needs", lambda lm, v: ev.Method("m", lambda *a: None, needs="pairs")),
    ("needs", lambda lm, v: ev.Prompting("Be happy.", needs="pairs")),
    ("factors", lambda lm, v: ev.Prompting("Be happy.", factors="12")),
    ("instructions", lambda lm, v: ev.Prompting("Be happy.").inputs("Be happy.", "Say hi")),
    ("metrics", lambda lm, v: ev.Criterion(None, "happy", metrics="judge")),
    ("texts", lambda lm, v: JUDGE.score(["Say hi"], "hello", progress=False)),
    ("features", lambda lm, v: lm.features("Hi", sl.load_sae("steerlab-tiny-sae")).columns("37")),
    ("rows", lambda lm, v: sl.plots.monitor(_monitored(lm), "m", rows="01")),
    ("baseline_tokens", lambda lm, v: sl.plots.token_comparison("ab", ["a", "b"], [0.0, 0.0])),
    ("metrics", lambda lm, v: sl.plots.sweep_heatmaps(RECORDS, metrics="score")),
    ("log_scale", lambda lm, v: sl.plots.sweep_heatmaps(RECORDS, log_scale="perplexity")),
]


def _monitored(lm):
    monitor = {"m": (AT, torch.ones(128))}
    return lm.generate(["Hi", "Yo"], max_new_tokens=1, monitor=monitor)


@pytest.fixture(scope="module")
def happy(toy_lm):
    return sl.extract(toy_lm, ["I am happy"], ["I am sad"], [AT], progress=False)


@pytest.mark.parametrize(("name", "call"), LIST_ARGUMENTS,
                         ids=[f"{i}-{name}" for i, (name, _) in enumerate(LIST_ARGUMENTS)])  # fmt: skip
def test_a_list_argument_refuses_a_bare_string_by_name(toy_lm, happy, name, call):
    with pytest.raises((ValueError, TypeError), match=rf"{name} must be a (non-empty )?list"):
        call(toy_lm, happy)
    assert toy_lm.hook_count() == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda lm: lm.generate("Hi", max_new_tokens=1, stop="x", capture="blocks.0.hook_resid_pre"),
        lambda lm: lm.run_with_cache("Hi", sites="blocks.0.hook_resid_pre"),
        lambda lm: sl.extract(lm, ["happy"], ["sad"], "blocks.0.hook_resid_pre", progress=False),
    ],
)
def test_a_single_string_stays_where_it_is_a_documented_form(toy_lm, call):
    assert call(toy_lm) is not None
