"""The walk of a run's config through bayesurl, from ``bayesurl run`` and ``bayesurl benchmark``.

Runs both commands in this process on a tiny plan (the ``smoke`` preset, one estimator)
under :func:`sys.setprofile` and follows the calls into bayesurl functions that carry the
run's config: an argument that is a ``RunConfig`` (or one of its sections), a run's
parameters or a config's dict (a mapping with ``estimator`` and ``seed`` or ``data``; not a
run's result row, which carries ``error``), a
sweep's options, the command's parsed arguments, or an argument named ``overrides`` /
``tuned`` / ``recipe_tuned`` (what the config is built from). It prints, per command:

``rooms``
    How many times the walk enters a module: its first, then every change of module between
    consecutive such calls.
``returns``
    How many such calls return.
``modules``
    The modules visited, with the number of such calls in each.
``resolutions``, ``recipe reads``
    Calls of ``load_recipe`` (a recipe resolved into a config) and of ``read_recipe_file``
    (a TOML file parsed), whatever their arguments.

With ``--functions REV [REV ...] --files PATH ...`` it also counts the functions over 80
lines or 12 parameters (``self`` / ``cls`` not counted) of those files at each git revision.
Run from the checkout to measure (it imports the ``bayesurl`` of ``PYTHONPATH``)::

    PYTHONPATH=$PWD python tools/config_walk.py
    python tools/config_walk.py --functions 3a4870c HEAD --files bayesurl/sweeps/sweep.py
"""

from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import io
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NAMED = ("overrides", "tuned", "recipe_tuned")


def _carries_config(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, types):
        return True
    if isinstance(value, Mapping):
        # a run's result row names its estimator and seed too, but carries its outcome
        # (``error``) and no settings: the walk follows the settings, not the results
        return (
            "estimator" in value and ("seed" in value or "data" in value) and "error" not in value
        )
    if isinstance(value, argparse.Namespace):
        return hasattr(value, "overrides")
    return False


def walk(argv: list[str]) -> dict[str, Any]:
    """Rooms, returns and modules of the config's walk through ``bayesurl <argv>``."""
    import bayesurl
    from bayesurl.cli import main
    from bayesurl.runs import config as rc
    from bayesurl.sweeps import sweep

    types: tuple[type, ...] = (
        rc.RunConfig,
        rc.DataConfig,
        rc.BackboneConfig,
        rc.TrainConfig,
        rc.EvalConfig,
        rc.EstimatorConfig,
    )
    if hasattr(sweep, "SweepOptions"):
        types = (*types, sweep.SweepOptions)
    package = str(Path(bayesurl.__file__).parent)
    tracked: set[int] = set()
    path: list[str] = []
    returns = 0
    counted = collections.Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal returns
        if event == "return":
            if id(frame) in tracked:
                tracked.discard(id(frame))
                returns += 1
            return
        if event != "call" or not frame.f_code.co_filename.startswith(package):
            return
        code = frame.f_code
        if code.co_name in ("load_recipe", "read_recipe_file"):
            counted[code.co_name] += 1
        n = code.co_argcount + code.co_kwonlyargcount
        n += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)  # *args, **kwargs
        local = frame.f_locals
        for name in code.co_varnames[:n]:
            value = local.get(name)
            if name in NAMED and value is not None:
                break
            if isinstance(value, (tuple, list)) and value and name in ("args", "kwargs"):
                if any(_carries_config(v, types) for v in value):
                    break
            elif isinstance(value, dict) and name == "kwargs":
                if any(_carries_config(v, types) or k in NAMED for k, v in value.items()):
                    break
            elif _carries_config(value, types):
                break
        else:
            return
        tracked.add(id(frame))
        path.append(str(frame.f_globals.get("__name__")))

    sink = io.StringIO()
    sys.setprofile(profile)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            rc_ = main(argv)
    finally:
        sys.setprofile(None)
    rooms = sum(1 for a, b in zip(path, path[1:]) if a != b) + bool(path)
    return {
        "exit": rc_,
        "rooms": rooms,
        "returns": returns,
        "calls": len(path),
        "modules": collections.Counter(path),
        "resolutions": counted["load_recipe"],
        "reads": counted["read_recipe_file"],
    }


def functions(rev: str, files: list[str]) -> list[tuple[str, int, int]]:
    """``(file:function, lines, parameters)`` over 80 lines or 12 parameters at ``rev``."""
    out = []
    for f in files:
        try:
            text = subprocess.run(
                ["git", "show", f"{rev}:{f}"], cwd=ROOT, check=True, capture_output=True, text=True
            ).stdout
        except subprocess.CalledProcessError:
            continue  # not in that revision
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
                names = [p.arg for p in params if p.arg not in ("self", "cls")]
                n_params = len(names) + (a.vararg is not None) + (a.kwarg is not None)
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 80 or n_params > 12:
                    out.append((f"{f}:{node.name}", lines, n_params))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--functions", nargs="+", metavar="REV", help="git revisions to count at")
    ap.add_argument("--files", nargs="+", default=[], help="files whose functions are counted")
    args = ap.parse_args()
    if args.functions:
        for rev in args.functions:
            found = functions(rev, args.files)
            print(f"functions over 80 lines or 12 parameters at {rev}: {len(found)}")
            for name, lines, n in sorted(found):
                print(f"  {name}: {lines} lines, {n} parameters")
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        commands = {
            "bayesurl run": [
                "run", "fashion_mnist/ce", "--preset", "smoke", "--device", "cpu",
                "--out", f"{tmp}/run",
            ],
            "bayesurl benchmark": [
                "benchmark", "--preset", "smoke", "--methods", "ce", "--device", "cpu",
                "--out", f"{tmp}/bench", "--no-progress",
            ],
            "bayesurl benchmark, 2 estimators x 2 seeds": [
                "benchmark", "--preset", "smoke", "--methods", "ce,pvu", "--seeds", "2",
                "--device", "cpu", "--out", f"{tmp}/bench2", "--no-progress",
            ],
        }  # fmt: skip
        for title, argv in commands.items():
            res = walk(argv)
            shown = " ".join(a for a in argv if not a.startswith(tmp))
            print(f"{title} ({shown}):")
            print(
                f"  rooms {res['rooms']}, returns {res['returns']} "
                f"(calls {res['calls']}; exit {res['exit']}); resolutions {res['resolutions']}, "
                f"recipe reads {res['reads']}"
            )
            for mod, n in sorted(res["modules"].items(), key=lambda kv: -kv[1]):
                print(f"    {mod}: {n}")


if __name__ == "__main__":
    main()
