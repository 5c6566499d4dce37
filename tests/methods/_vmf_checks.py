"""Checks shared by the tests of the vMF-based methods and InfoNCE (not a test module)."""

from __future__ import annotations

import json

import pytest
import torch

import bayesurl.methods as M

SMALL = {"width": 8, "num_features": 32}
N, C, D = 8, 3, 16


def make(name: str, **kw):
    torch.manual_seed(0)
    return M.create(name, embed_dim=D, num_classes=C, backbone_kwargs=SMALL, **kw)


def batch(method, n: int = N, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 28, 28, generator=g)
    y = torch.arange(n) % C
    if method.two_view:
        return (x, x + 0.3 * torch.randn(x.shape, generator=g)), y
    return x, y


def check_forward(name: str) -> None:
    m = make(name).eval()
    x = batch(m)[0]
    x = x[0] if m.two_view else x
    with torch.no_grad():
        out = m(x)
        assert out.embedding.shape == (N, D) and out.uncertainty.shape == (N,)
        assert torch.isfinite(out.uncertainty).all() and (out.uncertainty > 0).all()
        assert out.samples is None
        out = m(x, n_samples=5)
    if m.has_distribution:
        assert out.samples.shape == (5, N, D)
        assert torch.allclose(out.samples.norm(dim=-1), torch.ones(5, N), atol=1e-5)
        assert torch.allclose(out.embedding.norm(dim=-1), torch.ones(N), atol=1e-5)
        assert torch.allclose(out.uncertainty, 1.0 / out.kappa)
        # the samples scatter around the embedding: mean cosine close to A_D(kappa) <= 1
        assert (torch.einsum("snd,nd->sn", out.samples, out.embedding) <= 1 + 1e-6).all()
    else:
        assert out.samples is None
    json.dumps(m.hparams)
    rebuilt = M.create(name, **m.hparams)
    assert sum(p.numel() for p in rebuilt.parameters()) == sum(p.numel() for p in m.parameters())


def check_loss_decreases(name: str, steps: int = 6, lr: float = 3e-3, **kw) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: threads only add contention on a shared CI box
    try:
        _loss_decreases(name, steps, lr, **kw)
    finally:
        torch.set_num_threads(threads)


def _loss_decreases(name: str, steps: int, lr: float, **kw) -> None:
    m = make(name, **kw).train()
    b = batch(m)
    opt = torch.optim.Adam(m.parameters(), lr=lr)

    def loss_now() -> float:
        # many samples and a fixed seed: the MC losses' noise stays far below the decrease
        k = getattr(m.loss_fn, "n_samples", None)
        if k is not None:
            m.loss_fn.n_samples = 128
        torch.manual_seed(123)
        with torch.no_grad():
            value = float(m.training_loss(b))
        if k is not None:
            m.loss_fn.n_samples = k
        return value

    if m.has_distribution and m.kappa_head.warmup_u is not None:
        assert not bool(m.kappa_head.warmed_up)
        x = b[0] if not m.two_view else torch.cat(b[0])
        m.training_loss(b)  # warms the kappa head up on its first training batch
        assert bool(m.kappa_head.warmed_up)
        with torch.no_grad():
            u = 1.0 / m.kappa_head(m.embed(x))
        assert abs(float(u.mean()) - m.kappa_head.warmup_u) < 1e-3 * m.kappa_head.warmup_u
    before = loss_now()
    for _ in range(steps):
        opt.zero_grad()
        loss = m.training_loss(b)
        assert torch.isfinite(loss)
        loss.backward()
        opt.step()
    after = loss_now()
    assert after < before, (before, after)


def check_bad_input(name: str) -> None:
    m = make(name)
    x, y = batch(m)
    with pytest.raises(ValueError, match="n_samples"):
        m(x[0] if m.two_view else x, n_samples=-1)
    bad = (x[0] if m.two_view else x).clone()
    bad[0, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="`x"):
        m(bad)
    with pytest.raises(ValueError, match="batch"):
        m.training_loss(x)
    if m.two_view:
        with pytest.raises(ValueError, match="two-view"):
            m.training_loss((x[0], y))
        with pytest.raises(ValueError, match="same shape"):
            m.training_loss(((x[0], x[1][:4]), y))
        with pytest.raises(ValueError, match="x1"):
            m.training_loss(((bad, x[1]), y))
    else:
        with pytest.raises(ValueError, match="length mismatch"):
            m.training_loss((x, y[:3]))
        with pytest.raises(ValueError, match="`y`"):
            m.training_loss((x, y.float()))
        with pytest.raises(ValueError, match="`y`"):
            m.training_loss((x, y + C))
        with pytest.raises(ValueError, match="`x`"):
            m.training_loss((bad, y))
    with pytest.raises(ValueError, match="unknown method"):
        M.create(name + "_nope")
