"""``load_vllm``: a vLLM engine for a ``SteerableModel`` (``sl.load(..., backend="vllm")``)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from steerlab.backends.base import config_eos
from steerlab.engine.vllm.engine import VLLMEngine
from steerlab.engine.vllm.graph import GRAPH_ENV, cache_root
from steerlab.engine.vllm.sites import layout_for

WORKER = "steerlab.engine.vllm.worker.SteerWorker"
BREAKABLE = "VLLM_USE_BREAKABLE_CUDAGRAPH"
# Settings steerlab owns: its worker extension; the compilation, which eager hooks or the
# graph's own steering (``graph.py``) must match; scores are log-probabilities before
# temperature, top-k or top-p, as on every engine.
_OWNED = ("worker_extension_cls", "compilation_config", "model",
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
    """Start a vLLM engine on ``path`` with steerlab's worker extension.

    Compiled by default, as vLLM is: steerlab builds its steering into the model before
    vLLM compiles it (``graph.py``): every operation with a table form and LoReFT, at every
    site, one a token at a site, with conditions and monitors read inside the graph
    (``graph_reads.py``). A forward that needs anything else (a top-k feature clamp, two
    steers on one token at one site, a per-token condition, a condition on a steer over its
    own prompt, more than the buffers hold) runs uncompiled through vLLM's
    ``skip_compiled`` and steerlab's eager path: exact, slower; ``lm.explain`` says so.
    On a GPU, CUDA graphs are captured piecewise (whole-model graphs would replay without
    the Python that writes each forward's steers).
    ``vllm_args={"enforce_eager": True}`` runs eagerly, with hooks on vLLM's modules:
    every op, site, condition and monitor. Pipeline parallelism runs eagerly. A compiled
    start compiles (see the README's figures).

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
            f"vllm_args may not set {owned}: steerlab sets them (its worker extension and "
            "the compilation its steering is built for, raw logprobs are what steerlab's "
            "scores are; the rest are load()'s own arguments)."
        )
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    config = AutoConfig.from_pretrained(path, revision=revision,
                                        trust_remote_code=trust_remote_code)  # fmt: skip
    layout_for(config.model_type)  # refuse an unknown family before starting anything
    tokenizer = AutoTokenizer.from_pretrained(path, revision=revision,
                                              trust_remote_code=trust_remote_code)  # fmt: skip
    eager, why_eager = _mode(extra.pop("enforce_eager", None), pipeline_parallel_size)
    from vllm import LLM

    # vLLM's "auto" falls back to pickled .bin weights; steerlab loads safetensors unless
    # trust_remote_code is on (or vllm_args names a load_format itself).
    extra.setdefault("load_format", "auto" if trust_remote_code else "safetensors")
    # Scores may list every token (a next-token distribution, say): vLLM's default is 20.
    extra.setdefault("max_logprobs", config.get_text_config().vocab_size)
    if not eager:  # CUDA graphs only inside the compiled pieces (on a CPU: none at all)
        extra["compilation_config"] = {"cudagraph_mode": "PIECEWISE"}
    with _graph_env(eager):
        llm = LLM(model=path, tokenizer=path, dtype=dtype, max_model_len=max_model_len,
                  tensor_parallel_size=tensor_parallel_size,
                  pipeline_parallel_size=pipeline_parallel_size, revision=revision,
                  trust_remote_code=trust_remote_code, enforce_eager=eager,
                  worker_extension_cls=WORKER, logprobs_mode="raw_logprobs",  # steerlab's scores
                  **extra)  # fmt: skip
    _check_eager(llm, eager)
    if pipeline_parallel_size > 1:
        llm.collective_rpc("steerlab_pp_buffers")
    try:
        generation = GenerationConfig.from_pretrained(path, revision=revision or "main")
    except OSError:  # no generation_config.json
        generation = None
    eos = {i for i in {tokenizer.eos_token_id} | config_eos(generation) if i is not None}
    pad = next((i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id) if i is not None), 0)
    engine = VLLMEngine(llm, tokenizer, eos_ids=eos, pad_id=pad, revision=revision)
    engine.graph, engine.why_eager = not eager, why_eager
    return engine


def _mode(asked: object, stages: int) -> tuple[bool, str]:
    """Whether vLLM runs eagerly, and why (``asked``: ``vllm_args["enforce_eager"]``, None
    when not given). Compiled unless asked, or pipeline parallel (not built compiled)."""
    if asked is not None and not isinstance(asked, bool):
        raise ValueError(f"vllm_args['enforce_eager'] must be True or False; got {asked!r}.")
    if stages > 1:
        if asked is False:
            raise ValueError("Steering inside vLLM's compiled graph (enforce_eager=False) is "
                             "not built for pipeline parallelism yet: load eagerly, or use "
                             "tensor parallelism.")  # fmt: skip
        return True, "pipeline parallelism runs eagerly (the compiled steering is not built for it)"
    if asked:
        return True, "loaded with vllm_args={'enforce_eager': True}"
    return False, ""


@contextmanager
def _graph_env(eager: bool) -> Iterator[None]:
    """While vLLM starts its workers: for a compiled engine, the switch that makes them
    build the model with graph steering, and a compile cache of its own (``graph.py``)."""
    names = (GRAPH_ENV, "VLLM_CACHE_ROOT", BREAKABLE)
    before = {name: os.environ.get(name) for name in names}
    if not eager:
        os.environ[GRAPH_ENV] = "1"
        os.environ["VLLM_CACHE_ROOT"] = cache_root()
        # vLLM's GPU runner may capture the eager model in breakable CUDA graphs, which
        # replay without the pre-hook that writes each forward's steers: opt out
        os.environ.setdefault(BREAKABLE, "0")
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _check_eager(llm: Any, eager: bool = True) -> None:
    """Refuse an engine whose model was compiled without steerlab's graph steering: hooks
    added later would never run, and steered rows would come out unsteered (``eager``:
    what load asked vLLM for)."""
    for worker in llm.collective_rpc("steerlab_describe"):
        if not eager:
            if not worker.get("graph"):
                raise RuntimeError("vLLM built this model without steerlab's graph steering "
                                   "(its workers did not load it through steerlab's model "
                                   "loader hook): steered rows would come out unsteered.")  # fmt: skip
            if worker.get("full_cudagraphs"):
                raise RuntimeError("vLLM captures this model whole in CUDA graphs: a replay "
                                   "skips the Python that writes each forward's steers, so "
                                   "they would be stale. steerlab asks for "
                                   f"cudagraph_mode='PIECEWISE' and {BREAKABLE}=0; "
                                   "something overrode it.")  # fmt: skip
            continue
        if worker["compilation_mode"] != 0 or not worker["enforce_eager"]:
            raise RuntimeError(
                "This vLLM engine compiles its model (compilation mode "
                f"{worker['compilation_mode']}): steering hooks added after compilation "
                "never run, and steered rows would come out unsteered. steerlab starts vLLM "
                "with enforce_eager=True; something overrode it."
            )
