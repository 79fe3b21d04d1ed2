"""SAELens 6.x SAE folders: ``cfg.json`` + ``sae_weights.safetensors``, read and written.

The schema is SAELens's (``SAEConfig.to_dict()`` plus ``architecture``; file names from
``sae_lens/constants.py``). Reading checks the whole config and the tensor headers before
any weight is loaded, refuses anything it would have to guess at (another architecture, a
run-time normalisation, a reshape, a hook that is not a steerlab site), and never unpickles.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from steerlab.core import atomic, jsontext
from steerlab.core.identity import is_config_sha256
from steerlab.core.sites import Site, SiteError
from steerlab.features.errors import SAEError
from steerlab.features.sae import ARCHITECTURES, FLOAT_DTYPES, SAE

CFG_FILENAME = "cfg.json"
WEIGHTS_FILENAME = "sae_weights.safetensors"
PICKLE_SUFFIXES = frozenset({".pt", ".pth", ".bin", ".ckpt", ".pkl", ".pickle"})
# SAELens's DTYPE_MAP (sae_lens/constants.py): the dtypes an SAE may have, by name.
DTYPES: dict[str, torch.dtype] = {
    name: dtype
    for dtype in FLOAT_DTYPES
    for name in (str(dtype).removeprefix("torch."), str(dtype))
}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items() if not name.startswith("torch.")}
# Keys whose value is a name: anything but a string is refused before it is compared.
_TEXT_KEYS = ("architecture", "dtype", "normalize_activations", "reshape_activations")
# Written into metadata when the SAE has none, so SAELens reads the folder as 6.x.
SAE_LENS_VERSION = "6.0.0"


@dataclass(frozen=True)
class Config:
    """What ``cfg.json`` says, checked; ``metadata`` is the rest, kept for ``save``."""

    architecture: str
    d_in: int
    d_sae: int
    dtype: torch.dtype
    apply_b_dec_to_input: bool
    site: str
    model_name: str
    k: int | None = None
    rescale_acts_by_decoder_norm: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    model_config_sha256: str = ""

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The weight tensors this config needs, with their shapes."""
        shapes = {
            "W_enc": (self.d_in, self.d_sae),
            "W_dec": (self.d_sae, self.d_in),
            "b_enc": (self.d_sae,),
            "b_dec": (self.d_in,),
        }
        if self.architecture == "jumprelu":
            shapes["threshold"] = (self.d_sae,)
        return shapes

    def sae(self, tensors: dict[str, torch.Tensor], source: str) -> SAE:
        """The SAE this config describes, with ``tensors`` (by SAELens's names) as weights."""
        return SAE(
            site=self.site, architecture=self.architecture, k=self.k,
            rescale_acts_by_decoder_norm=self.rescale_acts_by_decoder_norm,
            apply_b_dec_to_input=self.apply_b_dec_to_input, model_name=self.model_name,
            model_config_sha256=self.model_config_sha256, source=source,
            metadata=self.metadata, **tensors,
        )  # fmt: skip


def parse_config(cfg: Any, where: str) -> Config:
    """Check a SAELens config dict; ``where`` names it in errors.

    Raises:
        SAEError: naming the key and value that steerlab cannot read.

    >>> parse_config({"architecture": "standard", "d_in": 4, "d_sae": 8,
    ...               "metadata": {"hook_name": "blocks.0.hook_resid_pre"}}, "cfg").d_sae
    8
    """
    if not isinstance(cfg, dict):
        raise SAEError(f"{where} must hold a JSON object; it holds {type(cfg).__name__}.")
    architecture = cfg.get("architecture")
    if architecture is None:
        raise SAEError(f"{where} has no 'architecture' (SAELens 6 writes one).")
    for key in _TEXT_KEYS:
        if key in cfg and not isinstance(cfg[key], str):
            raise SAEError(f"{key} in {where} must be a string; got {_kind(cfg[key])}.")
    if architecture not in ARCHITECTURES:
        raise SAEError(
            f"SAE architecture {architecture!r} in {where} is not supported; steerlab reads "
            f"{', '.join(repr(a) for a in ARCHITECTURES)}."
        )
    d_in, d_sae = (_positive_int(cfg, key, where) for key in ("d_in", "d_sae"))
    dtype_name = cfg.get("dtype", "float32")
    if dtype_name not in DTYPES:
        raise SAEError(
            f"dtype {dtype_name!r} in {where} is not one of {sorted(DTYPE_NAMES.values())}."
        )
    apply_b_dec = cfg.get("apply_b_dec_to_input", True)
    if not isinstance(apply_b_dec, bool):
        raise SAEError(
            f"apply_b_dec_to_input in {where} must be true or false; got {apply_b_dec!r}."
        )
    _check_raw_inputs(cfg, where)
    metadata, site, model_name, fingerprint = _metadata(cfg, where)
    k, rescale = _topk(cfg, architecture, d_sae, where)
    return Config(
        architecture, d_in, d_sae, DTYPES[dtype_name], apply_b_dec, site, str(model_name),
        k, rescale, dict(metadata), fingerprint,
    )  # fmt: skip


def _check_raw_inputs(cfg: dict[str, Any], where: str) -> None:
    """Refuse a config whose SAE reads transformed inputs: steerlab feeds raw activations."""
    normalize = cfg.get("normalize_activations", "none")
    if normalize != "none":
        raise SAEError(
            f"normalize_activations {normalize!r} in {where} is not supported: steerlab reads "
            "SAEs whose inputs are the raw activations ('none'). Fold the normalisation into "
            "the weights first (SAELens: fold_activation_norm_scaling_factor or "
            "fold_activation_whitening, then save_model)."
        )
    reshape = cfg.get("reshape_activations", "none")
    if reshape != "none":
        raise SAEError(
            f"reshape_activations {reshape!r} in {where} is not supported: steerlab steers "
            "residual-stream sites, read as [..., d_model]."
        )


def _metadata(cfg: dict[str, Any], where: str) -> tuple[dict[str, Any], str, str, str]:
    """The config's ``metadata``: itself, its site, model name and config fingerprint."""
    metadata = cfg.get("metadata")
    if not isinstance(metadata, dict):
        raise SAEError(
            f"{where} has no 'metadata' object with the hook_name (a config from SAELens "
            "before 6.0? Load and save it once with SAELens 6)."
        )
    site = _site(metadata, where)
    model_name = metadata.get("model_name") or ""
    if not isinstance(model_name, str):
        raise SAEError(f"metadata.model_name in {where} must be a string; got {_kind(model_name)}.")
    fingerprint = metadata.get("model_config_sha256", "")
    if not is_config_sha256(fingerprint):
        raise SAEError(f"metadata.model_config_sha256 in {where} must be 16 hex digits; got "
                       f"{_kind(fingerprint)}.")  # fmt: skip
    return metadata, site, model_name, fingerprint


def _topk(
    cfg: dict[str, Any], architecture: str, d_sae: int, where: str
) -> tuple[int | None, bool]:
    """A top-k SAE's ``k`` and whether it rescales by decoder norm; ``(None, False)`` else."""
    k, rescale = None, False
    if architecture == "topk":
        k = cfg.get("k")
        if type(k) is not int or not 1 <= k <= d_sae:
            raise SAEError(f"k in {where} must be an int in [1, d_sae={d_sae}]; got {k!r}.")
        rescale = cfg.get("rescale_acts_by_decoder_norm", False)
        if not isinstance(rescale, bool):
            raise SAEError(f"rescale_acts_by_decoder_norm in {where} must be true or false.")
    return k, rescale


def _kind(value: object) -> str:
    """A short description of a config value for an error: its type and its start."""
    return f"{type(value).__name__} {value!r:.60}"


def _positive_int(cfg: dict[str, Any], key: str, where: str) -> int:
    value = cfg.get(key)
    if type(value) is not int or value < 1:
        raise SAEError(f"{key} in {where} must be a positive int; got {value!r}.")
    return value


def _site(metadata: dict[str, Any], where: str) -> str:
    hook_name = metadata.get("hook_name")
    if not isinstance(hook_name, str):
        raise SAEError(f"metadata.hook_name in {where} must name the site; got {hook_name!r}.")
    try:
        site = Site.parse(hook_name).name
    except SiteError:
        raise SAEError(
            f"metadata.hook_name {hook_name!r} in {where} is not a steerlab site: steerlab "
            "steers TransformerLens residual-stream names such as 'blocks.2.hook_resid_pre' "
            "(also hook_resid_mid, hook_resid_post, hook_attn_out, hook_mlp_out, hook_embed)."
        ) from None
    if metadata.get("hook_head_index") is not None:
        raise SAEError(
            f"metadata.hook_head_index {metadata['hook_head_index']!r} in {where}: per-head "
            "SAEs are not supported."
        )
    return site


def read_folder(
    path: str | Path, *, device: str | torch.device = "cpu", source: str | None = None
) -> SAE:
    """Read a SAELens SAE folder, checking everything before loading any weight.

    Raises:
        SAEError: a missing folder or file, pickled weights only, a config steerlab does not
            read, or tensors of the wrong names or shapes; the message names which.

    >>> _ = write_folder(sl.load_sae("steerlab-tiny-sae"), "my-sae")
    >>> read_folder("my-sae").d_sae
    512
    """
    folder = Path(path).expanduser()
    if not folder.exists():
        raise SAEError(
            f"No SAE folder at {str(path)!r} (looked for {folder.resolve()}). load_sae takes a "
            "SAELens folder, 'steerlab-tiny-sae', or a release and an sae_id."
        )
    if not folder.is_dir():
        raise SAEError(
            f"{str(path)!r} is a file; load_sae takes a SAELens folder holding {CFG_FILENAME} "
            f"and {WEIGHTS_FILENAME}."
        )
    cfg_path, weights_path = folder / CFG_FILENAME, folder / WEIGHTS_FILENAME
    if not weights_path.is_file():
        pickled = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickled:
            raise SAEError(
                f"{folder} holds pickled weights ({', '.join(pickled)}) and no {WEIGHTS_FILENAME}: "
                "steerlab reads safetensors only and never unpickles. Convert them in a process "
                "you trust (e.g. SAELens: load, then save_model)."
            )
        raise SAEError(
            f"Missing {weights_path}: a SAELens SAE folder holds {CFG_FILENAME} and {WEIGHTS_FILENAME}."
        )
    if not cfg_path.is_file():
        raise SAEError(
            f"Missing {cfg_path}: a SAELens SAE folder holds {CFG_FILENAME} and {WEIGHTS_FILENAME}."
        )
    try:
        cfg = jsontext.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SAEError(f"{cfg_path} is not valid JSON ({error}).") from None
    except jsontext.NestingError as error:
        raise SAEError(f"{cfg_path}: key {error.path!r} is nested more than "
                       f"{error.max_depth} deep; an SAE config is a few levels.") from None  # fmt: skip
    config = parse_config(cfg, str(cfg_path))
    tensors = _read_tensors(weights_path, config, device)
    return config.sae(tensors, str(source if source is not None else path))


def _read_tensors(path: Path, config: Config, device: str | torch.device) -> dict[str, Any]:
    """The weights, each checked by name and shape from the header, cast to the config's dtype.

    SAELens drops a ``scaling_factor`` of all ones (an old format's no-op); so does this.
    """
    expected = config.shapes()
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            names = set(f.keys())
            extra = names - set(expected) - {"scaling_factor"}
            missing = set(expected) - names
            if missing or extra:
                raise SAEError(
                    f"{path} holds {sorted(names)}; a {config.architecture} SAE needs exactly "
                    f"{sorted(expected)}"
                    + (f" (missing {sorted(missing)})" if missing else "")
                    + (f" (unexpected {sorted(extra)})" if extra else "")
                    + "."
                )
            for name, shape in expected.items():
                found = tuple(f.get_slice(name).get_shape())
                if found != shape:
                    raise SAEError(f"{name} in {path} has shape {found}; cfg.json says {shape}.")
            tensors = {name: f.get_tensor(name) for name in names}
    except SafetensorError as error:
        raise SAEError(f"{path} is not a readable safetensors file ({error}).") from None
    scaling = tensors.pop("scaling_factor", None)
    if scaling is not None and not bool(torch.all(scaling == 1)):
        raise SAEError(
            f"{path} holds a scaling_factor that is not all ones; steerlab does not apply one."
        )
    for name, tensor in tensors.items():
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise SAEError(f"{name} in {path} must hold finite floats.")
    return {name: t.to(device=device, dtype=config.dtype) for name, t in tensors.items()}


def config_dict(sae: SAE) -> dict[str, Any]:
    """SAELens's ``cfg.json`` for ``sae``: ``SAEConfig.to_dict()`` plus ``architecture``.

    >>> config_dict(sl.load_sae("steerlab-tiny-sae"))["metadata"]["hook_name"]
    'blocks.2.hook_resid_pre'
    """
    metadata = {**sae.metadata, "hook_name": sae.site, "model_name": sae.model_name,
                "model_config_sha256": sae.model_config_sha256}  # fmt: skip
    if not sae.model_config_sha256:  # unknown: SAELens's own configs have no such key
        del metadata["model_config_sha256"]
    metadata.setdefault("sae_lens_version", SAE_LENS_VERSION)
    cfg: dict[str, Any] = {
        "d_in": sae.d_in,
        "d_sae": sae.d_sae,
        "dtype": DTYPE_NAMES[sae.dtype],
        "device": "cpu",
        "apply_b_dec_to_input": sae.apply_b_dec_to_input,
        "normalize_activations": "none",
        "reshape_activations": "none",
        "metadata": metadata,
        "architecture": sae.architecture,
    }
    if sae.architecture == "topk":
        cfg |= {"k": sae.k, "rescale_acts_by_decoder_norm": sae.rescale_acts_by_decoder_norm}
    return cfg


def write_folder(sae: SAE, path: str | Path) -> Path:
    """Write ``sae`` as a SAELens folder, whole: the old folder stays until the new is ready.

    Everything is checked and encoded first (the metadata as JSON included); the files are
    written to a new folder beside ``path`` and swapped in (``core.atomic.write_folder``),
    so a save that fails leaves an earlier SAE at ``path`` loadable. Other files in the
    folder are kept.

    Raises:
        SAEError: ``path`` is a file, or a metadata value JSON cannot hold (named).

    >>> write_folder(sl.load_sae("steerlab-tiny-sae"), "my-sae")
    PosixPath('my-sae')
    """
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise SAEError(
            f"{str(path)!r} is a file; an SAE is saved as a folder. Nothing was written."
        )
    cfg = _cfg_bytes(sae)
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in sae.tensors().items()}
    atomic.write_folder(folder, {WEIGHTS_FILENAME: save(tensors), CFG_FILENAME: cfg})
    return folder


def _cfg_bytes(sae: SAE) -> bytes:
    """``cfg.json``'s bytes; a metadata value JSON cannot hold is named."""
    cfg = config_dict(sae)
    for key, value in cfg["metadata"].items():
        if not isinstance(key, str):
            raise SAEError(f"SAE metadata key {key!r} is not a string. Nothing was written.")
        try:
            json.dumps(value)
        except (TypeError, ValueError) as error:
            raise SAEError(
                f"SAE metadata {key!r} is {type(value).__name__} {value!r:.60}, which cfg.json "
                f"cannot hold ({error}); make it a str, number, bool, list or dict (e.g. "
                "float(x), sorted(x)). Nothing was written."
            ) from None
    return (json.dumps(cfg, indent=1) + "\n").encode()
