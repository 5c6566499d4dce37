"""The ``bayesurl`` command.

Each subcommand lives in its own module under :mod:`bayesurl.commands` and exposes

- ``HELP: str`` -- one line for ``bayesurl --help``;
- ``add_arguments(parser: argparse.ArgumentParser) -> None``;
- ``run(args: argparse.Namespace) -> int`` -- the exit status.

Modules are discovered, so adding a subcommand touches no other file.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

import bayesurl.commands as _commands


def _subcommands() -> dict[str, object]:
    mods = {}
    for info in sorted(pkgutil.iter_modules(_commands.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        mods[info.name.replace("_", "-")] = importlib.import_module(
            f"bayesurl.commands.{info.name}"
        )
    return mods


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (used by ``main`` and by the docs)."""
    from bayesurl import __version__

    parser = argparse.ArgumentParser(
        prog="bayesurl",
        description="Uncertainty-aware representation learning and Bayesian metric learning.",
    )
    parser.add_argument("--version", action="version", version=f"bayesurl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, mod in _subcommands().items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.__doc__)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bayesurl`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"bayesurl {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
