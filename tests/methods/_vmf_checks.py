"""Checks shared by the tests of the vMF-based methods and InfoNCE (not a test module)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.special as sp
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
    else:
        assert out.samples is None
    json.dumps(m.hparams)
    rebuilt = M.create(name, **m.hparams)
    assert sum(p.numel() for p in rebuilt.parameters()) == sum(p.numel() for p in m.parameters())
    if m.has_distribution:
        check_samples_follow_kappa(name)


def mean_resultant_length(kappa: torch.Tensor, d: int) -> np.ndarray:
    """A_D(kappa) = I_{D/2}(kappa) / I_{D/2-1}(kappa) by scipy's scaled Bessel ``ive``."""
    k = kappa.detach().double().numpy()
    return sp.ive(d / 2, k) / sp.ive(d / 2 - 1, k)


def check_samples_follow_kappa(name: str, n_samples: int = 4000) -> None:
    """The method's samples are ``vMF(embedding, kappa)``: per input, the mean cosine to the
    embedding is A_D(kappa) (scipy, independent of the package's Bessel code) within 5 standard
    errors, with Var(w) = 1 - (D - 1) A / kappa - A^2; the tangential part averages to zero.
    Two regimes: the random initialisation (kappa ~ 1, A ~ 0.05) and a head warmed up to
    u = 0.02 (kappa ~ 50, A ~ 0.85)."""
    for warmup_u in (None, 0.02):
        m = make(name, warmup_u=warmup_u)
        x = batch(m)[0]
        x = x[0] if m.two_view else x
        with torch.no_grad():
            if warmup_u is not None:
                # warms the kappa head up on this batch: exact in train mode, where it is set
                _, k_train = m.train().embed_with_kappa(x)
                assert float((1 / k_train).mean()) == pytest.approx(warmup_u, rel=1e-5)
            m.eval()
            torch.manual_seed(0)
            out = m(x, n_samples=n_samples)
        kappa = out.kappa.double()
        if warmup_u is not None:
            # eval mode: BatchNorm's running statistics differ from the batch's, and the warmed
            # head maps that difference to kappa on a log scale (0.8 % here): same regime
            assert float((1 / kappa).mean()) == pytest.approx(warmup_u, rel=0.05)
        a = torch.from_numpy(mean_resultant_length(kappa, D))
        var = 1 - (D - 1) * a / kappa - a * a
        z, mu = out.samples.double(), out.embedding.double()
        w = torch.einsum("snd,nd->sn", z, mu)
        se = (var / n_samples).sqrt()
        dev = (w.mean(0) - a) / se
        assert (dev.abs() < 5).all(), (name, warmup_u, dev, w.mean(0), a)
        tangent = (z - w[..., None] * mu).mean(0).norm(dim=-1)
        # E||mean of S tangential parts||^2 = (1 - E w^2) / S
        assert (tangent < 5 * ((1 - var - a * a) / n_samples).sqrt()).all(), (name, tangent)


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


def check_warm_kappa_moves(name: str) -> None:
    """From the default warm-up (u = 0.001), one AdamW step at lr 1e-3 on the
    method's own training loss changes kappa by a measurable relative amount (median
    ``|d log kappa| > 1e-4``). The old additive warm-up moved it by ~1e-6 per step, so ELK's
    kappa stayed at 1000 through a whole benchmark run."""
    m = make(name).train()
    assert m.kappa_head.warmup_u == 1e-3  # the methods' default
    b = batch(m)
    x = b[0] if not m.two_view else b[0][0]
    with torch.no_grad():
        m.training_loss(b)  # warms the kappa head up
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.0)
    m.eval()  # kappa without sampling noise; the step itself is a training step
    with torch.no_grad():
        before = m(x).kappa.double()
    m.train()
    torch.manual_seed(0)
    m.training_loss(b).backward()
    opt.step()
    m.eval()
    with torch.no_grad():
        after = m(x).kappa.double()
    change = (after / before).log().abs()
    assert float(change.median()) > 1e-4, (name, change)
