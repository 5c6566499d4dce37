"""Start-up cost of ``bayesurl evaluate``: the npz path never imports torchmetrics,
torchvision, scikit-learn, scipy, optuna, timm or matplotlib, while every public name of
:mod:`bayesurl.evaluation` still resolves (lazily) to the object of its defining module.

Each check runs in a fresh interpreter, so what other tests imported does not matter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

#: third-party packages the npz evaluation does not need
HEAVY = ("torchmetrics", "torchvision", "sklearn", "scipy", "optuna", "timm", "matplotlib")


def _fresh(code: str) -> dict:
    """Run ``code`` in a new interpreter (this checkout first on the path); it prints JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_evaluate_command_imports_no_heavy_package(tmp_path) -> None:
    g = np.random.default_rng(0)
    path = tmp_path / "x.npz"
    np.savez(
        path,
        embeddings=g.normal(size=(40, 6)).astype(np.float32),
        labels=np.arange(40) % 4,
        uncertainties=g.random(40),
        samples=g.normal(size=(3, 40, 6)).astype(np.float32),
        ood_uncertainties=g.random(7),
    )
    got = _fresh(
        f"HEAVY, PATH = {HEAVY!r}, {str(path)!r}\n"
        "import io, json, sys, contextlib\n"
        "import bayesurl.commands.evaluate, bayesurl.evaluation\n"
        "after_import = sorted(m for m in sys.modules if m.split('.')[0] in HEAVY)\n"
        "from bayesurl.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    code = main(['evaluate', PATH])\n"
        "after_run = sorted(m for m in sys.modules if m.split('.')[0] in HEAVY)\n"
        "print(json.dumps({'import': after_import, 'run': after_run, 'code': code,\n"
        "                  'table': out.getvalue()}))"
    )
    assert got["code"] == 0 and "r@1" in got["table"] and "ece" in got["table"]
    assert got["import"] == [], got["import"]
    assert got["run"] == [], got["run"]


def test_lazy_names_resolve_to_their_modules() -> None:
    got = _fresh(
        "import json, sys\n"
        "import bayesurl.evaluation as E\n"
        "before = 'torchmetrics' in sys.modules\n"
        "from bayesurl.evaluation import RetrievalECE, plot_roc\n"
        "import bayesurl.evaluation.metrics as M, bayesurl.evaluation.plots as P\n"
        "same = [getattr(E, n) is getattr(M if hasattr(M, n) else P, n)\n"
        "        for n in ('AUSC', 'AUSE', 'OODAUPRC', 'OODAUROC', 'RAUROC', 'MAPAtK',\n"
        "                  'RecallAtK', 'RetrievalECE', 'plot_roc', 'plot_recall_vs_rauroc',\n"
        "                  'plot_reliability_diagram', 'plot_sparsification_curve')]\n"
        "missing = [n for n in E.__all__ if not hasattr(E, n)]\n"
        "try:\n"
        "    E.no_such_name\n"
        "    err = ''\n"
        "except AttributeError as exc:\n"
        "    err = str(exc)\n"
        "print(json.dumps({'before': before, 'same': same, 'missing': missing, 'err': err,\n"
        "                  'dir': sorted(set(E.__all__) - set(dir(E))),\n"
        "                  'after': 'torchmetrics' in sys.modules}))"
    )
    assert got["before"] is False and got["after"] is True
    assert all(got["same"]) and len(got["same"]) == 12
    assert got["missing"] == [] and got["dir"] == []
    assert "no_such_name" in got["err"]
