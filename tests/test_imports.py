"""The package has no import circle and no upward import.

Two independent checks:

- **Runtime**: one fresh interpreter imports every module of ``bayesurl`` on its own, with
  every ``bayesurl`` module removed from ``sys.modules`` before each import (third-party
  packages stay loaded, for speed). A circle that breaks some import order fails here, as
  does a module that pulls in a higher layer (``runs`` / ``commands`` / ``cli``) at import.
- **Static**: the import graph of the source files (every ``import`` statement, including
  the lazy ones inside functions) has no strongly connected component and no edge from a
  lower layer to a higher one.

Modules are found on disk, so the test adapts to packages being added (``bayesurl.runs``)
or removed.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "bayesurl"

#: layer of each top-level part of the package, bottom (0) to top; an import may only go to
#: the same or a lower layer. Parts not listed are only held to the rules on runs / commands.
LAYERS: dict[str, int] = {
    "_checks": 0,
    "_modules": 0,
    "_optional": 0,
    "files": 0,
    "types": 0,
    "uncertainty": 0,
    "distributed": 0,
    "registry": 0,
    "database": 0,
    "backbones": 1,
    "data": 1,
    "distributions": 1,
    "search": 1,
    "stats": 1,
    "evaluation": 2,
    "features": 2,
    "heads": 3,
    "losses": 4,
    "methods": 5,
    "laplace": 6,
    "posthoc": 6,
    "training": 6,
    "experiments": 7,
    "runs": 8,
    "sweeps": 9,
    "folder": 9,
    "benchmark": 8,
    "recipes": 8,
    "report": 10,
    "commands": 10,
    "cli": 11,
    "__main__": 12,
}
#: the drivers: no library module below them may import these, not even lazily
DRIVERS = (
    "runs",
    "sweeps",
    "folder",
    "benchmark",
    "recipes",
    "report",
    "commands",
    "cli",
    "__main__",
)
#: known upward imports, each with the change that removes it
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file of the package."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _part(module: str) -> str:
    """Top-level part of the package: ``bayesurl.methods.ce`` -> ``methods``."""
    return module.split(".")[1] if "." in module else module


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module-level import edges. Package faces (``__init__``) are not nodes: they only hand
    names on, so an import through one counts for the module it names, if it is one."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = defaultdict(set)
    for mod, path in mods.items():
        if path.name == "__init__.py":
            continue
        pkg = mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                continue
            for t in targets:
                if t == "bayesurl" or t.startswith("bayesurl."):
                    r = resolve(t)
                    if r and r != mod and mods[r].name != "__init__.py":
                        edges[mod].add(r)
    return edges


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    nodes = sorted(set(edges) | {w for ws in edges.values() for w in ws})
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _upward(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Edges from a lower layer to a higher one, and any library edge into the drivers."""
    bad = set()
    for a, targets in edges.items():
        pa = _part(a)
        for b in targets:
            pb = _part(b)
            if pa == pb:
                continue
            if pa in LAYERS and pb in LAYERS and LAYERS[pa] < LAYERS[pb]:
                bad.add((a, b))
            elif pb in DRIVERS and pa not in DRIVERS:
                bad.add((a, b))
    return bad


# -- the checkers find what they must (references: hand-made graphs) -------------------------
def test_circle_finder_on_hand_made_graphs():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": {"e"}}
    assert sorted(_circles(g)) == [["a", "b", "c"], ["e", "e2"]]
    assert _circles({"a": {"b"}, "b": {"c"}}) == []


def test_upward_finder_on_hand_made_edges():
    edges = {
        "bayesurl.data.base": {"bayesurl.methods.base", "bayesurl._checks"},
        "bayesurl.methods.ce": {"bayesurl.runs.runner", "bayesurl.heads.classifier"},
        "bayesurl.newpart.x": {"bayesurl.commands.train", "bayesurl.search.exact"},
        "bayesurl.commands.train": {"bayesurl.runs.runner"},
    }
    assert _upward(edges) == {
        ("bayesurl.data.base", "bayesurl.methods.base"),
        ("bayesurl.methods.ce", "bayesurl.runs.runner"),
        ("bayesurl.newpart.x", "bayesurl.commands.train"),
    }


def test_every_part_of_the_package_has_a_layer():
    parts = {_part(m) for m in _modules() if m != "bayesurl"}
    assert parts <= set(LAYERS), f"give {sorted(parts - set(LAYERS))} a layer in LAYERS"


# -- the package ---------------------------------------------------------------------------
def test_no_import_circle():
    circles = _circles(_edges(_modules()))
    assert circles == [], "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_no_upward_import():
    bad = _upward(_edges(_modules())) - set(KNOWN_UPWARD)
    assert bad == set(), "upward imports: " + ", ".join(f"{a} -> {b}" for a, b in sorted(bad))


def test_known_upward_imports_are_gone():
    left = _upward(_edges(_modules())) & set(KNOWN_UPWARD)
    assert not left, "; ".join(KNOWN_UPWARD[e] for e in sorted(left))


_ISOLATED = r"""
import importlib, json, sys, traceback
names, drivers, lowest = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
report = {}
for name in names:
    for key in [k for k in sys.modules if k == "bayesurl" or k.startswith("bayesurl.")]:
        del sys.modules[key]
    try:
        importlib.import_module(name)
    except BaseException:
        report[name] = {"error": traceback.format_exc(limit=4)}
        continue
    part = name.split(".")[1] if "." in name else name
    loaded = sorted(k for k in sys.modules if k.startswith("bayesurl."))
    if part not in drivers:
        up = [k for k in loaded if k.split(".")[1] in drivers]
        if up:
            report[name] = {"loads": up}
    if part in lowest:
        up = [k for k in loaded if k.split(".")[1] in ("methods", "training")]
        if up:
            report[name] = {"loads": up}
print(json.dumps(report))
"""


def test_every_module_imports_alone_in_a_fresh_interpreter():
    names = sorted(m for m in _modules() if not m.endswith("__main__"))
    lowest = ["data", "distributions", "evaluation"]  # know nothing of methods / training
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _ISOLATED,
            json.dumps(names),
            json.dumps(list(DRIVERS)),
            json.dumps(lowest),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {}, json.dumps(report, indent=1)[:6000]
    assert len(names) > 50  # the walk found the package
