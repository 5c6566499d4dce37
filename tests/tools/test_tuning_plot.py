"""tools/tuning_plot.py: one panel per tuned estimator from a sweep storage."""

import importlib.util
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")
ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("tuning_plot", ROOT / "tools" / "tuning_plot.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_plot_reads_the_studies_of_one_sweep(tmp_path):
    tool = _tool()
    url = f"sqlite:///{tmp_path / 't.db'}"
    for name, key in (("tune:s:ce", "train.lr"), ("tune:s:pvu", "estimator.fit.lr"),
                      ("tune:other:ce", "train.lr")):  # fmt: skip
        study = optuna.create_study(study_name=name, storage=url, direction="maximize")
        study.optimize(lambda t, key=key: -abs(t.suggest_float(key, 1e-4, 1e-2, log=True) - 3e-3),
                       n_trials=4)  # fmt: skip
    assert sorted(tool.studies(url, "s")) == ["ce", "pvu"]
    assert tool.default_rate("ce", "train.lr", "fashion_mnist") == pytest.approx(1e-3)
    assert tool.default_rate("pvu", "estimator.fit.lr", "fashion_mnist") == pytest.approx(1e-3)
    out = tool.plot(url, "s", tmp_path / "p.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="no tuning studies of sweep 'nope'"):
        tool.plot(url, "nope", tmp_path / "q.png")
