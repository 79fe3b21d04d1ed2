"""``load_vllm``: a vLLM engine for a ``SteerableModel`` (``sl.load(..., backend="vllm")``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from steerlab.backends.base import config_eos
from steerlab.engine.vllm.engine import VLLMEngine
from steerlab.engine.vllm.graph import GRAPH_ENV, KINDS, cache_root
from steerlab.engine.vllm.sites import layout_for, vllm_sites

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
    graph: str | Sequence[str] | None = None,
    graph_kinds: Sequence[str] | None = None,
) -> VLLMEngine:
    """Start a vLLM engine on ``path`` with steerlab's worker extension.

    The mode follows the measurements (the README's table): on a CPU, eager (compiled
    starts 2-3x slower there and gains 1.1-1.25x only where its graph holds the steers);
    elsewhere compiled, as vLLM is. ``vllm_args={"enforce_eager": True}`` or
    ``False`` chooses. Eager runs hooks on vLLM's modules: every op, site, condition and
    monitor. Pipeline parallelism runs eagerly.

    Compiled, the graph is plain vLLM's unless ``graph`` names sites to build steering into
    (``graph.py``): at those sites every operation with a table form and LoReFT, one a
    token at a site, with conditions and monitors read inside the graph
    (``graph_reads.py``). Unsteered requests then cost what they cost on plain vLLM plus
    the built sites. A forward that needs anything else (a site not built in, a top-k
    feature clamp, two steers on one token at one site, a per-token condition, a condition
    on a steer over its own prompt, more than the buffers hold) runs uncompiled through
    vLLM's ``skip_compiled`` and steerlab's eager path: exact, slower; ``lm.explain`` says
    so. On a GPU, CUDA graphs are captured piecewise (whole-model graphs would replay
    without the Python that writes each forward's steers).

    Args:
        path: a local HF-format folder or a hub id.
        tensor_parallel_size: GPUs (or CPU processes) each layer is split over.
        pipeline_parallel_size: stages the layers are split into.
        dtype: the weights' dtype, e.g. ``"bfloat16"``.
        max_model_len: the longest prompt plus completion, in tokens.
        revision: a hub revision; it also namespaces steered prefix-cache entries.
        trust_remote_code: allow the model's own Python code to run. Off by default.
        vllm_args: further ``vllm.LLM`` arguments (``gpu_memory_utilization``, ...).
        graph: compiled only: the sites to build steering into, as canonical names
            (``"blocks.6.hook_resid_pre"``), or ``"all"`` (every site: each costs a little
            on every forward, steered or not). None or ``()``: none.
        graph_kinds: with ``graph``: what its sites compute (``graph.KINDS``): ``"add"``
            (Add), ``"proj"`` (Ablate, Clamp, Cap), ``"feat"`` (a feature clamp), ``"rot"``
            (Rotate), ``"loreft"``, ``"reads"`` (conditions and monitors). None: all of
            them. Each costs every forward, steered or not (the README's table measures
            it); a forward that needs one left out runs uncompiled, exactly.
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
    from vllm import LLM
    from vllm.platforms import current_platform

    eager, why_eager = _mode(extra.pop("enforce_eager", None), pipeline_parallel_size,
                             current_platform.is_cpu())  # fmt: skip
    built = graph_sites(graph, config.get_text_config().num_hidden_layers, eager)
    kinds = built_kinds(graph_kinds, built)

    # vLLM's "auto" falls back to pickled .bin weights; steerlab loads safetensors unless
    # trust_remote_code is on (or vllm_args names a load_format itself).
    extra.setdefault("load_format", "auto" if trust_remote_code else "safetensors")
    # Scores may list every token (a next-token distribution, say): vLLM's default is 20.
    extra.setdefault("max_logprobs", config.get_text_config().vocab_size)
    if not eager:  # CUDA graphs only inside the compiled pieces (on a CPU: none at all)
        extra["compilation_config"] = {"cudagraph_mode": "PIECEWISE"}
    with _graph_env(None if eager else built, kinds):
        llm = LLM(model=path, tokenizer=path, dtype=dtype, max_model_len=max_model_len,
                  tensor_parallel_size=tensor_parallel_size,
                  pipeline_parallel_size=pipeline_parallel_size, revision=revision,
                  trust_remote_code=trust_remote_code, enforce_eager=eager,
                  worker_extension_cls=WORKER, logprobs_mode="raw_logprobs",  # steerlab's scores
                  **extra)  # fmt: skip
    _check_eager(llm, eager, kinds)
    llm.collective_rpc("steerlab_attach")  # the workers hook each call's sites themselves
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
    engine.graph_sites, engine.graph_kinds = frozenset(built), frozenset(kinds)
    return engine


CPU_EAGER = ("the default on a CPU: compiled starts 2-3x slower there and gains 1.1-1.25x "
             "only where its graph holds the steers, none by default (the README's table); "
             "vllm_args={'enforce_eager': False} compiles")  # fmt: skip


def _mode(asked: object, stages: int, cpu: bool) -> tuple[bool, str]:
    """Whether vLLM runs eagerly, and the reason (``asked``: ``vllm_args["enforce_eager"]``,
    None when not given; ``cpu``: vLLM's platform is a CPU). When not asked: eager on a
    CPU or with pipeline parallelism (not built compiled), compiled elsewhere.

    >>> _mode(None, 1, cpu=False)
    (False, 'the default on this platform')
    >>> _mode(None, 1, cpu=True)[0], _mode(False, 1, cpu=True)
    (True, (False, "loaded with vllm_args={'enforce_eager': False}"))
    """
    if asked is not None and not isinstance(asked, bool):
        raise ValueError(f"vllm_args['enforce_eager'] must be True or False; got {asked!r}.")
    if stages > 1:
        if asked is False:
            raise ValueError("Steering inside vLLM's compiled graph (enforce_eager=False) is "
                             "not built for pipeline parallelism yet: load eagerly, or use "
                             "tensor parallelism.")  # fmt: skip
        return True, "pipeline parallelism runs eagerly (the compiled steering is not built for it)"
    if asked is not None:
        return asked, f"loaded with vllm_args={{'enforce_eager': {asked}}}"
    if cpu:
        return True, CPU_EAGER
    return False, "the default on this platform"


def graph_sites(graph: object, n_layers: int, eager: bool) -> list[str]:
    """The sites a compiled model is built with (``load_vllm``'s ``graph``), checked:
    canonical names of this model's sites, in forward order; refused on an eager engine.

    >>> graph_sites(["blocks.1.hook_resid_pre", "hook_embed"], 2, eager=False)
    ['hook_embed', 'blocks.1.hook_resid_pre']
    >>> len(graph_sites("all", 2, eager=False)), graph_sites(None, 2, eager=True)
    (11, [])
    """
    every = vllm_sites(n_layers)
    if graph is None or (isinstance(graph, (list, tuple)) and not graph):
        return []
    if eager:
        raise ValueError("graph= names the sites to build into a compiled model, and this "
                         "engine runs eagerly (every site is hooked as a call needs it): "
                         "drop graph=, or load with vllm_args={'enforce_eager': False}.")  # fmt: skip
    if graph == "all":
        return every
    if isinstance(graph, str) or not isinstance(graph, (list, tuple, set, frozenset)):
        raise ValueError(f"graph must be 'all' or a list of site names; got {graph!r}.")
    unknown = [s for s in graph if s not in every]
    if unknown:
        raise ValueError(f"graph= names {unknown[0]!r}, which is not one of this model's "
                         f"sites ({every[0]!r}, {every[1]!r} ... {every[-1]!r}).")  # fmt: skip
    return [s for s in every if s in set(graph)]


def built_kinds(kinds: object, sites: list[str]) -> list[str]:
    """What the built ``sites`` compute (``load_vllm``'s ``graph_kinds``), checked: None
    is every kind (``graph.KINDS``).

    >>> built_kinds(["proj", "add"], ["blocks.1.hook_resid_pre"]), len(built_kinds(None, []))
    (['add', 'proj'], 6)
    """
    if kinds is None:
        return list(KINDS)
    if isinstance(kinds, str) or not isinstance(kinds, (list, tuple, set, frozenset)):
        raise ValueError(f"graph_kinds must be a list of {list(KINDS)}; got {kinds!r}.")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"graph_kinds names {unknown[0] if unknown else 'nothing'!r}; each "
                         f"must be one of {list(KINDS)} (None: all of them).")  # fmt: skip
    if not sites:
        raise ValueError("graph_kinds= says what the sites built into a compiled graph "
                         "compute, and no site is built in: name them with graph=.")  # fmt: skip
    return [k for k in KINDS if k in set(kinds)]


@contextmanager
def _graph_env(sites: list[str] | None, kinds: list[str]) -> Iterator[None]:
    """While vLLM starts its workers: for a compiled engine (``sites``: those to build in,
    holding ``kinds``; None: eager), the switch that makes them build the model with graph
    steering at those sites, and a compile cache of its own (``graph.py``)."""
    names = (GRAPH_ENV, "VLLM_CACHE_ROOT", BREAKABLE)
    before = {name: os.environ.get(name) for name in names}
    if sites is not None:
        os.environ[GRAPH_ENV] = json.dumps({"sites": sites, "kinds": kinds})
        os.environ["VLLM_CACHE_ROOT"] = cache_root(sites, kinds)
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


def _check_eager(llm: Any, eager: bool = True, kinds: Sequence[str] = KINDS) -> None:
    """Refuse an engine whose model was compiled without steerlab's graph steering: hooks
    added later would never run, and steered rows would come out unsteered (``eager``:
    what load asked vLLM for; ``kinds``: what its graph's sites were to compute)."""
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
            if sorted(worker.get("kinds", ())) != sorted(kinds):
                raise RuntimeError(f"vLLM's workers built graph steering computing "
                                   f"{worker.get('kinds')}, not the {list(kinds)} asked for.")  # fmt: skip
            continue
        if worker["compilation_mode"] != 0 or not worker["enforce_eager"]:
            raise RuntimeError(
                "This vLLM engine compiles its model (compilation mode "
                f"{worker['compilation_mode']}): steering hooks added after compilation "
                "never run, and steered rows would come out unsteered. steerlab starts vLLM "
                "with enforce_eager=True; something overrode it."
            )
