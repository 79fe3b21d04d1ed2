"""Angular steering (``sl.Rotate``), checked against the formula written as a plain hook
(``reference._rotated``), on the engines, through the server, and its bad inputs."""

from __future__ import annotations

import pytest
import torch
from engine_parity import CASES, NEW, PROMPTS, direction, prompt_ids
from reference import RefSteer, _rotated, greedy
from server_helpers import post, served

import steerlab as sl
from steerlab.core.ops import SteerError, op_from_data, op_to_data

SITE = "blocks.2.hook_resid_pre"


@pytest.mark.parametrize("angle", [0.0, 45.0, 90.0, 150.0, 180.0, -120.0, 359.0])
@pytest.mark.parametrize("alpha", [1.0, 0.5, -0.25])
@pytest.mark.parametrize("adaptive", [False, True])
def test_rotation_equals_the_formula_and_keeps_norms(angle, alpha, adaptive):
    acts = torch.randn(64, 128, generator=torch.Generator().manual_seed(1)) * 3.0
    v, toward = direction(0), direction(1)
    op = sl.Rotate(angle, toward, adaptive=adaptive)
    got = op(acts, v, torch.full((64, 1), alpha))
    ref = RefSteer(SITE, v, alpha, op="rotate", toward=toward, angle=angle, adaptive=adaptive)
    want = _rotated(acts[None], ref)[0]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(got.norm(dim=-1), acts.norm(dim=-1), atol=0, rtol=1e-5)
    if adaptive:  # tokens whose projection on the direction is not positive stay exactly
        behind = acts @ v <= 0
        assert behind.any() and torch.equal(got[behind], acts[behind])


def test_alpha_one_sets_the_target_angle_exactly():
    acts = torch.randn(16, 128, generator=torch.Generator().manual_seed(2))
    v, toward = direction(3), direction(4)
    got = sl.Rotate(60.0, toward)(acts, v, torch.ones(16, 1))
    b1 = v / v.norm()
    b2 = toward - (toward @ b1) * b1
    b2 = b2 / b2.norm()
    angle = torch.rad2deg(torch.atan2(got @ b2, got @ b1))
    torch.testing.assert_close(angle, torch.full((16,), 60.0), atol=1e-3, rtol=0)
    rest = acts - torch.outer(acts @ b1, b1) - torch.outer(acts @ b2, b2)  # off the plane
    rest_after = got - torch.outer(got @ b1, b1) - torch.outer(got @ b2, b2)
    torch.testing.assert_close(rest_after, rest, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["hf", "bridge", "hooked"])
def test_rotation_changes_text_and_alpha_zero_is_bit_identical(backend):
    lm = sl.load("steerlab-tiny", backend=backend)
    steer = sl.Steer(SITE, direction(9), alpha=[0.0, 1.0], op=sl.Rotate(150.0, direction(109)))
    out = lm.generate(PROMPTS, steer=steer, max_new_tokens=NEW)
    plain = lm.generate(PROMPTS, max_new_tokens=NEW)
    assert out.tokens[0::2] == plain.tokens  # alpha 0
    assert out.tokens[1::2] != plain.tokens  # it does steer
    case = CASES["rotate-all"]
    hf = _hf()
    for i, p in enumerate(PROMPTS):
        assert out.tokens[2 * i + 1] == greedy(
            hf, list(prompt_ids(lm, p)), [case.ref()], NEW, set()
        )
    assert lm.hook_count() == 0


def _hf():
    from transformers import AutoModelForCausalLM

    from steerlab.toy import asset_path

    return AutoModelForCausalLM.from_pretrained(asset_path("steerlab-tiny"), dtype=torch.float32)


def test_rotation_travels_as_data_and_through_the_server(toy_lm):
    op = sl.Rotate(60.0, direction(1), adaptive=True)
    assert op_from_data(op_to_data(op)) == op
    steer = sl.Steer(SITE, direction(0), 1.0, "generated", op)
    local = toy_lm.generate("Once upon a time", steer=steer, max_new_tokens=10).text[0]
    with served(toy_lm) as url:
        body = {"model": "steerlab-tiny", "prompt": "Once upon a time", "max_tokens": 10,
                "temperature": 0, "steering": [steer.to_data()]}  # fmt: skip
        reply = post(url, "/v1/completions", body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"] == local
        bad = {**steer.to_data(), "op": {"name": "rotate", "angle": 60.0,
                                         "toward": direction(0).tolist()}}  # fmt: skip
        reply = post(url, "/v1/completions", {**body, "steering": [bad]})
        assert reply.status_code == 400 and "parallel" in reply.json()["error"]["message"]
        assert reply.json()["error"]["param"].startswith("steering[0]")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: sl.Steer(SITE, direction(0), op=sl.Rotate(30.0, direction(0) * 3)), "parallel"),
        (lambda: sl.Steer(SITE, direction(0), op=sl.Rotate(30.0, -direction(0))), "parallel"),
        (lambda: sl.Rotate(30.0, torch.zeros(128)), "non-zero"),
        (lambda: sl.Steer(SITE, direction(0), op=sl.Rotate(30.0, torch.ones(64))), "64 values"),
        (lambda: sl.Rotate(float("nan"), direction(1)), "angle must be a finite number"),
        (lambda: sl.Rotate("90", direction(1)), "angle must be a finite number"),
        (lambda: sl.Rotate(90.0, direction(1), adaptive=1), "adaptive must be True or False"),
        (lambda: sl.Rotate(90.0, [float("inf")] * 128), "NaN or inf"),
    ],
)
def test_bad_rotations_are_refused_when_made(make, message):
    with pytest.raises(SteerError, match=message):
        make()


def test_rotation_on_float16_with_huge_and_tiny_directions(tiny_dirs):
    lm = sl.load(tiny_dirs["gpt2"], backend="hf", dtype=torch.float16)
    site = "blocks.1.hook_resid_pre"
    base, toward = torch.randn(lm.d_model), torch.randn(lm.d_model)
    runs = [
        lm.run_with_cache("Hello there", sites=[site],
                          steer=sl.Steer(site, base * scale, op=sl.Rotate(90.0, toward)))[site]
        for scale in (1.0, 1e20, 1e-20)
    ]  # fmt: skip
    for acts in runs:
        assert torch.isfinite(acts).all()
    torch.testing.assert_close(runs[1], runs[0])
    torch.testing.assert_close(runs[2], runs[0])
