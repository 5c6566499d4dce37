"""What adding a new kind of estimator and a new metric takes: one registration each.

A throwaway estimator kind (one class, as a new file under ``bayesurl/runs/estimators/``
would hold) and one recipe line run through the whole pipeline (config check, build, fit,
predict, evaluate); a throwaway metric (one table entry) appears in an ``Evaluator`` result
and in the run's metrics. Both are removed again, and the tables are as before.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from bayesurl.data import TransformedLoader, make_loader
from bayesurl.evaluation import Evaluator
from bayesurl.evaluation.table import METRICS, Metric, Need, register_metric, unregister_metric
from bayesurl.runs import load_recipe, run
from bayesurl.runs.config import RECIPE_DIR
from bayesurl.runs.estimators import ESTIMATORS, Estimator, Tuning, build_estimator
from bayesurl.runs.runner import refuse_undistributed
from bayesurl.sweeps.tuning import search_space
from bayesurl.types import Output


# -- the new kind: everything it takes besides one recipe line ----------------------------------
class CenterDistance(Estimator):
    """u = the distance of the input to the mean of the upstream training inputs."""

    def fit(self, data, ctx):
        t0 = time.perf_counter()
        loader = make_loader(data.sets.train, 100, shuffle=False, distributed=False)
        batches = TransformedLoader(loader, data.transform, ctx.device)
        xs = [x.flatten(1).double() for x, _ in batches]
        self.center = torch.cat(xs).mean(0)
        return {"train_time": time.perf_counter() - t0}

    def predict(self, x, n_samples=0):
        emb = x.flatten(1).float()
        return Output(embedding=emb, uncertainty=(emb.double() - self.center).norm(dim=1))


# -- the new metric: one entry -----------------------------------------------------------------
def _mean_u(ctx) -> dict[str, float]:
    return {"mean_u": float(ctx.u.double().mean())}


MEAN_U = Metric("mean_u", lambda options: ("mean_u",), (Need.UNCERTAINTY,), _mean_u)

#: the one recipe line of the new estimator, added to a copy of the shipped recipe file
RECIPE_LINE = 'center = { kind = "center_distance", note = "distance to the training mean" }'


@pytest.fixture
def extended(tmp_path):
    kinds, metrics = ESTIMATORS.names(), tuple(METRICS)
    ESTIMATORS.register("center_distance", distributed=False, tuning=Tuning.NONE)(CenterDistance)
    register_metric(MEAN_U)
    text = (RECIPE_DIR / "fashion_mnist.toml").read_text()
    recipe = tmp_path / "recipes.toml"
    recipe.write_text(f"{text}\n[estimators]\n{RECIPE_LINE}\n")
    try:
        yield recipe
    finally:
        ESTIMATORS.remove("center_distance")
        unregister_metric("mean_u")
    assert ESTIMATORS.names() == kinds and tuple(METRICS) == metrics


def test_a_new_estimator_kind_is_one_class_and_one_recipe_line(extended):
    cfg = load_recipe(f"{extended}/center", preset="smoke")
    assert cfg.estimator.kind == "center_distance"
    assert isinstance(build_estimator(cfg), CenterDistance)
    # the declared traits answer the pipeline's questions: no tuning, not under DDP
    assert search_space("center", {"kind": "center_distance"}) == {}
    with pytest.raises(ValueError, match=r"'center' \(kind 'center_distance'\)"):
        refuse_undistributed([cfg], argument="estimators")

    result = run(cfg)
    assert result.estimator == "center" and result.metrics["r@1"] is not None
    assert 0.0 <= result.metrics["r_auroc"] <= 1.0
    # the new metric is computed on the run's own u, through the same evaluation road
    assert result.metrics["mean_u"] > 0.0


def test_a_new_metric_is_one_entry(extended):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(60, 8, generator=g, dtype=torch.float64), torch.arange(60) % 3
    u = torch.rand(60, generator=g, dtype=torch.float64)
    res = Evaluator()(x, y, uncertainties=u)
    assert res["mean_u"] == pytest.approx(float(u.mean()), rel=1e-12)
    assert Evaluator(include=["mean_u"])(x, y, uncertainties=u)["mean_u"] == res["mean_u"]


def test_an_unknown_kind_names_the_key_as_typed(extended):
    with pytest.raises(ValueError, match=r"unknown `estimators.ce.kind` 'centre'.*center_distance"):
        load_recipe("fashion_mnist/ce", ["estimator.kind=centre"], preset="smoke")


def test_each_shipped_kind_is_one_file_of_its_name():
    """The folder's files are the kinds: ``<kind>.py`` registers ``<kind>``, nothing else does."""
    import bayesurl.runs.estimators.base as base

    folder = Path(base.__file__).parent
    files = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")} - {"base"}
    homes = {e.name: e.obj.__module__.rpartition(".")[2] for e in ESTIMATORS}
    assert homes == {f: f for f in files}
    assert set(ESTIMATORS.names(distributed=True)) == {"method", "lam"}
