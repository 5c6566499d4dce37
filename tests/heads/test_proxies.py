import pytest
import torch

from bayesurl.heads.proxies import NonIsotropicVMFProxies, VMFProxies


def test_vmf_proxies_shapes_scale_and_sharing():
    p = VMFProxies(5, 4, kappa_scale=16.0, init_kappa=2.0)
    mu, kappa = p()
    assert mu.shape == (5, 4) and kappa.shape == (5,)
    assert torch.allclose(mu.norm(dim=1), torch.ones(5))
    assert torch.allclose(kappa, torch.full((5,), 32.0))
    shared = VMFProxies(5, 4, shared_kappa=True)
    assert shared.raw_kappa.numel() == 1
    mu, kappa = shared()
    kappa.sum().backward()
    assert shared.raw_kappa.grad.shape == (1,) and float(shared.raw_kappa.grad) > 0
    fixed = VMFProxies(3, 4, learn_kappa=False)
    assert not fixed.raw_kappa.requires_grad


def test_non_isotropic_proxies():
    p = NonIsotropicVMFProxies(3, 6, kappa_scale=8.0, init_kappa=0.5)
    mu, kappa = p()
    assert mu.shape == (3, 6) and kappa.shape == (3, 6)
    assert torch.allclose(kappa, torch.full((3, 6), 4.0))
    assert torch.allclose(mu.norm(dim=1), torch.ones(3))
    # per-dimension concentrations are free parameters
    (kappa[0, 1] * 1.0).backward()
    g = p.raw_kappa.grad
    assert g[0, 1] > 0 and g.abs().sum() == g[0, 1].abs()


def test_dtype_follows_module():
    mu, kappa = VMFProxies(3, 4).double()()
    assert mu.dtype == kappa.dtype == torch.float64


def test_bad_input():
    with pytest.raises(ValueError, match="num_classes"):
        VMFProxies(1, 4)
    with pytest.raises(ValueError, match="dim"):
        NonIsotropicVMFProxies(3, 1)
    with pytest.raises(ValueError, match="kappa_scale"):
        VMFProxies(3, 4, kappa_scale=0.0)
    with pytest.raises(ValueError, match="init_kappa"):
        NonIsotropicVMFProxies(3, 4, init_kappa=-1.0)
