"""Install bayesurl into a fresh virtual environment at one end of its declared version ranges
and run the smoke benchmark there.

    python tools/dependency_bounds.py lower     # every core dependency at its lower bound
    python tools/dependency_bounds.py upper     # the newest versions the ranges allow

``lower`` pins each requirement of pyproject's core list (``[project] dependencies``, the
markers of this interpreter applied) to the version of its ``>=`` bound; ``upper`` lets pip
choose the newest allowed (where a machine caps a package, such as torch from local disk, the
cap wins and the file says which version ran). The package is installed from this checkout,
not in editable mode, with its core list only (no extra), and ``bayesurl benchmark --preset
smoke`` runs from an empty folder outside the checkout, so that what runs is the installed
package with exactly those versions.

Writes ``results/benchmarks/dependency_bounds_<bound>.json``: the requested pins, the versions
installed (``pip freeze``), the benchmark's exit status, its estimators and their R@1, the
time taken, the interpreter and the processor. Exit status 1 when the install or the benchmark
fails. Slow (minutes: the install downloads numpy, scipy, matplotlib, ...): never in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def core_requirements() -> list[Requirement]:
    """pyproject's core list, those whose marker holds for this interpreter."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    reqs = [Requirement(d) for d in deps]
    return [r for r in reqs if r.marker is None or r.marker.evaluate()]


def lower_pins(reqs: list[Requirement]) -> list[str]:
    """``name==V`` for each requirement's ``>=V`` bound (an error when one has none)."""
    pins = []
    for r in reqs:
        lows = [s.version for s in r.specifier if s.operator == ">="]
        if len(lows) != 1:
            raise SystemExit(f"{r}: no single `>=` lower bound to pin")
        pins.append(f"{r.name}=={lows[0]}")
    return pins


def _run(cmd: list[str], log: Path, **kwargs: Any) -> int:
    print("+", " ".join(cmd), flush=True)
    with open(log, "a") as fh:
        fh.write("+ " + " ".join(cmd) + "\n")
        fh.flush()
        return subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, **kwargs).returncode


#: Prints ``{estimator: R@1}`` of the ``results.json`` named by its argument, read by the
#: bayesurl installed in the environment (the one reader of its layout).
_READ_R1 = (
    "import json, sys; from bayesurl.sweeps.report import read_results; "
    "runs = read_results(sys.argv[1], detail=False)['runs']; "
    "print(json.dumps({r['estimator']: r.get('r@1') for r in runs}))"
)


def _rows(py: Path, out: Path, env: dict[str, str]) -> dict[str, float | None]:
    """The estimators of the benchmark's ``results.json`` and their R@1."""
    path = next(out.rglob("results.json"), None)
    if path is None:
        return {}
    proc = subprocess.run([str(py), "-c", _READ_R1, str(path)], capture_output=True, text=True,
                          env=env)  # fmt: skip
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


def check(bound: str, work: Path, log: Path) -> dict[str, Any]:
    """Build the environment for ``bound`` in ``work``, run the smoke preset, report."""
    reqs = core_requirements()
    pins = lower_pins(reqs) if bound == "lower" else []
    venv = work / "venv"
    py = venv / "bin" / "python"
    t0 = time.perf_counter()
    status = _run([sys.executable, "-m", "venv", str(venv)], log)
    constraints = work / "pins.txt"
    constraints.write_text("".join(p + "\n" for p in pins))
    if status == 0:
        status = _run(
            [str(py), "-m", "pip", "install", "-q", "-c", str(constraints), str(ROOT)], log
        )
    install_s = time.perf_counter() - t0
    freeze = subprocess.run(
        [str(py), "-m", "pip", "freeze"], capture_output=True, text=True
    ).stdout.split()
    result: dict[str, Any] = {
        "bound": bound,
        "requested": pins or [str(r) for r in reqs],
        "installed": [line for line in freeze if not line.startswith("bayesurl")],
        "install_status": status,
        "install_seconds": round(install_s, 1),
        "python": platform.python_version(),
        "cpu": _cpu(),
        "command": "bayesurl benchmark --preset smoke",
    }
    if status != 0:
        return result
    out = work / "smoke"
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": ""}
    t1 = time.perf_counter()
    status = _run(
        [str(venv / "bin" / "bayesurl"), "benchmark", "--preset", "smoke", "--out", str(out)],
        log,
        cwd=work,
        env=env,
    )
    result.update(
        benchmark_status=status,
        benchmark_seconds=round(time.perf_counter() - t1, 1),
        estimators_r1=_rows(py, out, env),
    )
    return result


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bound", choices=("lower", "upper"))
    parser.add_argument(
        "--work", type=Path, default=None, help="folder for the environment (default: temporary)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result file (default results/benchmarks/dependency_bounds_<bound>.json)",
    )
    args = parser.parse_args(argv)
    out = args.out or ROOT / "results" / "benchmarks" / f"dependency_bounds_{args.bound}.json"
    with tempfile.TemporaryDirectory(prefix="bayesurl-bounds-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        log = work / "log.txt"
        print(f"log: {log}", flush=True)
        result = check(args.bound, work, log)
        if result["install_status"] != 0 or result.get("benchmark_status", 1) != 0:
            result["log_tail"] = log.read_text()[-4000:]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(result, indent=1) + "\n")
    tmp_out.replace(out)
    print(json.dumps({k: v for k, v in result.items() if k != "installed"}, indent=1))
    return 0 if result["install_status"] == 0 and result.get("benchmark_status") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
