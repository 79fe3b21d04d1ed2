"""The op base: what a new operation with tensors gets without writing it (issue 27, 31)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from engine_parity import toy_sae

import steerlab as sl
from steerlab.core.ops import (
    OPS,
    Form,
    Op,
    SteerError,
    op_from_data,
    op_tensors,
    op_to_data,
    operand,
    tensor_fingerprint,
    unit,
)
from steerlab.core.steer import steer_data, steer_from_data


@pytest.fixture
def shift() -> Iterator[type[Op]]:
    """A new operation with a tensor, written the way the README says: one class, nothing else."""

    @dataclass(frozen=True, eq=False)
    class Shift(Op):
        name: ClassVar[str] = "test_shift"
        offset: torch.Tensor
        gain: float = 1.0

        def form(self) -> Form | None:
            return None

        def __call__(self, act, direction, alpha):
            return act + alpha * self.gain * self.on(act.device)["offset"]

    yield Shift
    OPS.pop("test_shift")


def test_a_new_tensor_op_gets_conversion_equality_and_hashing(shift):
    a, b = shift([1.0, 2.0]), shift(torch.tensor([1.0, 2.0]))
    assert isinstance(a.offset, torch.Tensor) and a.offset.dtype == torch.float32
    assert a == b and hash(a) == hash(b)  # equal content, different tensor objects
    assert a != shift([1.0, 2.5]) and a != shift([1.0, 2.0], gain=2.0)
    assert len({a, b, shift([0.0, 0.0])}) == 2
    assert shift(torch.tensor([1.0, 2.0], dtype=torch.float64)).offset.dtype == torch.float64


def test_a_new_tensor_op_travels_as_data_with_its_dtype(shift):
    op = shift(torch.tensor([0.5, -1.0], dtype=torch.float16), gain=3.0)
    data = op_to_data(op)
    assert data == {"name": "test_shift", "offset": [0.5, -1.0], "gain": 3.0, "dtype": "float16"}
    back = op_from_data(data)
    assert back == op and back.offset.dtype == torch.float16
    keyed = op_to_data(op, tensor_fingerprint)
    assert keyed["offset"] == tensor_fingerprint(op.offset)
    assert op_from_data(keyed, op_tensors(op)) == op
    read = steer_from_data(steer_data("blocks.0.hook_resid_pre", torch.ones(2), 2.0, "all", op))
    assert read.op == op and read.alpha == 2.0


def test_a_new_tensor_op_moves_once_per_device_and_steers(shift):
    op = shift([1.0, 2.0])
    assert op.on(torch.device("cpu")) is op.on(torch.device("cpu"))
    act = torch.zeros(3, 2)
    out = op(act, torch.ones(2), torch.full((3, 1), 2.0))
    assert torch.equal(out, torch.tensor([[2.0, 4.0]] * 3))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([float("nan"), 1.0], "has NaN or inf"),
        (["a", "b"], "must be numbers"),
        (torch.tensor([1, 2]), "must be float16, bfloat16, float32 or float64"),
        (torch.ones(2, dtype=torch.float8_e4m3fn), "must be float16, bfloat16, float32 or float64"),
    ],
)
def test_a_new_tensor_op_refuses_bad_tensors_by_name(shift, value, message):
    with pytest.raises(SteerError, match=f"test_shift offset {message}"):
        shift(value)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "int8", "bool", ["float32"]])
def test_op_data_with_a_dtype_no_model_computes_in_is_refused(dtype):
    data = {"name": "feature_clamp", "value": 1.0, "index": 0, "encoder": [1.0, 0.0],
            "bias": 0.0, "b_dec_in": [0.0, 0.0], "dtype": dtype}  # fmt: skip
    with pytest.raises(SteerError, match="dtype must name a torch floating dtype"):
        op_from_data(data)
    with pytest.raises(SteerError) as info:
        steer_from_data({"site": "s", "vector": "k", "alpha": 1.0, "op": data})
    assert info.value.field == "op"


@pytest.mark.parametrize("scale", [1e20, 1e-20])
@pytest.mark.parametrize("op", [sl.Ablate(), sl.Clamp(0.5), sl.Cap(high=0.1)])
def test_projection_ops_on_float16_survive_any_direction_norm(scale, op):
    """The unit direction is taken in float32 before the cast: a float16 copy of a 1e20
    vector is inf, of a 1e-20 vector zero, and either gave NaN activations."""
    direction = torch.tensor([3.0, 4.0, 0.0, 0.0]) * scale
    act = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 2.0, 0.0]], dtype=torch.float16)
    out = op(act, operand(op, direction, torch.float16), torch.ones(2, 1, dtype=torch.float16))
    expected = op(act.double(), direction.double() / scale, torch.ones(2, 1, dtype=torch.float64))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected, atol=1e-2, rtol=1e-2)


def test_ablate_on_a_float16_model_with_huge_and_tiny_directions(tiny_dirs):
    lm = sl.load(tiny_dirs["gpt2"], backend="hf", dtype=torch.float16)
    site = "blocks.1.hook_resid_pre"
    base = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(0))
    runs = [lm.run_with_cache("Hello there", sites=[site], steer=sl.Steer(site, base * scale,
                              op=sl.Ablate()))[site] for scale in (1.0, 1e20, 1e-20)]  # fmt: skip
    for acts in runs:
        assert torch.isfinite(acts).all()
        along = acts.float() @ unit(base)
        assert along.abs().max() < 0.05  # projected out
    torch.testing.assert_close(runs[1], runs[0])
    torch.testing.assert_close(runs[2], runs[0])
    assert lm.hook_count() == 0


def test_replacing_the_site_of_a_feature_clamp_steer():
    """``dataclasses.replace`` works on any steer (it passed ``made_for`` to ``__init__``); a
    clamp moved off its SAE's site is refused with why."""
    sae = toy_sae("standard")
    clamp = sae.clamp(3, 20.0)
    again = dataclasses.replace(clamp, alpha=(2.0,))
    assert again.alpha == (2.0,) and again.op == clamp.op and again.made_for == clamp.made_for
    moved = dataclasses.replace(sl.Steer(sae.site, sae.W_dec[3]), site="blocks.1.hook_resid_pre")
    assert moved.site == "blocks.1.hook_resid_pre"
    with pytest.raises(SteerError, match="cannot steer at blocks.1.hook_resid_pre"):
        dataclasses.replace(clamp, site="blocks.1.hook_resid_pre")


def test_every_registered_op_takes_equality_from_the_base():
    for cls in OPS.values():
        assert cls.__eq__ is Op.__eq__ and cls.__hash__ is Op.__hash__, cls


def test_a_bound_op_is_its_arithmetic_bit_for_bit_with_its_direction_made_once(shift, monkeypatch):
    """``bind`` (what the engines call at each forward, ``Op.bound``) gives the op's own
    arithmetic, and a projection's unit or a rotation's plane is made when it is bound,
    not again at each call."""
    import steerlab.core.ops.base as base
    import steerlab.core.ops.rotate as rotate
    from steerlab.core.ops import bind

    g = torch.Generator().manual_seed(3)
    d = 16
    ops = [sl.Add(), sl.Ablate(), sl.Clamp(0.5), sl.Cap(-0.2, 0.3),
           sl.Rotate(60.0, torch.randn(d, generator=g)),
           sl.Rotate(-30.0, torch.randn(d, generator=g), adaptive=True),
           shift(torch.randn(d, generator=g)), lambda act, v, alpha: act * (1 + alpha) - v]  # fmt: skip
    made = []
    for module in (base, rotate):  # count the units made, wherever an op makes one
        monkeypatch.setattr(module, "unit", lambda v, dtype=None, _f=base.unit: made.append(1)
                            or _f(v, dtype))  # fmt: skip
    for dtype in (torch.float32, torch.bfloat16):
        act = torch.randn(5, d, generator=g).to(dtype)
        alpha = torch.linspace(-1.5, 2.0, 5)[:, None].to(dtype)
        for op in ops:
            v = operand(op, torch.randn(d, generator=g), dtype)
            made.clear()
            bound = bind(op, v)
            at_bind = len(made)
            assert at_bind or not isinstance(op, sl.Ablate | sl.Rotate), op  # counted at all
            outs = [bound(act, alpha) for _ in range(3)]
            assert len(made) == at_bind, op  # nothing made again at a call
            want = op(act, v, alpha)
            assert all(torch.equal(out, want) for out in outs), (op, dtype)
    assert sl.Ablate().bound(torch.ones(d))(torch.ones(1, d), torch.ones(1, 1)).abs().max() < 1e-6


def test_fingerprints_kept_hashes_each_tensor_once_inside_and_never_outside(monkeypatch):
    """``fingerprints_kept`` (a call's rows made into what vLLM's workers are sent): one
    hash per tensor inside; outside it, a tensor written in place gets its new key."""
    import hashlib

    import steerlab.core.ops.base as base
    from steerlab.core.ops import fingerprints_kept

    hashed, sha256 = [], hashlib.sha256
    monkeypatch.setattr(base.hashlib, "sha256", lambda *a: hashed.append(1) or sha256(*a))
    v, w = torch.randn(8), torch.randn(8)
    first = tensor_fingerprint(v)
    with fingerprints_kept():
        hashed.clear()
        keys = [tensor_fingerprint(t) for t in (v, w, v, w, v)]
        assert len(hashed) == 2 and keys[0] == keys[2] == first and keys[1] != first
        assert tensor_fingerprint(v.clone()) == first and len(hashed) == 3  # by identity
    v.mul_(2.0)
    assert tensor_fingerprint(v) != first  # nothing kept past the block
    with fingerprints_kept():
        assert tensor_fingerprint(v) == tensor_fingerprint(v.clone()) != first


@pytest.mark.parametrize("make", [
    lambda x: sl.Clamp(x), lambda x: sl.Cap(low=x), lambda x: sl.Cap(high=x),
    lambda x: sl.LoReFT("blocks.0.hook_resid_pre", torch.eye(1, 2), torch.zeros(1, 2),
                        torch.zeros(1), scale=x),
])  # fmt: skip
def test_an_ops_number_is_read_as_every_door_reads_one(make):
    """numpy's and 0-d tensors' numbers are numbers (``core.scalars.as_real``), kept as
    plain floats so the op travels as JSON; what is not one finite number is refused."""
    import json

    import numpy as np

    for number in (np.float32(1.5), np.int64(2), torch.tensor(0.25), 3):
        op = make(number)
        kept = [v for v in dataclasses.asdict(op).values() if isinstance(v, float)]
        assert float(number) in kept and all(type(v) is float for v in kept)
        json.dumps(op_to_data(op))
    for bad, message in ((float("inf"), "must be finite"), (np.float32("nan"), "must be finite"),
                         (torch.tensor(float("-inf")), "must be finite"),
                         (10**400, "must be finite"), (True, "must be a number"),
                         ("1", "must be a number"), ([1.0], "must be a number")):  # fmt: skip
        with pytest.raises(sl.SteerError, match=message):
            make(bad)
