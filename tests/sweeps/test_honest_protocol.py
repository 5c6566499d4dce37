"""Cross-fitted class splits, the tuning-leak check and the class-aware statistics, against
brute-force enumerations and scipy."""

from __future__ import annotations

import itertools
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from bayesurl.data.class_splits import crossfit_splits
from bayesurl.runs.config import load_recipe
from bayesurl.sweeps.aggregate import (
    chance_test,
    complementary_pairs,
    paired_comparison,
    split_half_reproducibility,
)
from bayesurl.sweeps.options import SweepOptions
from bayesurl.sweeps.pipeline import PipelineRun
from bayesurl.sweeps.plan import SweepPreset, plan_runs, preset_splits, sweep_preset
from bayesurl.sweeps.report import best_free_baseline, write_results
from bayesurl.sweeps.tuning import tuning_leaks

ROOT = Path(__file__).resolve().parents[2]


# -- cross-fitted splits ------------------------------------------------------------------------
def test_crossfit_splits_are_every_split_with_one_pair_up_and_the_other_down():
    v1, v2 = (3, 4), (6, 8)
    got = crossfit_splits([v1, v2])
    # brute force: every 5-of-10 upstream set holding one pair and none of the other
    want = {
        up
        for up in itertools.combinations(range(10), 5)
        if (set(v1) <= set(up) and not set(v2) & set(up))
        or (set(v2) <= set(up) and not set(v1) & set(up))
    }
    assert len(got) == len(want) == 40
    assert {s.upstream for s in got} == want
    for s in got:
        assert s.val in (v1, v2) and set(s.val) <= set(s.upstream)
        assert not set(s.val) & set(s.downstream)  # no split is evaluated on its tuning classes
    for a, b in zip(got[::2], got[1::2]):  # complementary pairs
        assert a.downstream == b.upstream and a.val == v1 and b.val == v2
    assert Counter(c for s in got for c in s.downstream) == {c: 20 for c in range(10)}
    assert got[0].upstream == (0, 1, 2, 3, 4) and got[1].upstream == (5, 6, 7, 8, 9)


def test_crossfit_splits_for_many_classes_and_a_draw():
    sets = [[0, 1], [2, 3], [4, 5]]
    every = crossfit_splits(sets, num_classes=20)
    for s in every:
        assert not set(s.val) & set(s.downstream)
    some = crossfit_splits(sets, num_classes=20, n_splits=12, seed=1)
    assert len(some) == 12 and [s.index for s in some] == list(range(12))
    assert {s.upstream for s in some} <= {s.upstream for s in every}
    assert some == crossfit_splits(sets, num_classes=20, n_splits=12, seed=1)
    # a prefix of the plan: the first pair, then a seeded sample of the others
    again = crossfit_splits(sets, num_classes=20, seed=1)
    assert [s.upstream for s in some] == [s.upstream for s in again[:12]]
    assert some[0].upstream == every[0].upstream
    assert [s.upstream for s in some] != [s.upstream for s in every[:12]]


@pytest.mark.parametrize(
    ("sets", "kw", "match"),
    [
        ([[3, 4]], {}, "at least two"),
        ([[3, 4], [4, 5]], {}, "overlap"),
        ([[3, 4], [10, 11]], {}, "outside"),
        ([[0, 1, 2, 3, 4], [5, 6]], {}, "must fit"),
        ([[3, 4], [6, 8]], {"n_splits": 3}, "even"),
        ([[3, 4], [6, 8]], {"n_splits": 42}, "n_splits"),
        ([[3, "a"], [6, 8]], {}, "class indices"),
    ],
)
def test_crossfit_splits_refuse_bad_sets(sets, kw, match):
    with pytest.raises(ValueError, match=match):
        crossfit_splits(sets, **kw)


def test_the_pretrained_preset_plans_the_crossfit_splits():
    plan = sweep_preset("fashion_mnist", "pretrained")
    splits = preset_splits(plan)
    assert plan.n_splits == len(splits) == 40
    assert splits == crossfit_splits([[3, 4], [6, 8]])
    runs = plan_runs(["ce"], plan)
    assert [r["class_split"] for r in runs] == [s.to_dict() for s in splits]


# -- the tuned tables and tuned_on --------------------------------------------------------------
def test_each_split_takes_the_table_tuned_on_its_own_upstream_pair():
    splits = crossfit_splits([[3, 4], [6, 8]])
    for s in splits[:4]:
        try:
            cfg = load_recipe(
                "fashion_mnist/pvu", [("data.class_split", s.to_dict())], preset="pretrained"
            )
        except ValueError as exc:  # a pair not yet tuned is refused, never borrowed
            assert "downstream class" in str(exc) and s.val == (6, 8)
            continue
        assert cfg.tuned_on == list(s.val) and not set(cfg.tuned_on) & set(s.downstream)
        got = PipelineRun(preset=SweepPreset("p", recipe_preset="pretrained")).tuned_classes(
            cfg, {}
        )
        assert got["tuned_on"] == list(s.val)
    cfg = load_recipe(
        "fashion_mnist/pvu",
        [("data.class_split", splits[1].to_dict())],
        preset="pretrained",
        tuned=False,
    )
    run = PipelineRun(
        SweepOptions(recipe_tuned=False), preset=SweepPreset("p", recipe_preset="pretrained")
    )
    assert run.tuned_classes(cfg, {}) == {"tuned_on": [], "tuned_trained_on": []}
    # settings of a sweep's own search carry its classes; unknown classes stay unknown
    own = {"overrides": ["train.lr=0.01"], "tuned_on": [6, 8], "tuned_trained_on": [5, 7, 9]}
    assert run.tuned_classes(cfg, own) == {"tuned_on": [6, 8], "tuned_trained_on": [5, 7, 9]}
    assert run.tuned_classes(cfg, {"overrides": ["train.lr=0.01"]})["tuned_on"] is None


# -- records for the report ---------------------------------------------------------------------
def _records(tuned_on=lambda s: [], n_est=5, seed=0):
    """Two complementary pairs of splits x ``n_est`` estimators, with a stable ranking."""
    rng = np.random.default_rng(seed)
    splits = crossfit_splits([[3, 4], [6, 8]], n_splits=8, seed=seed)
    names = ["ce", "feature_norm", "feature_knn", *[f"m{i}" for i in range(n_est - 3)]]
    level = {n: 0.45 + 0.04 * i for i, n in enumerate(names)}
    recs = []
    for s in splits:
        for n in names:
            recs.append(
                {
                    "method": n,
                    "split": s.index,
                    "seed": 0,
                    "upstream": list(s.upstream),
                    "downstream": list(s.downstream),
                    "tuned_on": tuned_on(s),
                    "r_auroc": float(level[n] + rng.normal(0, 0.02)),
                    "r@1": float(0.7 + rng.normal(0, 0.02)),
                    "ood_auroc": float(0.6 + rng.normal(0, 0.02)),
                }
            )
    return recs


def test_the_report_refuses_a_leaky_plan(tmp_path):
    # every run tuned on split 0's validation pair (the old single tuning): leaks
    leaky = _records(tuned_on=lambda s: [3, 4])
    doc = json.loads(Path(write_results(leaky, tmp_path / "a", {})["json"]).read_text())
    assert not doc["tuning_check"]["ok"] and doc["verdict"].startswith("NO VERDICT")
    assert {x["split"] for x in doc["tuning_check"]["leaky"]} == {
        r["split"] for r in leaky if {3, 4} & set(r["downstream"])
    }
    assert all(r["verdict"] is None for r in doc["paired_vs_ce"]["r_auroc"].values())
    clean = _records(tuned_on=lambda s: list(s.val))
    doc = json.loads(Path(write_results(clean, tmp_path / "b", {})["json"]).read_text())
    assert doc["tuning_check"]["ok"] and doc["verdict"] is None
    assert set(doc["reproducibility_by"]) == {"pairs", "class"}
    assert doc["reproducibility_by"]["class"]["r_auroc"]["min"] is not None
    assert doc["paired_vs_ce_pairs"]["r_auroc"]["m0"]["n"] == 4  # four complementary pairs
    assert doc["vs_chance"]["ce"]["n"] == 4
    assert all(r["verdict"] is not None for r in doc["paired_vs_ce"]["r_auroc"].values())
    # a run that does not say what it was tuned on cannot be cleared either
    for r in clean[:1]:
        del r["tuned_on"]
    assert tuning_leaks(clean)["unrecorded"] == 1 and not tuning_leaks(clean)["ok"]
    # the docs' verdict refuses in one line
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import protocol_report
    finally:
        sys.path.pop(0)
    text = protocol_report.verdict(
        json.loads(Path(write_results(leaky, tmp_path / "c", {})["json"]).read_text())
    )
    assert text.count("\n") == 1 and "NO VERDICT" in text


# -- class-aware statistics ---------------------------------------------------------------------
def test_complementary_pairs_from_the_classes():
    recs = _records()
    pair_of = complementary_pairs(recs)
    assert pair_of == {k: k - k % 2 for k in range(8)}
    lone = [dict(r) for r in recs if r["split"] != 1]
    assert complementary_pairs(lone)[0] == 0 and 1 not in complementary_pairs(lone)


def test_complementary_pairs_with_validation_classes_upstream_in_every_split():
    """Validation classes 0, 1 upstream everywhere (the clipart design): splits 2k and 2k+1
    swap the other classes; a split that shares only some of them is nobody's twin."""
    val = [0, 1]
    halves = [([2, 3, 4], [5, 6, 7]), ([2, 5, 6], [3, 4, 7]), ([3, 5, 7], [2, 4, 6])]
    recs = []
    for i, (a, b) in enumerate(halves):
        recs.append({"split": 2 * i, "upstream": val + a, "downstream": b})
        recs.append({"split": 2 * i + 1, "upstream": val + b, "downstream": a})
    recs.append({"split": 6, "upstream": val + [2, 3, 7], "downstream": [4, 5, 6]})
    recs.append({"split": 7, "upstream": val + [4, 5, 6], "downstream": [2, 3]})
    pair_of = complementary_pairs(recs)
    assert pair_of == {0: 0, 1: 0, 2: 2, 3: 2, 4: 4, 5: 4, 6: 6, 7: 7}


def test_paired_comparison_per_pair_is_scipy_on_the_pair_means():
    recs = _records()
    got = paired_comparison(recs, "r_auroc", unit="pair")
    d = {}
    for r in recs:
        d.setdefault(r["method"], {})[r["split"]] = r["r_auroc"]
    pvals = []
    for n in ["feature_norm", "feature_knn", "m0", "m1"]:
        x = [np.mean([d[n][k] - d["ce"][k] for k in (j, j + 1)]) for j in range(0, 8, 2)]
        ref = stats.ttest_1samp(x, 0.0)
        assert got[n]["n"] == 4
        assert got[n]["mean_diff"] == pytest.approx(np.mean(x), abs=1e-12)
        assert got[n]["p_t"] == pytest.approx(ref.pvalue, rel=1e-9)
        pvals.append(ref.pvalue)
    # Holm by brute force: sorted p times (m - rank), running maximum, capped at 1
    order = np.argsort(pvals)
    adj, run = np.empty(4), 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (4 - rank) * pvals[i]))
        adj[i] = run
    for n, a in zip(["feature_norm", "feature_knn", "m0", "m1"], adj):
        assert got[n]["p_t_holm"] == pytest.approx(a, rel=1e-9)


def test_chance_test_is_scipy_one_sample_against_one_half():
    recs = _records()
    got = chance_test(recs, "r_auroc")
    for n in ["ce", "feature_norm", "m1"]:
        x = [
            np.mean([r["r_auroc"] for r in recs if r["method"] == n and r["split"] in (j, j + 1)])
            for j in range(0, 8, 2)
        ]
        ref = stats.ttest_1samp(x, 0.5)
        assert got[n]["mean"] == pytest.approx(np.mean(x), abs=1e-12)
        assert got[n]["p_t"] == pytest.approx(ref.pvalue, rel=1e-9)
    assert got["m1"]["verdict"] == "above"  # 0.61 +- 0.01 over 4 pairs
    split = chance_test(recs, "r_auroc", unit="split")
    assert split["ce"]["n"] == 8


def test_a_free_baseline_below_chance_is_no_bar():
    recs = _records()  # feature_norm at 0.49, feature_knn at 0.53
    summary = {
        n: {"r_auroc": {"mean": float(np.mean([r["r_auroc"] for r in recs if r["method"] == n]))}}
        for n in ("feature_norm", "feature_knn")
    }
    chance = chance_test(recs)
    want = "feature_knn" if chance["feature_knn"]["verdict"] == "above" else None
    assert best_free_baseline(summary, chance) == want
    chance["feature_knn"]["verdict"] = "below"
    assert best_free_baseline(summary, chance) is None
    assert best_free_baseline(summary) == "feature_knn"  # without the test: the old rule


def test_class_held_out_halvings_by_brute_force():
    recs = _records(n_est=6)
    got = split_half_reproducibility(recs, "r_auroc", halving="class")
    names = got["estimators"]
    for c in range(10):
        down = sorted({r["split"] for r in recs if c in r["downstream"]})
        up = sorted({r["split"] for r in recs if c in r["upstream"]})
        xa = [
            np.mean([r["r_auroc"] for r in recs if r["method"] == n and r["split"] in down])
            for n in names
        ]
        xb = [
            np.mean([r["r_auroc"] for r in recs if r["method"] == n and r["split"] in up])
            for n in names
        ]
        assert got["per_class"][str(c)] == pytest.approx(stats.spearmanr(xa, xb).statistic)
    vals = list(got["per_class"].values())
    assert got["min"] == pytest.approx(min(vals)) and got["median"] == pytest.approx(
        np.median(vals)
    )


def test_pair_preserving_halvings_keep_pairs_together():
    recs = _records(n_est=6)
    got = split_half_reproducibility(recs, "r_auroc", halving="pairs")
    assert got["exhaustive"] and len(got["partitions"]) == 3  # 4 pairs: 3 ways to halve
    for p in got["partitions"]:
        for k in p["a"]:
            assert (k ^ 1) in p["a"]  # a split and its complement stay on one side
        names = got["estimators"]
        xa = [
            np.mean([r["r_auroc"] for r in recs if r["method"] == n and r["split"] in p["a"]])
            for n in names
        ]
        xb = [
            np.mean([r["r_auroc"] for r in recs if r["method"] == n and r["split"] in p["b"]])
            for n in names
        ]
        assert p["spearman"] == pytest.approx(stats.spearmanr(xa, xb).statistic)
    with pytest.raises(ValueError, match="halving"):
        split_half_reproducibility(recs, "r_auroc", halving="nope")


def test_a_resumed_search_does_not_repeat_its_trials(tmp_path):
    from bayesurl.data.class_splits import class_splits
    from bayesurl.sweeps.storage import SweepStorage
    from bayesurl.sweeps.tuning import tune_estimators

    def fake(params):
        lr = float(params["overrides"][0].split("=")[1])
        return {"r@1": 0.5, "r_auroc": 0.5 + lr}

    split = class_splits(1)[0]
    for n in (3, 6):  # a search stopped after 3 trials, then resumed to 6 by a new process
        store = SweepStorage(None, out=tmp_path, sweep="t")
        tune_estimators(["ce"], n, fake, store, split=split, log=lambda s: None)
    trials = store.tuning_study("ce").get_trials(deepcopy=False)
    lrs = [t.params["train.lr"] for t in trials]
    assert len(lrs) == 6 and len(set(lrs)) == 6


def test_without_a_class_split_several_tuned_sets_are_refused():
    with pytest.raises(ValueError, match="come in 2 sets"):
        load_recipe("fashion_mnist/ce", preset="pretrained")
    assert load_recipe("fashion_mnist/ce", preset="pretrained", tuned=False).tuned_on == []


@pytest.mark.parametrize(
    ("dataset", "title"), [("clipart", "pretrained (clipart)"), ("fashion_mnist", "pretrained")]
)
def test_the_plots_name_a_data_set_other_than_the_default(tmp_path, monkeypatch, dataset, title):
    """Two protocols of one preset on two data sets must not draw plots titled alike."""
    import bayesurl.sweeps.report as report

    seen = []
    monkeypatch.setattr(report, "plot_results", lambda *a, **k: seen.append(k["title"]))
    monkeypatch.setattr(report, "plot_training_curves", lambda *a, **k: seen.append(k["title"]))
    write_results(_records(), tmp_path, {"preset": "pretrained", "dataset": dataset})
    assert seen == [title, title]
