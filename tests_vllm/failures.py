"""What the recovery tests share (issue 49): a steer that overflows, and the calls that must
equal a fresh engine token for token after any failed call, checked against plain HF
(``tests/reference.py``, which a fresh engine equals: ``test_toy.py``, ``test_graph.py``).

Imported by name from the vLLM modules (``test_recovery.py``, ``test_numeric_edges.py``,
``test_server.py``, ``test_tensor_parallel.py``, ``test_graph.py``).
"""

from __future__ import annotations

import torch
from reference import RefSteer, greedy

import steerlab as sl
from steerlab.engine import Request, Sampling

PROMPTS = ["Once upon a time", "The happy fox"]
LONG = [p * 8 for p in PROMPTS]  # more KV blocks (32 tokens each) than a short prompt fills
NEW = 6
SITE = "blocks.2.hook_resid_pre"
VECTOR = torch.randn(128, generator=torch.Generator().manual_seed(49)) * 0.4
ALPHA = 4.0


def steer(alpha: float = ALPHA) -> sl.Steer:
    """The steer of the later calls (and of the rows beside a failing one)."""
    return sl.Steer(SITE, VECTOR, alpha=alpha)


def overflowing() -> sl.Steer:
    """A steer whose activations overflow float32: its row's logits are NaN."""
    return sl.Steer("blocks.1.hook_resid_pre", torch.full((128,), 1e30), alpha=1e8)


def request_for(lm, text: str, steered: bool, new: int = NEW, overflow: bool = False) -> Request:
    """One engine request (for ``lm.engine.stream``): ``text``, steered by ``steer()``
    (or by ``overflowing()``), ``new`` greedy tokens."""
    steers = [overflowing()] if overflow else [steer()] if steered else []
    ids = tuple(lm.tokenizer(text)["input_ids"])
    return Request(ids, tuple(sl.Steer.of(s, s.alpha[0]) for s in steers),
                   Sampling(max_new_tokens=new))  # fmt: skip


def expected(hf, lm, request: Request) -> list[int]:
    """Plain HF's greedy tokens for ``request`` (made by ``request_for``, not overflowing)."""
    ref = [RefSteer(s.site, s.vector, s.alpha[0]) for s in request.steers]
    return greedy(hf, list(request.prompt), ref, request.sampling.max_new_tokens, lm.eos_ids)


def assert_later_calls_exact(lm, hf) -> None:
    """Unsteered and steered greedy calls, on short and on long prompts, each equal to
    plain HF token for token; and no hook left on any worker."""
    for prompts in (PROMPTS, LONG):
        plain = lm.generate(prompts, max_new_tokens=NEW)
        steered = lm.generate(prompts, steer(), max_new_tokens=NEW)
        for i, ids in enumerate(plain.prompt_tokens):
            assert plain.tokens[i] == greedy(hf, ids, [], NEW, lm.eos_ids), (prompts[i], "plain")
            want = greedy(hf, ids, [RefSteer(SITE, VECTOR, ALPHA)], NEW, lm.eos_ids)
            assert steered.tokens[i] == want, (prompts[i], "steered")
        assert steered.tokens != plain.tokens  # the steer acts
    assert lm.hook_count() == 0
