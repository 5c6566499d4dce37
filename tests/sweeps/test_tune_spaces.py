"""Search spaces declared in the estimator's own line (its `tune` key in the base table of
estimators) give the spaces the committed searches and tuned tables were made with."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from bayesurl.runs.config import inherit_estimators, list_recipes, load_recipe, read_recipe_file
from bayesurl.sweeps.tuning import search_space

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
    base = inherit_estimators("estimators", {})
    own = {n: t["tune"] for n, t in base.items() if "tune" in t}
    assert set(own) == set(OLD_TUNE_SPACES) - {"_default"}
    for name in base:
        got = search_space(name)  # its line in the base table
        want = {**OLD_TUNE_SPACES["_default"], **OLD_TUNE_SPACES.get(name, {})}
        if base[name].get("kind") in ("posthoc", "baseline"):
            continue
        # the key order is the order Optuna suggests them in (the TPE draws follow it)
        assert got == want and list(got) == list(want), name


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


BASE = "[estimators]\nce = {}\n"


@pytest.mark.parametrize(
    ("tune", "match"),
    [
        ('{ "estimator.kwargs.p" = ["uniform", 0.0, 1.0] }', "unknown kind 'uniform'"),
        ('{ "estimator.kwargs.p" = ["float", 0.5, 0.1] }', "low < high"),
        ('{ "estimator.kwargs.p" = ["log", 0.0, 0.5] }', "0 < low < high"),
        ('{ "estimator.kwargs.p" = ["float", 0.5] }', r"\[kind, low, high\]"),
        ('{ "kwargs.p" = ["float", 0.1, 0.5] }', "estimators.mine.tune.*not an override key"),
        (
            '{ "estimator.kwargs.k" = ["int", 1.5, 4] }',
            r"estimators.mine.tune.estimator.kwargs.k\[1\]",
        ),
        ('"p"', "must be a table"),
    ],
)
def test_bad_spaces_name_the_key(tmp_path: Path, tune: str, match: str) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(BASE + f"mine = {{ kwargs = {{ p = 0.1 }}, tune = {tune} }}\n")
    table = read_recipe_file(str(path))["estimators"]["mine"]
    with pytest.raises((ValueError, TypeError), match=match):
        search_space("mine", table)


def test_a_new_estimator_is_one_line_and_equals_its_long_form(tmp_path: Path) -> None:
    """`name = { ..., tune = {...} }` resolves as the [estimators.name] + [tune] tables did."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    line = tmp_path / "a" / "mine.toml"
    line.write_text(
        BASE + 'mine = { kwargs = { p = 0.1 }, note = "n", tune = { "estimator.kwargs.k" = '
        '["int", 1, 8], "estimator.kwargs.p" = ["float", 0.05, 0.5] } }\n'
    )
    long = tmp_path / "b" / "mine.toml"
    long.write_text(
        '[estimators.ce]\n[estimators.mine]\nkwargs = { p = 0.1 }\nnote = "n"\n'
        '[estimators.mine.tune]\n"estimator.kwargs.k" = ["int", 1, 8]\n'
        '"estimator.kwargs.p" = ["float", 0.05, 0.5]\n'
    )
    a, b = (read_recipe_file(str(p))["estimators"]["mine"] for p in (line, long))
    assert (
        search_space("mine", a)
        == search_space("mine", b)
        == {
            "train.lr": ("log", 1e-4, 1e-2),
            "estimator.kwargs.k": ("int", 1, 8),
            "estimator.kwargs.p": ("float", 0.05, 0.5),
        }
    )
    ra, rb = (load_recipe(f"{p}/mine") for p in (line, long))
    assert {**ra.to_dict(), "source": ""} == {**rb.to_dict(), "source": ""}
    assert "tune" not in ra.to_dict()["estimator"]  # the sweep's, not a setting of the run
    assert ra.estimator.kwargs == {"p": 0.1}


def test_the_old_tune_tables_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "old.toml"
    path.write_text(BASE + '[tune.ce]\n"train.lr" = ["log", 1e-4, 1e-2]\n')
    with pytest.raises(
        ValueError, match=r"\[tune.ce\] in old.toml: a search space is the `tune` key"
    ):
        read_recipe_file(str(path))


def test_a_space_on_a_kind_that_searches_nothing_of_its_own_is_refused() -> None:
    table = {"kind": "posthoc", "base": "ce", "wrapper": "pvu", "fit": {"lr": 1e-3},
             "tune": {"estimator.kwargs.p": ["float", 0.1, 0.5]}}  # fmt: skip
    with pytest.raises(ValueError, match="estimators.pvu.tune.*only `estimator.fit.lr`"):
        search_space("pvu", table)
    with pytest.raises(ValueError, match="searches nothing"):
        search_space("feature_norm", {"kind": "baseline", "tune": table["tune"]})
