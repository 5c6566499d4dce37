"""Dependencies as a library declares them: ranges in the core list, optional backends behind
extras and imported only where they are used, with an error naming the extra to install.

The import checks run in fresh interpreters (what other tests imported does not matter); a
missing package is simulated with ``sys.modules[name] = None``, which makes ``import name``
fail as an absent package does. The slow check at the end installs the oldest allowed
versions of the core list into a new environment and runs the smoke preset.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from bayesurl._optional import EXTRAS

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
CORE = [Requirement(d) for d in PYPROJECT["dependencies"]]
OPTIONAL = PYPROJECT["optional-dependencies"]

#: Modules of the optional packages: ``import bayesurl`` and its public packages load none.
OPTIONAL_MODULES = (
    "laplace",
    "backpack",
    "curvlinops",
    "asdl",
    "asdfghjkl",
    "faiss",
    "optuna",
    "sqlalchemy",
    "psycopg2",
    "nngeometry",
)


#: ``backend=`` of ClassifierLaplace -> (the module it needs, the extra that brings it)
BACKENDS = {"backpack": ("backpack", "backpack"), "curvlinops": ("curvlinops", "curvlinops"),
            "asdl": ("asdl", "asdl")}  # fmt: skip

#: One fresh interpreter for all import checks: what ``import bayesurl`` loads, then, for each
#: backend in turn blocked, the error of ClassifierLaplace and of ``wrap(method="laplace")``
#: (laplace-torch's modules are dropped between turns so that each turn imports it anew).
SCRIPT = """
import json, sys
MODS, BACKENDS = {mods!r}, {backends!r}
import bayesurl, bayesurl.laplace, bayesurl.posthoc, bayesurl.methods, bayesurl.cli
imported = sorted(m for m in sys.modules if m.split('.')[0] in MODS)
from torch import nn
from bayesurl.laplace import ClassifierLaplace

def error(call):
    for m in [m for m in sys.modules if m.split('.')[0] == 'laplace']:
        del sys.modules[m]
    try:
        call()
    except ImportError as exc:
        return str(exc)
    return None

errors, wrapper = {{}}, {{}}
for backend, (module, _) in BACKENDS.items():
    real = sys.modules.pop(module, None)
    sys.modules[module] = None
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    errors[backend] = error(lambda: ClassifierLaplace(net, backend=backend))
    wrapper[backend] = error(lambda: bayesurl.wrap(
        nn.Linear(3, 4), method="laplace", classifier=nn.Linear(4, 2), backend=backend))
    sys.modules.pop(module)
    if real is not None:
        sys.modules[module] = real
print(json.dumps({{"imported": imported, "errors": errors, "wrapper": wrapper}}))
"""


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower()


@pytest.fixture(scope="module")
def imports() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    code = SCRIPT.format(mods=OPTIONAL_MODULES, backends=BACKENDS)
    got = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout.strip().splitlines()[-1])


def test_import_loads_no_optional_backend(imports: dict) -> None:
    assert imports["imported"] == []


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_missing_backend_names_its_extra(imports: dict, backend: str) -> None:
    extra = BACKENDS[backend][1]
    assert extra in OPTIONAL
    for where in ("errors", "wrapper"):
        msg = imports[where][backend]
        assert msg is not None, f"{where}: no ImportError without {backend}"
        assert msg.startswith("ClassifierLaplace") and " needs " in msg, msg
        assert msg.endswith(f"pip install 'bayesurl[{extra}]'"), msg


@pytest.mark.parametrize("module", sorted(EXTRAS))
def test_require_names_the_extra_of_each_optional_module(monkeypatch, module: str) -> None:
    from bayesurl._optional import require

    dist, extra = EXTRAS[module]
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=re.escape(dist)) as info:
        require(module, "this call")
    hint = "pip install --force-reinstall bayesurl" if extra is None else f"bayesurl[{extra}]"
    assert str(info.value).startswith("this call needs") and hint in str(info.value)
    assert extra is None or extra in OPTIONAL


def test_faiss_and_optuna_call_sites_name_their_extra(monkeypatch) -> None:
    import torch

    from bayesurl.search import knn
    from bayesurl.sweeps.storage import require_optuna

    monkeypatch.setitem(sys.modules, "faiss", None)
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(ImportError, match=re.escape("pip install 'bayesurl[faiss]'")):
        knn(torch.randn(6, 3), 2, backend="faiss")
    with pytest.raises(ImportError, match=re.escape("pip install 'bayesurl[sweep]'")):
        require_optuna()


def test_an_unknown_missing_dependency_keeps_its_own_error(monkeypatch) -> None:
    from bayesurl._optional import require

    monkeypatch.setitem(sys.modules, "no_such_module_of_bayesurl", None)
    with pytest.raises(ImportError) as info:
        require("no_such_module_of_bayesurl", "this call")
    assert "bayesurl[" not in str(info.value)


def test_core_list_has_ranges_not_pins() -> None:
    for req in CORE:
        ops = {s.operator for s in req.specifier}
        assert "==" not in ops and "===" not in ops, f"{req}: a pin in the core list"
        assert ">=" in ops, f"{req}: no lower bound"
    torch = next(r for r in CORE if r.name == "torch")
    lower = next(s.version for s in torch.specifier if s.operator == ">=")
    # never ask for a torch newer than the one this project is built and tested on
    assert tuple(int(p) for p in lower.split(".")) <= (2, 14, 1)


def test_curvature_backends_are_not_core() -> None:
    core = {r.name for r in CORE}
    for dist, extra in EXTRAS.values():
        if extra is not None:
            assert dist not in core, f"{dist} is in the core list, not behind [{extra}]"
            assert any(_name(r) == dist for r in OPTIONAL[extra]), f"[{extra}] lacks {dist}"


def test_every_extra_named_in_the_code_exists() -> None:
    named = set()
    for path in (ROOT / "bayesurl").rglob("*.py"):
        named |= set(re.findall(r"bayesurl\[([a-z0-9_,-]+)\]", path.read_text()))
    named |= {e for _, e in EXTRAS.values() if e is not None}
    extras = {e for group in named for e in group.split(",")}
    assert extras, "no extra named in bayesurl/"
    assert extras <= set(OPTIONAL), sorted(extras - set(OPTIONAL))
    # the extras that point at others point at existing ones
    for reqs in OPTIONAL.values():
        for r in reqs:
            if r.startswith("bayesurl["):
                assert set(Requirement(r).extras) <= set(OPTIONAL), r


def test_constraints_pin_what_ci_installs_within_the_ranges() -> None:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    pins = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"constraints.txt: {line} is not an exact pin"
            pins[req.name.lower().replace("_", "-")] = spec.version
    for req in [*CORE, *(Requirement(r) for g in OPTIONAL.values() for r in g)]:
        if req.name == "bayesurl" or (req.marker is not None and not req.marker.evaluate()):
            continue
        key = req.name.lower().replace("_", "-")
        if key in pins:
            assert req.specifier.contains(pins[key], prereleases=True), (
                f"constraints.txt pins {key}=={pins[key]} outside pyproject's {req}"
            )
    for req in CORE:
        if req.marker is None or req.marker.evaluate():
            assert req.name.lower() in pins, f"constraints.txt does not pin {req.name}"
    makefile = (ROOT / "Makefile").read_text()
    assert "CONSTRAINTS := constraints.txt" in makefile and "-c $(CONSTRAINTS)" in makefile


@pytest.mark.slow
def test_oldest_core_versions_run_the_smoke_preset(tmp_path: Path) -> None:
    out = tmp_path / "bounds.json"
    got = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "dependency_bounds.py"), "lower", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    result = json.loads(out.read_text())
    assert got.returncode == 0, result.get("log_tail", got.stdout)
    assert result["estimators_r1"], result
