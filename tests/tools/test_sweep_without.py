"""tools/sweep_without.py: a stored sweep without some estimators' runs re-runs exactly those and
keeps every other record, study attributes included."""

import importlib.util
from pathlib import Path

import pytest

from bayesurl.sweeps.storage import SweepStorage

pytest.importorskip("optuna")


def _tool():
    path = Path(__file__).resolve().parents[2] / "tools" / "sweep_without.py"
    spec = importlib.util.spec_from_file_location("sweep_without", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


PLAN = [{"estimator": e, "split": s, "seed": 0} for e in ("ce", "lam_posthoc") for s in (0, 1)]


def _run(store: SweepStorage, tag: str) -> None:
    store.add_runs(PLAN)
    store.work(lambda p: {"estimator": p["estimator"], "split": p["split"], "tag": tag}, wait=False)


def test_dropped_runs_run_again_and_the_others_stay(tmp_path, capsys):
    db = tmp_path / "sweep.db"
    store = SweepStorage(f"sqlite:///{db}", sweep="pretrained")
    store._study.set_user_attr("plan", {"name": "pretrained"})
    _run(store, "old")
    del store
    tool = _tool()
    assert tool.main([str(db), "--estimators", "lam_posthoc", "--dry-run"]) == 0
    assert "kept 2 trials, dropped 2" in capsys.readouterr().out
    assert len(SweepStorage(f"sqlite:///{db}", sweep="pretrained").records()) == 4  # dry run

    assert tool.main([str(db), "--estimators", "lam_posthoc"]) == 0
    store = SweepStorage(f"sqlite:///{db}", sweep="pretrained")
    assert store._study.user_attrs["plan"] == {"name": "pretrained"}
    kept = store.records()
    assert sorted((r["estimator"], r["split"], r["tag"]) for r in kept) == [
        ("ce", 0, "old"),
        ("ce", 1, "old"),
    ]
    _run(store, "new")
    got = sorted((r["estimator"], r["split"], r["tag"]) for r in store.records())
    assert got == [("ce", 0, "old"), ("ce", 1, "old"), ("lam_posthoc", 0, "new"),
                   ("lam_posthoc", 1, "new")]  # fmt: skip
    # nothing to drop: the file is left alone
    before = db.read_bytes()
    assert tool.main([str(db), "--estimators", "hib"]) == 0
    assert db.read_bytes() == before
    assert tool.main([str(tmp_path / "absent.db"), "--estimators", "ce"]) == 2
