"""The metric table of ``evaluate``: metrics against independent references (Python loops,
scikit-learn), include / exclude, a custom registered metric, and one search for all."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _reference import brute_knn
from sklearn.metrics import average_precision_score, roc_auc_score

import bayesurl.evaluation.evaluator as E
from bayesurl.evaluation import evaluate
from bayesurl.evaluation.table import (
    METRICS,
    Metric,
    Need,
    register_metric,
    unregister_metric,
)


def _data(n: int = 80, d: int = 6, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 5, (n,), generator=g)
    centers = torch.randn(5, d, generator=g, dtype=torch.float64)
    x = centers[y] + 1.2 * torch.randn(n, d, generator=g, dtype=torch.float64)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    samples = x + 0.3 * torch.randn(7, n, d, generator=g, dtype=torch.float64)
    ood = torch.rand(11, generator=g, dtype=torch.float64) + 0.3
    id_y = torch.randint(0, 5, (30,), generator=g)
    id_x = centers[id_y] + 1.2 * torch.randn(30, d, generator=g, dtype=torch.float64)
    id_u = torch.rand(30, generator=g, dtype=torch.float64)
    return dict(x=x, y=y, u=u, samples=samples, ood=ood, id_x=id_x, id_y=id_y, id_u=id_u)


def _loop_metrics(x: torch.Tensor, y: torch.Tensor, ks: tuple[int, ...]) -> dict[str, float]:
    """R@1, recall@k and mAP@k from brute-force neighbour lists (docs/concepts/metrics.rst)."""
    nb = brute_knn(x, max(ks))
    lab = y.tolist()
    out: dict[str, float] = {}
    for k in ks:
        out[f"recall@{k}"] = float(
            np.mean([any(lab[j] == lab[i] for j in nb[i][:k]) for i in range(len(lab))])
        )
        aps = []
        for i in range(len(lab)):
            mates = sum(1 for j in range(len(lab)) if j != i and lab[j] == lab[i])
            hits, ap = 0, 0.0
            for r, j in enumerate(nb[i][:k], start=1):
                if lab[j] == lab[i]:
                    hits += 1
                    ap += hits / r
            aps.append(ap / min(mates, k) if mates else 0.0)
        out[f"map@{k}"] = float(np.mean(aps))
    out["r@1"] = out[f"recall@{ks[0]}"] if ks[0] == 1 else float("nan")
    return out


def test_retrieval_and_uncertainty_metrics_against_loops_and_sklearn():
    d = _data()
    res = evaluate(d["x"], d["y"], uncertainties=d["u"], ood_uncertainties=d["ood"], ks=(1, 3, 5))
    want = _loop_metrics(d["x"], d["y"], (1, 3, 5))
    for key, value in want.items():
        assert res[key] == pytest.approx(value, abs=1e-12), key
    nb = brute_knn(d["x"], 1)
    wrong = np.array([d["y"][i] != d["y"][nb[i][0]] for i in range(len(nb))])
    assert res["r_auroc"] == pytest.approx(roc_auc_score(wrong, d["u"].numpy()), abs=1e-12)
    labels = np.r_[np.zeros(80), np.ones(11)]
    scores = np.r_[d["u"].numpy(), d["ood"].numpy()]
    assert res["ood_auroc"] == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    assert res["ood_auprc"] == pytest.approx(average_precision_score(labels, scores), abs=1e-12)


def test_ood_against_the_in_distribution_set_and_mixed_r_auroc():
    """With a second (in-distribution) set, OOD is u(ood) vs its u (docs/concepts/zero_shot.rst),
    and the mixed 50/50 R-AUROC (URL App. C.5) pools 30 queries of each side, sides kept apart."""
    d = _data()
    res = evaluate(
        d["x"], d["y"], uncertainties=d["u"], ood_uncertainties=d["ood"],
        id_embeddings=d["id_x"], id_labels=d["id_y"], id_uncertainties=d["id_u"],
    )  # fmt: skip
    labels = np.r_[np.zeros(30), np.ones(11)]
    assert res["ood_auroc"] == pytest.approx(
        roc_auc_score(labels, np.r_[d["id_u"].numpy(), d["ood"].numpy()]), abs=1e-12
    )
    # reference: the same seeded draws (seed 0, side a = the in-distribution set), then loops
    gen = torch.Generator().manual_seed(0)
    ia = torch.randperm(30, generator=gen)[:30].sort().values
    ib = torch.randperm(80, generator=gen)[:30].sort().values
    emb = torch.cat([d["id_x"][ia], d["x"][ib]])
    key = [(0, int(v)) for v in d["id_y"][ia]] + [(1, int(v)) for v in d["y"][ib]]
    u = np.r_[d["id_u"][ia].numpy(), d["u"][ib].numpy()]
    nb = brute_knn(emb, 1)
    wrong = np.array([key[i] != key[nb[i][0]] for i in range(60)])
    assert res["mixed_r@1"] == pytest.approx(1 - wrong.mean(), abs=1e-12)
    assert res["mixed_r_auroc"] == pytest.approx(roc_auc_score(wrong, u), abs=1e-12)


def test_crop_share_from_a_predict_function():
    """URL's crop test: a model whose u is minus the pixel spread; a centre crop of a smooth
    ramp spreads less, so every crop is more uncertain."""
    ramp = torch.linspace(0, 1, 16, dtype=torch.float64)
    images = (ramp[:, None] + ramp[None, :]).expand(5, 1, 16, 16).clone()
    images += 0.01 * torch.arange(5, dtype=torch.float64)[:, None, None, None]
    d = _data()
    calls = []

    def predict_u(batch: torch.Tensor) -> torch.Tensor:
        calls.append(batch.shape[0])
        return -batch.flatten(1).std(dim=1)

    res = evaluate(
        d["x"], d["y"], uncertainties=d["u"], predict_uncertainty=predict_u, crop_images=images
    )
    assert res["crop_share"] == 1.0 and calls == [5, 5]
    assert res["crop_spearman"] is not None
    with pytest.raises(ValueError, match="go together"):
        evaluate(d["x"], d["y"], crop_images=images)
    with pytest.raises(ValueError, match="crop_images"):
        evaluate(d["x"], d["y"], predict_uncertainty=predict_u, crop_images=images[0])


def test_include_and_exclude():
    d = _data()
    res = evaluate(d["x"], d["y"], uncertainties=d["u"], samples=d["samples"], include=["r@1"])
    assert res["r@1"] is not None
    assert res["r_auroc"] is None and res["ece"] is None  # required keys stay, not computed
    assert not any(k.startswith("recall@") for k in res) and "rank_correlation" not in res
    full = evaluate(d["x"], d["y"], uncertainties=d["u"], samples=d["samples"])
    assert res["r@1"] == full["r@1"] and full["ece"] is not None
    ex = evaluate(d["x"], d["y"], uncertainties=d["u"], samples=d["samples"], exclude=["ece"])
    assert ex["ece"] is None and "ece_shortlist" not in ex and ex["r_auroc"] == full["r_auroc"]
    # a key names the metric that writes it
    sp = evaluate(d["x"], d["y"], uncertainties=d["u"], include=["ause"])
    assert (sp["ausc"], sp["ause"]) == (full["ausc"], full["ause"]) and sp["r@1"] is None
    # the LAM-code variants are opt-in, by name or by reference="lam"
    lam = evaluate(d["x"], d["y"], samples=d["samples"], include=["lam_ece"])
    assert (
        lam["lam_ece"] == evaluate(d["x"], d["y"], samples=d["samples"], reference="lam")["lam_ece"]
    )
    assert "lam_ece" not in full
    for bad in (["r@2"], ["nope"]):
        with pytest.raises(ValueError, match="unknown metric"):
            evaluate(d["x"], d["y"], include=bad)
    with pytest.raises(ValueError, match="exclude"):
        evaluate(d["x"], d["y"], exclude="ece")


def test_missing_inputs_are_none_with_one_note_per_input():
    d = _data()
    res = evaluate(d["x"], d["y"], samples=None)
    assert res["r_auroc"] is None and res["ece"] is None
    notes = [n for n in res["notes"] if "no uncertainties" in n]
    assert notes == [
        "r_auroc, ausc, ause, aurc, augrc: no uncertainties (give `uncertainties` or `samples`)"
    ]
    assert res["mixed_r_auroc"] is None and res["crop_share"] is None  # silent extras


def _precision_at_2(ctx) -> dict[str, float]:
    return {"precision@2": float(ctx.shards.gather(ctx.hits[:, :2].double().mean(dim=1)).mean())}


@pytest.fixture
def precision_at_2():
    metric = register_metric(
        Metric("precision@2", lambda o: ("precision@2",), (Need.NEIGHBOURS,), _precision_at_2,
               neighbours=lambda ctx: 2)
    )  # fmt: skip
    yield metric
    unregister_metric("precision@2")
    assert "precision@2" not in METRICS


def test_custom_metric_is_one_registration(precision_at_2):
    d = _data()
    res = evaluate(d["x"], d["y"], ks=(1,))
    nb = brute_knn(d["x"], 2)
    want = np.mean([[d["y"][j] == d["y"][i] for j in nb[i]] for i in range(80)])
    assert res["precision@2"] == pytest.approx(float(want), abs=1e-12)
    assert "precision@2" not in evaluate(d["x"], d["y"], exclude=["precision@2"])
    with pytest.raises(ValueError, match="already registered"):
        register_metric(precision_at_2)


def test_one_search_serves_every_metric(monkeypatch, precision_at_2):
    """R@k, mAP@k, R-AUROC, AUSC, the ECE's shortlist and a custom metric: one search, with
    the largest request; no search when no selected metric reads neighbours."""
    calls = []
    real = E.search_shards

    def counted(x, k, *args, **kwargs):
        calls.append(k)
        return real(x, k, *args, **kwargs)

    monkeypatch.setattr(E, "search_shards", counted)
    d = _data()
    res = evaluate(None, d["y"], samples=d["samples"], ks=(1, 3), shortlist=12)
    assert calls == [12] and res["ece_shortlist"] == 12 and res["precision@2"] is not None
    calls.clear()
    evaluate(d["x"], d["y"], uncertainties=d["u"], ks=(1, 7))
    assert calls == [7]
    calls.clear()
    res = evaluate(d["x"], d["y"], uncertainties=d["u"], ood_uncertainties=d["ood"],
                   include=["ood_auroc"])  # fmt: skip
    assert calls == [] and math.isfinite(res["ood_auroc"])
