"""Write tests/fixtures/pyreft_0.1.0/: a folder real pyreft saved, and what pyreft computes with it.

Run it in a separate environment that has pyreft (it pins transformers 4.45.1, which the
project's environment does not have):

    python3 -m venv /tmp/pyreft-venv
    /tmp/pyreft-venv/bin/pip install torch==2.13.0          # the local CPU wheel
    /tmp/pyreft-venv/bin/pip install transformers==4.45.1 numpy accelerate datasets matplotlib
    /tmp/pyreft-venv/bin/pip install --no-deps pyvene==0.1.8 pyreft==0.1.0
    /tmp/pyreft-venv/bin/python scripts/make_pyreft_fixture.py [OUT_FOLDER]

It writes, from a tiny random GPT-2 built from a config (nothing downloaded):

- ``model/``: the GPT-2's weights and config (``save_pretrained``);
- ``reft/``: what ``ReftModel.save`` wrote for one LoReFT at layer 1's ``block_output``,
  rank 2, as pyreft initialises it (seeded: R orthonormal, W and b a random Linear's);
- ``expected.safetensors``: for each prompt, its token ids, the positions pyreft's
  ``get_intervention_locations`` picks for ``"f3+l3"``, and the logits of the model with
  and without pyreft's intervention there (``reft_model(..., unit_locations=...)``), and in
  its header the positions pyreft picks for prompts of 1 to 8 tokens;
- ``versions.json``: the versions that made it.

Token ids follow ``steerlab.testing.char_tokenizer`` (BOS 0, then ``ord(c) - 29``), so a
test can feed the same prompts through steerlab; the test checks that they agree.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pyreft
import pyvene
import torch
import transformers
from pyreft.dataset import get_intervention_locations
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "pyreft_0.1.0"
PROMPTS = ["Hi!", "Hey!", "Once upon a time"]  # 4, 5 and 17 tokens with BOS
LAYER, RANK, FIRST, LAST = 1, 2, 3, 3


def ids_of(text: str) -> list[int]:
    return [0] + [ord(c) - 29 for c in text]  # char_tokenizer: specials 0-2, ' ' is 3


def tiny_gpt2() -> transformers.GPT2LMHeadModel:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=4, n_positions=32,
                                     vocab_size=98, bos_token_id=0, eos_token_id=1,
                                     pad_token_id=2)  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def reft_model(model: transformers.GPT2LMHeadModel) -> pyreft.ReftModel:
    # the dictionary form pyreft's README uses; pyvene saves it as a list
    config = pyreft.ReftConfig(representations={
        "layer": LAYER, "component": "block_output", "low_rank_dimension": RANK,
        "intervention": pyreft.LoreftIntervention(embed_dim=16, low_rank_dimension=RANK,
                                                  dtype=torch.float32)})  # fmt: skip
    return pyreft.get_reft_model(model, config)


def get_locations(n: int) -> list[int]:
    """pyreft's positions for an ``n``-token prompt. For a short prompt it pads the list
    with -1, which its data module turns into a pad token it prepends (and masks); fed
    without that token, the real positions are the ones >= 0."""
    (locations,) = get_intervention_locations(last_position=n, first_n=FIRST, last_n=LAST,
                                              num_interventions=1, share_weights=True)  # fmt: skip
    return [p for p in locations if p >= 0]


def main(out: Path = OUT) -> None:
    shutil.rmtree(out, ignore_errors=True)
    model = tiny_gpt2()
    model.save_pretrained(out / "model")
    reft = reft_model(model)
    reft.save(str(out / "reft"))
    expected = {}
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            ids = torch.tensor([ids_of(prompt)])
            locations = get_locations(ids.shape[1])
            _, steered = reft(base={"input_ids": ids},
                              unit_locations={"sources->base": (None, [[locations]])})  # fmt: skip
            plain = model(input_ids=ids)
            expected[f"ids_{i}"] = ids[0]
            expected[f"locations_{i}"] = torch.tensor(locations)
            expected[f"plain_{i}"] = plain.logits[0].contiguous()
            expected[f"steered_{i}"] = steered.logits[0].contiguous()
    by_length = {n: get_locations(n) for n in range(1, 2 * max(FIRST, LAST) + 3)}
    save_file(expected, str(out / "expected.safetensors"),
              metadata={"prompts": json.dumps(PROMPTS), "positions": f"f{FIRST}+l{LAST}",
                        "locations_by_length": json.dumps(by_length)})  # fmt: skip
    versions = {"pyreft": pyreft.__version__ if hasattr(pyreft, "__version__") else "0.1.0",
                "pyvene": getattr(pyvene, "__version__", "0.1.8"), "torch": torch.__version__,
                "transformers": transformers.__version__}  # fmt: skip
    (out / "versions.json").write_text(json.dumps(versions, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)  # a folder of your own: tests do
