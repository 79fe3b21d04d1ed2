"""``load_vllm``: a vLLM engine for a ``SteerableModel`` (``sl.load(..., backend="vllm")``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from steerlab.backends.base import config_eos
from steerlab.engine.vllm.engine import VLLMEngine
from steerlab.engine.vllm.sites import layout_for

WORKER = "steerlab.engine.vllm.worker.SteerWorker"
# Settings steerlab owns: hooks must exist before the model runs, so no compilation; scores
# are log-probabilities before temperature, top-k or top-p, as on every engine.
_OWNED = ("enforce_eager", "worker_extension_cls", "compilation_config", "model",
          "tensor_parallel_size", "pipeline_parallel_size", "dtype", "max_model_len",
          "revision", "trust_remote_code", "logprobs_mode")  # fmt: skip


def load_vllm(
    path: str,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    dtype: str = "float32",
    max_model_len: int | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    vllm_args: Mapping[str, Any] | None = None,
) -> VLLMEngine:
    """Start a vLLM engine on ``path`` with steerlab's worker extension, in eager mode.

    Args:
        path: a local HF-format folder or a hub id.
        tensor_parallel_size: GPUs (or CPU processes) each layer is split over.
        pipeline_parallel_size: stages the layers are split into.
        dtype: the weights' dtype, e.g. ``"bfloat16"``.
        max_model_len: the longest prompt plus completion, in tokens.
        revision: a hub revision; it also namespaces steered prefix-cache entries.
        trust_remote_code: allow the model's own Python code to run. Off by default.
        vllm_args: further ``vllm.LLM`` arguments (``gpu_memory_utilization``, ...).
    """
    for size, what in ((tensor_parallel_size, "tensor"), (pipeline_parallel_size, "pipeline")):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{what}_parallel_size must be an int >= 1; got {size!r}.")
    extra = dict(vllm_args or {})
    owned = sorted(set(extra) & set(_OWNED))
    if owned:
        raise ValueError(
            f"vllm_args may not set {owned}: steerlab sets them (eager mode and its worker "
            "extension keep steering hooks live, raw logprobs are what steerlab's scores "
            "are; the rest are load()'s own arguments)."
        )
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(path, revision=revision,
                                        trust_remote_code=trust_remote_code)  # fmt: skip
    layout_for(config.model_type)  # refuse an unknown family before starting anything
    tokenizer = AutoTokenizer.from_pretrained(path, revision=revision,
                                              trust_remote_code=trust_remote_code)  # fmt: skip
    from vllm import LLM

    # vLLM's "auto" falls back to pickled .bin weights; steerlab loads safetensors unless
    # trust_remote_code is on (or vllm_args names a load_format itself).
    extra.setdefault("load_format", "auto" if trust_remote_code else "safetensors")
    # Scores may list every token (a next-token distribution, say): vLLM's default is 20.
    extra.setdefault("max_logprobs", config.get_text_config().vocab_size)
    llm = LLM(model=path, tokenizer=path, dtype=dtype, max_model_len=max_model_len,
              tensor_parallel_size=tensor_parallel_size,
              pipeline_parallel_size=pipeline_parallel_size, revision=revision,
              trust_remote_code=trust_remote_code, enforce_eager=True,
              worker_extension_cls=WORKER, logprobs_mode="raw_logprobs",  # steerlab's scores
              **extra)  # fmt: skip
    _check_eager(llm)
    if pipeline_parallel_size > 1:
        llm.collective_rpc("steerlab_pp_buffers")
    try:
        generation = GenerationConfig.from_pretrained(path, revision=revision or "main")
    except OSError:  # no generation_config.json
        generation = None
    eos = {i for i in {tokenizer.eos_token_id} | config_eos(generation) if i is not None}
    pad = next((i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id) if i is not None), 0)
    return VLLMEngine(llm, tokenizer, eos_ids=eos, pad_id=pad, revision=revision)


def _check_eager(llm: Any) -> None:
    """Refuse an engine whose model was compiled: hooks added later would never run."""
    for worker in llm.collective_rpc("steerlab_describe"):
        if worker["compilation_mode"] != 0 or not worker["enforce_eager"]:
            raise RuntimeError(
                "This vLLM engine compiles its model (compilation mode "
                f"{worker['compilation_mode']}): steering hooks added after compilation "
                "never run, and steered rows would come out unsteered. steerlab starts vLLM "
                "with enforce_eager=True; something overrode it."
            )
