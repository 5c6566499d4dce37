"""ClassifierLaplace closed-form predictive against laplace-torch's own GLM predictive."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from bayesurl.laplace import ClassifierLaplace


def _setup(seed: int = 0, bias: bool = True):
    torch.manual_seed(seed)
    n, f_in, c = 60, 5, 3
    y = torch.arange(n) % c
    x = torch.randn(n, f_in, dtype=torch.float64) + y[:, None].double()
    model = nn.Sequential(nn.Linear(f_in, 7), nn.Tanh(), nn.Linear(7, c, bias=bias)).double()
    opt = torch.optim.Adam(model.parameters(), lr=5e-2)
    for _ in range(40):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model, DataLoader(TensorDataset(x, y), batch_size=20), x


@pytest.mark.parametrize("structure", ["diag", "kron"])
@pytest.mark.parametrize("bias", [True, False])
def test_closed_form_equals_laplace_torch(structure, bias):
    model, loader, x = _setup(bias=bias)
    cl = ClassifierLaplace(model, hessian_structure=structure, prior_precision=0.7)
    cl.fit(loader)
    pred = cl.predictive(x[:10])
    f_mu, f_var = cl.la._glm_predictive_distribution(x[:10])
    torch.testing.assert_close(pred.logits, f_mu)
    torch.testing.assert_close(pred.logit_cov, f_var, rtol=1e-7, atol=1e-10)
    probs = cl.la(x[:10], pred_type="glm", link_approx="probit")
    torch.testing.assert_close(pred.probs, probs)
    ent = -(probs * probs.log()).sum(-1)
    torch.testing.assert_close(pred.entropy, ent)
    out = cl(x[:10])
    assert out.uncertainty.shape == (10,) and out.logits.shape == (10, 3)
    assert out.embedding.shape == (10, 7)


def test_prior_precision_optimisation_changes_predictive():
    model, loader, x = _setup(1)
    cl = ClassifierLaplace(model, hessian_structure="diag", prior_precision=1.0)
    cl.fit(loader)
    before = cl.predictive(x).logit_var
    lam = cl.optimize_prior_precision()
    assert torch.isfinite(lam).all() and bool((lam > 0).all())
    after = cl.predictive(x)
    f_mu, f_var = cl.la._glm_predictive_distribution(x)
    torch.testing.assert_close(after.logit_cov, f_var)
    assert not torch.allclose(before, after.logit_var)


def test_bad_input():
    with pytest.raises(ValueError, match="nn.Linear"):
        ClassifierLaplace(nn.Sequential(nn.Conv1d(1, 1, 1)))
    model, loader, x = _setup()
    with pytest.raises(ValueError, match="hessian_structure"):
        ClassifierLaplace(model, hessian_structure="full-ish")
    with pytest.raises(ValueError, match="backend"):
        ClassifierLaplace(model, backend="magic")
    with pytest.raises(ValueError, match="fit"):
        ClassifierLaplace(model).predictive(x)
