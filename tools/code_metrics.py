"""Line counts and the largest functions (without docstrings) of packages at a git revision.

Reads the files from git (``git ls-tree`` / ``git show``), so any commit can be measured
without checking it out::

    python tools/code_metrics.py aa72c81 HEAD --packages runs training evaluation
"""

from __future__ import annotations

import argparse
import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def measure(rev: str, package: str, top: int = 10) -> tuple[int, int, list[tuple[int, str]]]:
    """``(files, lines, [(lines, "module:function"), ...])`` of ``bayesurl/<package>``."""
    paths = [
        p
        for p in _git("ls-tree", "-r", "--name-only", rev, f"bayesurl/{package}").split()
        if p.endswith(".py")
    ]
    total, funcs = 0, []
    for p in paths:
        text = _git("show", f"{rev}:{p}")
        total += text.count("\n")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                doc = node.body[0] if node.body else None
                if (
                    isinstance(doc, ast.Expr)
                    and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)
                ):  # the docstring is documentation, not the function's size
                    n -= (doc.end_lineno or doc.lineno) - doc.lineno + 1
                funcs.append((n, f"{Path(p).stem}:{node.name}"))
    return len(paths), total, sorted(funcs, reverse=True)[:top]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revisions", nargs="+")
    ap.add_argument("--packages", nargs="+", default=["runs", "training", "evaluation"])
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args()
    for package in args.packages:
        for rev in args.revisions:
            files, lines, funcs = measure(rev, package, args.top)
            print(f"bayesurl/{package} @ {rev}: {files} files, {lines} lines")
            print("  " + ", ".join(f"{name} {n}" for n, name in funcs))


if __name__ == "__main__":
    main()
