"""Search spaces declared beside the estimator tables ([tune.<name>] in the base table of
estimators) give the spaces the committed searches and tuned tables were made with."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from bayesurl.runs.config import list_recipes, read_recipe_file
from bayesurl.sweeps.tuning import TUNE_SPACES, load_tune_spaces, search_space

ROOT = Path(__file__).resolve().parents[2]

#: The spaces as they were written in Python before they moved to the TOML (URL appendix B).
OLD_TUNE_SPACES = {
    "_default": {"train.lr": ("log", 1e-4, 1e-2)},
    "infonce": {"estimator.kwargs.inverse_temperature": ("float", 8.0, 64.0)},
    "mcinfonce": {"estimator.kwargs.inverse_temperature": ("float", 8.0, 64.0)},
    "losspred": {"estimator.kwargs.lam": ("log", 1e-3, 1.0)},
    "mcdropout": {"estimator.kwargs.p": ("float", 0.05, 0.5)},
}


def _old_search_space(estimator: str, table: dict) -> dict:
    kind = str(table.get("kind", "method")).lower()
    if kind == "baseline":
        return {}
    if kind == "posthoc":
        return {"estimator.fit.lr": ("log", 1e-4, 1e-2)} if "lr" in (table.get("fit") or {}) else {}
    return {**OLD_TUNE_SPACES["_default"], **OLD_TUNE_SPACES.get(estimator, {})}


def test_loaded_spaces_equal_the_old_dict() -> None:
    assert TUNE_SPACES == OLD_TUNE_SPACES
    # the key order is the order Optuna suggests them in (the TPE draws follow it)
    for name, space in OLD_TUNE_SPACES.items():
        assert list(TUNE_SPACES[name]) == list(space)


@pytest.mark.parametrize("dataset", list_recipes())
def test_every_recipe_estimator_gets_the_old_space(dataset: str) -> None:
    tables = read_recipe_file(dataset)["estimators"]
    for name, table in tables.items():
        got = search_space(name, table)
        assert got == _old_search_space(name, table), f"{dataset}/{name}"
        assert list(got) == list(_old_search_space(name, table))


def test_committed_searches_used_these_spaces() -> None:
    """Each study of the committed tuning storage searched exactly ``search_space``."""
    db = ROOT / "results/pretrained/tuning/tune.db"
    tables = read_recipe_file("fashion_mnist")["estimators"]
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = con.execute(
        "select distinct s.study_name, p.param_name, p.distribution_json from trial_params p "
        "join trials t on p.trial_id = t.trial_id join studies s on s.study_id = t.study_id"
    ).fetchall()
    con.close()
    searched: dict[str, dict] = {}
    for study, key, dist in rows:
        a = json.loads(dist)["attributes"]
        kind = "log" if a["log"] else "float"
        searched.setdefault(study.rsplit(":", 1)[1], {})[key] = (kind, a["low"], a["high"])
    assert len(searched) >= 15
    for est, space in searched.items():
        assert search_space(est, tables[est]) == space, est


@pytest.mark.parametrize(
    "path",
    [
        "results/pretrained/tuning/tuned.json",
        "results/pretrained/tuning_6_8/tuned.json",
        "results/sweeps/tune_demo/tuned.json",
    ],
)
def test_committed_tuned_tables_lie_in_the_spaces(path: str) -> None:
    tables = read_recipe_file("fashion_mnist")["estimators"]
    for est, row in json.loads((ROOT / path).read_text()).items():
        space = search_space(est, tables[est])
        assert set(row.get("params") or {}) <= set(space), est
        for key, value in (row.get("params") or {}).items():
            _, lo, hi = space[key]
            assert lo <= value <= hi, (est, key)


BASE = "[estimators.ce]\n[estimators.mine]\nkwargs = { p = 0.1 }\n"


@pytest.mark.parametrize(
    ("tune", "match"),
    [
        ('[tune.nosuch]\n"train.lr" = ["log", 1e-4, 1e-2]\n', r"\[tune.nosuch\].*valid: ce, mine"),
        ('[tune.mine]\n"estimator.kwargs.p" = ["uniform", 0.0, 1.0]\n', "unknown kind 'uniform'"),
        ('[tune.mine]\n"estimator.kwargs.p" = ["float", 0.5, 0.1]\n', "low < high"),
        ('[tune.mine]\n"estimator.kwargs.p" = ["log", 0.0, 0.5]\n', "0 < low < high"),
        ('[tune.mine]\n"estimator.kwargs.p" = ["float", 0.5]\n', r"\[kind, low, high\]"),
        ('[tune.mine]\n"kwargs.p" = ["float", 0.1, 0.5]\n', "not an override key"),
        (
            '[tune.mine]\n"estimator.kwargs.k" = ["int", 1.5, 4]\n',
            r"tune.mine.estimator.kwargs.k\[1\]",
        ),
    ],
)
def test_bad_spaces_name_the_table(tmp_path: Path, tune: str, match: str) -> None:
    path = tmp_path / "estimators.toml"
    path.write_text(BASE + tune)
    with pytest.raises((ValueError, TypeError), match=match):
        load_tune_spaces(path)


def test_a_new_estimator_space_is_one_table(tmp_path: Path) -> None:
    path = tmp_path / "estimators.toml"
    path.write_text(BASE + '[tune.mine]\n"estimator.kwargs.k" = ["int", 1, 8]\n')
    assert load_tune_spaces(path) == {"mine": {"estimator.kwargs.k": ("int", 1, 8)}}
