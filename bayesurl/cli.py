"""The ``bayesurl`` command.

Each subcommand lives in its own module under :mod:`bayesurl.commands` and exposes

- ``HELP: str`` -- one line for ``bayesurl --help``;
- ``add_arguments(parser: argparse.ArgumentParser) -> None``;
- ``run(args: argparse.Namespace) -> int`` -- the exit status.

Modules are discovered, so adding a subcommand touches no other file.

User errors: a subcommand reports bad input by raising :class:`ValueError`,
:class:`TypeError`, :class:`FileNotFoundError` (or any :class:`OSError`, :class:`KeyError`,
or :class:`UsageError`); :func:`main` prints it as **one line** on stderr,
``bayesurl COMMAND: error: MESSAGE``, and exits with status 2 -- no traceback. ``--debug``
(before or after the subcommand) re-raises instead, with the full traceback. Argument-parsing
errors take the same one-line form. The validators the commands use to check their input before
any work starts live in :mod:`bayesurl._checks` (``check_device``, ``check_output_dir``,
``check_output_file``, ``check_input_file``, ``check_int`` ...).

Help texts are the subcommand modules' docstrings, turned from reStructuredText into plain text
by :class:`PlainHelpFormatter`: cross-reference roles and double back-quotes are removed, a
literal-block marker (a line ending in two colons) becomes one colon followed by its indented
block, and paragraphs are re-wrapped to the terminal.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import pkgutil
import re
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, NoReturn

import bayesurl.commands as _commands
from bayesurl.distributed import RankFailedError

__all__ = [
    "PlainHelpFormatter",
    "UsageError",
    "build_parser",
    "console_main",
    "main",
    "rst_to_text",
]

#: exceptions that :func:`main` reports as a one-line user error (exit status 2)
USER_ERRORS: tuple[type[BaseException], ...]


class UsageError(Exception):
    """A user error that is neither a bad value nor a missing file (one line, exit 2)."""


USER_ERRORS = (UsageError, ValueError, TypeError, OSError, KeyError, ImportError, RankFailedError)

_ROLE = re.compile(r":[a-zA-Z:]+:`([^`]*)`")
_LITERAL = re.compile(r"``([^`]*)``")
_BULLET = re.compile(r"^(\s*)([-*]|\d+[.)])\s+")


def _role_text(match: re.Match[str]) -> str:
    text = match.group(1)
    explicit = re.fullmatch(r"\s*(.*?)\s*<[^>]*>\s*", text, flags=re.S)
    if explicit:  # :ref:`title <target>` -> title
        return explicit.group(1)
    text = text.lstrip("!")
    if text.startswith("~"):  # :func:`~a.b.c` -> c
        return text[1:].rsplit(".", 1)[-1]
    return text


def rst_inline(text: str) -> str:
    """Strip inline reStructuredText markup: roles, double back-quotes, ``\\`` escapes."""
    text = _ROLE.sub(_role_text, text)
    text = _LITERAL.sub(r"\1", text)
    text = re.sub(r"(?<!`)`([^`]+)`_?(?!`)", r"\1", text)
    return text.replace("\\\\", "\\")


def rst_to_text(doc: str, width: int = 88) -> str:
    """Turn a reStructuredText docstring into plain text wrapped to ``width`` columns.

    Paragraphs are re-filled, bullet items keep a hanging indent, literal blocks (after a line
    ending in ``::``) and other indented blocks are kept verbatim, and inline markup is removed
    (:func:`rst_inline`). Used for every ``bayesurl ... --help`` text.
    """
    lines = textwrap.dedent(doc or "").strip("\n").splitlines()
    # a docstring's first line is not indented while the rest is: dedent the rest on its own
    if len(lines) > 1:
        lines = [lines[0].strip(), *textwrap.dedent("\n".join(lines[1:])).splitlines()]
    blocks: list[list[str]] = [[]]
    for line in lines:
        if line.strip():
            blocks[-1].append(line.rstrip())
        elif blocks[-1]:
            blocks.append([])
    out: list[str] = []
    literal = False
    for block in blocks:
        if not block:
            continue
        indented = block[0].startswith((" ", "\t"))
        if literal and indented:
            out.append("\n".join(block))
            continue
        literal = False
        if indented and not _BULLET.match(block[0]):
            out.append("\n".join(rst_inline(b) for b in block))
            continue
        if block[-1].endswith("::"):
            literal = True
            block = [
                *block[:-1],
                block[-1][:-2].rstrip() + (":" if block[-1].strip() != "::" else ""),
            ]
            block = [b for b in block if b.strip()]
            if not block:
                continue
        items: list[list[str]] = []
        for b in block:
            if _BULLET.match(b) or not items:
                items.append([b])
            else:
                items[-1].append(b)
        paras = []
        for item in items:
            m = _BULLET.match(item[0])
            text = rst_inline(" ".join(s.strip() for s in item))
            if m:
                lead = m.group(1)
                hang = lead + " " * (len(m.group(0)) - len(lead))
                paras.append(
                    textwrap.fill(
                        text,
                        width,
                        initial_indent=lead,
                        subsequent_indent=hang,
                        break_on_hyphens=False,
                    )
                )
            else:
                paras.append(textwrap.fill(text, width, break_on_hyphens=False))
        out.append("\n".join(paras))
    return "\n\n".join(out)


class PlainHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help formatter that shows reStructuredText docstrings as wrapped plain text."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        body = rst_to_text(text, max(width - len(indent), 20))
        return "\n".join(indent + line if line else "" for line in body.splitlines())

    def _split_lines(self, text: str, width: int) -> list[str]:
        return super()._split_lines(rst_inline(text), width)


class _Parser(argparse.ArgumentParser):
    """Argument parser whose errors are one line: ``PROG: error: MESSAGE (see PROG --help)``."""

    def error(self, message: str) -> NoReturn:
        msg = " ".join(str(message).split())
        self.exit(2, f"{self.prog}: error: {msg} (see {self.prog} --help)\n")


def _device_arg(text: str) -> str:
    """``--device`` of every subcommand: parsed and checked on this machine before any work."""
    from bayesurl._checks import check_device

    try:
        check_device(text, "--device")
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("`--device` ", "", 1)) from None
    return text


def _path_arg(check: Any, option: str) -> Any:
    def convert(text: str) -> str:
        try:
            check(text, option)
        except (ValueError, TypeError) as exc:
            raise argparse.ArgumentTypeError(str(exc).replace(f"`{option}` ", "", 1)) from None
        return text

    return convert


def _validate_common_options(parser: argparse.ArgumentParser, mod: object) -> None:
    """Attach the shared validators while parsing, before any work starts.

    - ``--device`` (every subcommand): unparsable names and devices this machine lacks
      (``bogus``, ``cuda`` without CUDA) are argument errors, not a traceback after the data
      were loaded.
    - the options a subcommand module lists in ``OUTPUT_DIRS`` / ``OUTPUT_FILES`` (argparse
      ``dest`` names) are checked with :func:`bayesurl._checks.check_output_dir` /
      :func:`~bayesurl._checks.check_output_file`: ``--out`` naming a file, ``--json`` naming
      a folder or an unwritable place fail before the first epoch, not after it.
    """
    from bayesurl._checks import check_output_dir, check_output_file

    dirs = set(getattr(mod, "OUTPUT_DIRS", ()))
    files = set(getattr(mod, "OUTPUT_FILES", ()))
    for action in parser._actions:
        if action.type is not None or not action.option_strings:
            continue
        option = action.option_strings[-1]
        if action.dest == "device":
            action.type = _device_arg
        elif action.dest in dirs:
            action.type = _path_arg(check_output_dir, option)
        elif action.dest in files:
            action.type = _path_arg(check_output_file, option)


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

    parser = _Parser(
        prog="bayesurl",
        description="Uncertainty-aware representation learning and Bayesian metric learning.",
        formatter_class=PlainHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"bayesurl {__version__}")
    debug_help = "show the full traceback of an error instead of one line"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, mod in _subcommands().items():
        p = sub.add_parser(
            name, help=mod.HELP, description=mod.__doc__, formatter_class=PlainHelpFormatter
        )
        mod.add_arguments(p)
        _validate_common_options(p, mod)
        # also accepted after the subcommand; SUPPRESS keeps a top-level --debug
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
        p.set_defaults(_run=mod.run)
    return parser


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and len(exc.args) == 1:
        text = str(exc.args[0])
    elif isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        text = f"{exc.strerror}: {exc.filename!r}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bayesurl`` console script.

    Returns the subcommand's exit status; a user error (``USER_ERRORS``) prints one line on
    stderr and returns 2 (with ``--debug`` it is raised, traceback and all). Argument errors
    exit with status 2 through :class:`SystemExit`, also as one line.
    """
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except USER_ERRORS as exc:
        if getattr(args, "debug", False):
            raise
        print(f"bayesurl {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if getattr(args, "debug", False):
            raise
        print(f"bayesurl {args.command}: interrupted", file=sys.stderr)
        return 130


def console_main() -> NoReturn:
    """Entry point of the ``bayesurl`` console script and of ``python -m bayesurl``.

    :func:`main`, then exit. Before the interpreter shuts down, :func:`gc.freeze` moves every
    live object into the collector's permanent generation, so the final garbage collections
    of the shutdown do not walk torch's ~180,000 objects, a large share of a short command's
    exit (measured in ``python -c "import torch"``: about a quarter of its time).
    ``atexit`` handlers, ``weakref.finalize`` callbacks and stream flushes still run; only
    cyclic garbage left at exit is not collected, which the operating system reclaims.
    """
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    console_main()
