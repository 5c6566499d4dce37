"""Regressions of MetricLaplace: D = 1, float64 batches, NaN inputs."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

pytest.importorskip("pytorch_metric_learning")
from bayesurl.laplace import MetricLaplace  # noqa: E402


def _model(d=3):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, d))


def _batch(n=30):
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 3
    return torch.randn(n, 4, generator=g) + y[:, None].float(), y


def test_one_dimensional_embedding_is_refused():
    la = MetricLaplace(_model(d=1))
    with pytest.raises(ValueError, match="out_features=1.*D >= 2"):
        la.fit([_batch()], progress=False)  # u was NaN
    with pytest.raises(ValueError, match="out_features=1"):
        la.predictive(_batch()[0])


@pytest.mark.parametrize("mode", ["posthoc", "online"])
def test_float64_batches_into_a_float32_model(mode):
    x, y = _batch()
    kw = {"dataset_size": 30} if mode == "online" else {}
    la = MetricLaplace(_model(), mode=mode, **kw)
    la.fit([(x.double(), y)], progress=False)
    ref = MetricLaplace(_model(), mode=mode, **kw)
    ref.fit([(x, y)], progress=False)
    assert torch.equal(la.hessian, ref.hessian)  # the model computes in float32 either way
    o64, o32 = la.predictive(x.double()), ref.predictive(x)
    assert torch.equal(o64.uncertainty, o32.uncertainty) and torch.isfinite(o64.uncertainty).all()


def test_nan_inputs_are_named():
    la = MetricLaplace(_model())
    x, y = _batch()
    la.fit([(x, y)], progress=False)
    x[3, 1] = math.nan
    with pytest.raises(ValueError, match="`x` contains non-finite"):
        la.predictive(x)
    with pytest.raises(ValueError, match="`x` contains non-finite"):
        la.fit([(x, y)], progress=False)
