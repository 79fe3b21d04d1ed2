"""Issue 41: a LoReFT passed as it is (``steer=reft``) reaches vLLM's workers and steers as
the independent reference does. Its steer's vector is a view of its R, which safetensors
refused to send beside R itself; the parity suite built the vector from a second call and
never sent a view."""

from __future__ import annotations

import torch
from reference import RefSteer, greedy

import steerlab as sl

PROMPTS = ["Once upon a time", "The sea was", "Tell me a story about the forest."]
NEW = 12
SITE = "blocks.2.hook_resid_post"


def _parts() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(41)
    R = torch.linalg.qr(torch.randn(128, 4, generator=generator))[0].T.contiguous()
    return (
        R,
        0.3 * torch.randn(4, 128, generator=generator),
        8.0 * torch.randn(4, generator=generator),
    )


def test_a_loreft_passed_as_it_is_steers_on_vllm_as_the_reference_does(each, hf):
    lm = each  # compiled, in the graph's LoReFT columns; eager, a hook
    R, W, b = _parts()
    for positions, scale in (("first:3+last:3", 1.0), ("all", 0.5)):
        reft = sl.LoReFT(SITE, R, W, b, positions=positions) * scale
        assert (
            reft.steers()[0].vector.untyped_storage().data_ptr() == R.untyped_storage().data_ptr()
        )
        out = lm.generate(PROMPTS, steer=reft, max_new_tokens=NEW)
        ref = RefSteer(SITE, R[0], scale, positions, "loreft", reft=(R, W, b))
        for row, prompt in enumerate(out.prompt_tokens):
            assert out.tokens[row] == greedy(hf, prompt, [ref], NEW, lm.eos_ids), (positions, row)
        plain = lm.generate(PROMPTS, max_new_tokens=NEW)
        assert out.tokens != plain.tokens  # the LoReFT did steer
    assert lm.hook_count() == 0
