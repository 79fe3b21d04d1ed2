"""Probe for issue 39: does a steer read from buffers survive vLLM's compilation, on a CPU?

Run in .venv-vllm (about 3 minutes: one compiled engine start):

    PYTHONPATH=scripts .venv-vllm/bin/python scripts/probe_vllm_graph.py

What it does, without a fork of vLLM and without steerlab's own engine:

- ``ProbeWorker`` (the ``worker_extension_cls``) is imported in each worker process before
  the model is built; importing it wraps ``BaseModelLoader.load_model`` so that the model,
  once built and before vLLM compiles it, gets two buffers (a vector ``[d]`` and per-token
  alphas ``[max tokens]``) and a forward pre-hook on block 1 that adds ``alpha * v`` to
  its input: tensors only, so what is compiled holds no value of a request;
- a pre-hook on the outer model (which vLLM does not compile) writes each forward's
  per-token alphas in place (every real token at the alpha sent by RPC, pads at 0);
- an RPC rewrites the vector in place between calls.

It then generates greedily with compilation on, for five (vector, alpha) settings, and
compares every row with HF ``generate`` under a plain PyTorch hook that adds the same
``alpha * v`` at block 1's input; reads the graphs compiled before and after the five
settings; and, as a control, adds a hook after compilation that would change every token
and checks that it changes nothing (so the model really runs compiled, and the steer
before it ran inside the graph). It prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys

import torch

SITE_BLOCK = 1
MAX_TOKENS = 4096


def _install(model: torch.nn.Module) -> None:
    blocks = model.transformer.h  # vLLM's GPT-2
    d = model.config.n_embd
    model.register_buffer("probe_vector", torch.zeros(d), persistent=False)
    model.register_buffer("probe_alpha", torch.zeros(MAX_TOKENS), persistent=False)
    model.probe_current = 0.0  # this call's alpha (plain data, outside the graph)

    def steer(_block, args):  # traced by dynamo into the compiled graph: tensors only
        h = args[0]
        alpha = model.probe_alpha[: h.shape[0]].to(h.dtype)
        return (h + alpha[:, None] * model.probe_vector.to(h.dtype), *args[1:])

    blocks[SITE_BLOCK].register_forward_pre_hook(steer)


def _wrap_loader() -> None:
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    if getattr(BaseModelLoader.load_model, "_probe", False):
        return
    original = BaseModelLoader.load_model

    def load_model(self, *args, **kwargs):
        model = original(self, *args, **kwargs)
        _install(model)
        return model

    load_model._probe = True  # type: ignore[attr-defined]
    BaseModelLoader.load_model = load_model


if os.environ.get("PROBE_VLLM_GRAPH"):
    _wrap_loader()


class ProbeWorker:
    model_runner: object

    def probe_set(self, vector: list[float], alpha: float) -> int:
        model = self.model_runner.get_model()
        model.probe_vector.copy_(torch.tensor(vector))
        model.probe_current = alpha
        if not getattr(model, "probe_hooked", False):
            model.register_forward_pre_hook(self._probe_lay_out, with_kwargs=True)
            model.probe_hooked = True
        return 1

    def _probe_lay_out(self, model, args, kwargs):  # eager: the outer model is not compiled
        runner = self.model_runner
        batch = runner.input_batch
        n = batch.num_reqs
        starts = runner.query_start_loc.np[: n + 1].tolist()
        model.probe_alpha.zero_()
        model.probe_alpha[: starts[n]] = model.probe_current  # every real token this step

    def probe_late_hook(self) -> int:
        """A control: a hook added now, after vLLM compiled the model, that would change
        every token (a large vector at block 2). Under compilation it never runs."""
        model = self.model_runner.get_model()
        big = torch.full((model.config.n_embd,), 50.0)
        model.transformer.h[2].register_forward_pre_hook(lambda _m, a: (a[0] + big, *a[1:]))
        return 1

    def probe_compiles(self) -> dict:
        from vllm.compilation.counter import compilation_counter

        config = self.model_runner.vllm_config
        from torch._dynamo.utils import counters

        return {"dynamo_unique_graphs": counters["stats"]["unique_graphs"],
                "graphs": compilation_counter.num_graphs_seen,
                "backend_compilations": compilation_counter.num_backend_compilations,
                "mode": int(config.compilation_config.mode),
                "eager": bool(self.model_runner.model_config.enforce_eager)}  # fmt: skip


def _reference(folder: str, prompt_ids: list[list[int]], vector: torch.Tensor, alpha: float,
               new: int) -> list[list[int]]:  # fmt: skip
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    block = model.transformer.h[SITE_BLOCK]
    handle = block.register_forward_pre_hook(lambda _m, a: (a[0] + alpha * vector, *a[1:]))
    out = []
    try:
        for ids in prompt_ids:
            x = torch.tensor([ids])
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new,
                               do_sample=False, pad_token_id=0)  # fmt: skip
            out.append(y[0, len(ids) :].tolist())
    finally:
        handle.remove()
    return out


def main() -> None:
    os.environ["PROBE_VLLM_GRAPH"] = "1"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    from steerlab.loading import _locate

    folder = _locate("steerlab-tiny")
    llm = LLM(model=folder, tokenizer=folder, dtype="float32", max_model_len=128,
              enforce_eager=False, load_format="safetensors",
              worker_extension_cls="probe_vllm_graph.ProbeWorker")  # fmt: skip
    tok = llm.get_tokenizer()
    prompts = ["Once upon a time", "The sea was calm and", "In the forest there was"]
    ids = [tok(p)["input_ids"] for p in prompts]
    new = 12
    before = llm.collective_rpc("probe_compiles")[0]
    gen = torch.Generator().manual_seed(0)
    equal = total = 0
    for alpha in [0.0, 2.0, 4.0, -3.0, 6.0]:
        vector = torch.randn(128, generator=gen) * 0.5
        llm.collective_rpc("probe_set", args=(vector.tolist(), alpha))
        rows = [{"prompt_token_ids": i} for i in ids]
        params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
        got = [list(r.outputs[0].token_ids) for r in llm.generate(rows, params, use_tqdm=False)]
        want = _reference(folder, ids, vector, alpha, new)
        equal += sum(g == w for g, w in zip(got, want))
        total += len(want)
    after = llm.collective_rpc("probe_compiles")[0]
    llm.collective_rpc("probe_set", args=([0.0] * 128, 0.0))
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    rows = [{"prompt_token_ids": i} for i in ids]
    plain = [list(r.outputs[0].token_ids) for r in llm.generate(rows, params, use_tqdm=False)]
    llm.collective_rpc("probe_late_hook")
    late = [list(r.outputs[0].token_ids) for r in llm.generate(rows, params, use_tqdm=False)]
    print(json.dumps({"rows_equal": equal, "rows": total, "compiles_before": before,
                      "compiles_after": after,
                      "late_hook_ignored": late == plain}), flush=True)  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
