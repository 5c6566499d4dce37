"""Regressions of ``evaluate``: arguments are named, half precision works."""

from __future__ import annotations

import pytest
import torch

from bayesurl.distributions import sample_vmf
from bayesurl.evaluation import evaluate


def _data(n=40, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 4
    x = torch.randn(n, d, generator=g) + 2 * torch.nn.functional.one_hot(y, d).float()
    return x, y


def test_fractional_ks_are_refused_not_truncated():
    x, y = _data()
    with pytest.raises(ValueError, match=r"`ks\[0\]` must be an integer"):
        evaluate(x, y, ks=(2.7,))  # reported recall@2
    with pytest.raises(ValueError, match=r"`map_ks\[1\]`"):
        evaluate(x, y, map_ks=(1, 0.5))
    with pytest.raises(ValueError, match="`ks` must not be empty"):
        evaluate(x, y, ks=())
    res = evaluate(x, y, ks=(2.0,))
    assert "recall@2" in res


def test_ece_mode_is_named():
    x, y = _data()
    with pytest.raises(ValueError, match="`ece_mode` must be one of shortlist, exact"):
        evaluate(x, y, ece_mode="x")
    with pytest.raises(ValueError, match="`shortlist` must be an integer >= 1"):
        evaluate(x, y, shortlist=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_samples_match_float32(dtype):
    x, y = _data()
    mu = torch.nn.functional.normalize(x, dim=1)
    s = sample_vmf(
        mu.double(), torch.full((len(y),), 20.0), 8, generator=torch.Generator().manual_seed(0)
    )
    half = s.to(dtype)
    ref = evaluate(None, y, samples=half.float())
    got = evaluate(None, y, samples=half)  # failed inside sparse_sampled_addmm
    for k in ("r@1", "ece", "r_auroc", "map@5"):
        assert got[k] == pytest.approx(ref[k], abs=1e-12), k
    got_x = evaluate(x.to(dtype), y)
    assert got_x["r@1"] == evaluate(x.to(dtype).float(), y)["r@1"]


def test_all_zero_embedding_rows_are_refused_naming_the_argument():
    x, y = _data()
    x[7] = 0.0  # cosine undefined: it must not get an R@1 from index tie-breaking
    with pytest.raises(ValueError, match=r"`embeddings` has all-zero row.*\[7\]"):
        evaluate(x, y)
    s = torch.randn(4, 40, 6)
    e = torch.eye(6)
    s[:, 5] = torch.stack([e[0], -e[0], e[1], -e[1]])
    # draws that cancel out: their mean direction (the point embedding) is undefined
    with pytest.raises(ValueError, match="samples"):
        evaluate(None, y, samples=s)


@pytest.mark.parametrize("option", ["reference_uncertainties", "ood_uncertainties"])
def test_an_option_without_the_uncertainties_it_needs_is_refused(option):
    x, y = _data()
    with pytest.raises(ValueError, match=rf"`{option}` is compared with.*give `uncertainties`"):
        evaluate(x, y, **{option: torch.rand(40)})
    res = evaluate(x, y, uncertainties=torch.rand(40), **{option: torch.rand(40)})
    assert res["rank_correlation" if option.startswith("ref") else "ood_auroc"] is not None
    if option.startswith("ref"):
        with pytest.raises(ValueError, match="`reference_uncertainties` has 39"):
            evaluate(x, y, uncertainties=torch.rand(40), reference_uncertainties=torch.rand(39))
