"""PVU: head architecture, ranking loss vs a loop and its scale invariance, SupCon task loss vs
PML, zero-initialised heads, the memory-mapped cache, and that cached training learns."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pytorch_metric_learning.losses import SupConLoss
from pytorch_metric_learning.reducers import DoNothingReducer
from scipy.stats import spearmanr
from torch import nn

from bayesurl.posthoc import (
    PVU,
    EmbeddingCache,
    PVUHead,
    check_head_trainable,
    classifier_task_loss,
    encoder_fingerprint,
    mse_loss,
    ranking_loss,
    supcon_task_loss,
)


def _loop_ranking(u, L, m):
    n = len(u)
    total = 0.0
    for i in range(n):
        j = (i + n // 2) % n
        sign = (L[i] > L[j]) - (L[i] < L[j])
        total += max(0.0, -sign * (u[i] - u[j]) + m)
    return total / n


def test_head_architecture():
    head = PVUHead(24)
    kinds = [type(m) for m in head.net]
    assert kinds == [nn.Linear, nn.LeakyReLU, nn.Linear, nn.LeakyReLU, nn.Linear, nn.Softplus]
    shapes = [tuple(m.weight.shape) for m in head.net if isinstance(m, nn.Linear)]
    assert shapes == [(512, 24), (512, 512), (1, 512)]
    u = head(torch.randn(5, 24))
    assert u.shape == (5,) and bool((u > 0).all())


@pytest.mark.parametrize("n", [2, 7, 10])
def test_ranking_loss_matches_loop(n):
    g = torch.Generator().manual_seed(n)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    L = torch.rand(n, generator=g, dtype=torch.float64)
    L[0] = L[n // 2]  # a tie
    got = ranking_loss(u, L, 0.1)
    assert float(got) == pytest.approx(_loop_ranking(u.tolist(), L.tolist(), 0.1), rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 40),
    st.floats(1e-3, 1e3),
    st.integers(0, 10_000),
)
def test_ranking_loss_invariant_to_scaling_task_loss(n, c, seed):
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64, requires_grad=True)
    L = torch.rand(n, generator=g, dtype=torch.float64) * 5
    a = ranking_loss(u, L)
    (ga,) = torch.autograd.grad(a, u)
    b = ranking_loss(u, c * L)
    (gb,) = torch.autograd.grad(b, u)
    assert float(a.detach()) == float(b.detach())
    assert torch.equal(ga, gb)
    # the MSE objective is not scale-free (the reason PVU switched to ranking)
    if c > 1.01:
        assert float(mse_loss(u, L).detach()) != pytest.approx(float(mse_loss(u, c * L).detach()))


def test_ranking_loss_stops_gradient_to_task_loss_and_skips_nan():
    u = torch.tensor([0.1, 0.5, 0.2, 0.9], requires_grad=True)
    L = torch.tensor([1.0, 2.0, 3.0, 0.5], requires_grad=True)
    ranking_loss(u, L).backward()
    assert L.grad is None and u.grad is not None
    Ln = torch.tensor([1.0, float("nan"), 3.0, 0.5])
    got = ranking_loss(u.detach(), Ln)
    want = _loop_ranking([0.1, 0.2, 0.9], [1.0, 3.0, 0.5], 0.1)
    assert float(got) == pytest.approx(want)
    with pytest.raises(ValueError, match="at least 2"):
        ranking_loss(u[:2].detach(), torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="length mismatch"):
        ranking_loss(u.detach(), L.detach()[:3])


def test_supcon_task_loss_matches_pml():
    g = torch.Generator().manual_seed(3)
    e = torch.randn(12, 6, generator=g, dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3, 0, 1, 4, 4])
    got = supcon_task_loss(e, y, 0.1)
    want = SupConLoss(temperature=0.1, reducer=DoNothingReducer())(e, y)["loss"]["losses"]
    assert torch.isnan(got[7]) and want[7] == 0  # class 3 has a single member
    keep = torch.arange(12) != 7
    assert torch.allclose(got[keep], want[keep], rtol=1e-10, atol=0)


def test_classifier_task_loss_is_per_sample_ce():
    clf = nn.Linear(4, 3).double()
    e = torch.randn(6, 4, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    got = classifier_task_loss(clf, e, y)
    logits = clf(e).detach()
    want = [float(torch.logsumexp(logits[i], 0) - logits[i, y[i]]) for i in range(6)]
    assert got.tolist() == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="labels"):
        classifier_task_loss(clf, e, torch.tensor([0, 1, 2, 3, 0, 1]))


def test_zero_initialised_head_is_rejected_and_partial_zero_warns():
    head = PVUHead(8)
    for p in head.parameters():
        nn.init.zeros_(p)
    probe = torch.randn(16, 8)
    with pytest.raises(ValueError, match="zero gradient"), pytest.warns(UserWarning):
        check_head_trainable(head, probe)
    # and indeed: the ranking loss gives exactly zero gradient to every parameter
    loss = ranking_loss(head(probe), torch.rand(16))
    grads = torch.autograd.grad(loss, list(head.parameters()), allow_unused=True)
    assert all(g is None or not bool(g.any()) for g in grads)
    head2 = PVUHead(8)
    nn.init.zeros_(head2.net[4].weight)
    with pytest.warns(UserWarning, match="zero-initialised"):
        check_head_trainable(head2, probe)
    # PVU.fit refuses a zero head
    enc = nn.Linear(8, 8)
    pvu = PVU(enc, embed_dim=8)
    for p in pvu.head.parameters():
        nn.init.zeros_(p)
    loader = [(torch.randn(16, 8), torch.randint(0, 2, (16,))) for _ in range(2)]
    with pytest.raises(ValueError, match="zero gradient"), pytest.warns(UserWarning):
        pvu.fit(loader, cached=False, progress=False)


class _NoisyLoader:
    """Batches of fixed images plus fresh augmentation noise on each pass."""

    def __init__(self, x, y, batch, seed=0):
        self.x, self.y, self.batch = x, y, batch
        self.g = torch.Generator().manual_seed(seed)
        self.seen: list[torch.Tensor] = []

    def __iter__(self):
        for s in range(0, len(self.x), self.batch):
            xb = self.x[s : s + self.batch]
            xb = xb + 0.1 * torch.randn(xb.shape, generator=self.g)
            self.seen.append(xb)
            yield xb, self.y[s : s + self.batch]


def test_cache_stores_every_pass_memory_mapped(tmp_path):
    enc = nn.Sequential(nn.Linear(5, 7), nn.Tanh())
    x, y = torch.randn(10, 5), torch.arange(10) % 3
    loader = _NoisyLoader(x, y, batch=4)
    cache = EmbeddingCache.build(enc, loader, tmp_path / "c", passes=3, progress=False)
    assert isinstance(cache.embeddings, np.memmap) and isinstance(cache.labels, np.memmap)
    assert (cache.passes, cache.n_items, cache.dim, len(cache)) == (3, 10, 7, 30)
    with torch.no_grad():
        want = torch.cat([enc(b) for b in loader.seen])
    emb, lab = cache.rows(np.arange(30))
    assert torch.equal(emb, want)
    assert lab.tolist() == (y.tolist() * 3)
    # passes differ (fresh augmentations)
    assert not torch.equal(emb[:10], emb[10:20])
    # reopen from disk; a batch of pass 1 holds exactly pass-1 rows
    again = EmbeddingCache(tmp_path / "c")
    rows = torch.cat([e for e, _ in again.batches(4, pass_index=1, shuffle=True)])
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, want[10:20].tolist()))
    with pytest.raises(ValueError, match="already holds"):
        EmbeddingCache.build(enc, loader, tmp_path / "c", progress=False)


def test_cache_bad_input(tmp_path):
    enc = nn.Linear(3, 2)
    with pytest.raises(ValueError, match="no data"):
        EmbeddingCache.build(enc, [], tmp_path / "a", progress=False)
    EmbeddingCache.build(enc, [(torch.randn(4, 3), torch.arange(4))], tmp_path / "b")
    with open(tmp_path / "b" / "features.npy", "r+b") as f:
        f.truncate(8)
    with pytest.raises(ValueError, match="corrupted"):
        EmbeddingCache(tmp_path / "b")
    with pytest.raises(FileNotFoundError):
        EmbeddingCache(tmp_path / "nothing")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match="meta.json"):
        EmbeddingCache(tmp_path / "d")
    uneven = [[(torch.randn(4, 3), torch.arange(4))], [(torch.randn(3, 3), torch.arange(3))]]

    class Changing:
        def __init__(self):
            self.k = 0

        def __iter__(self):
            self.k += 1
            return iter(uneven[self.k - 1])

    with pytest.raises(ValueError, match="pass 2"):
        EmbeddingCache.build(enc, Changing(), tmp_path / "e", passes=2, progress=False)
    nan_enc = nn.Linear(3, 2)
    with torch.no_grad():
        nan_enc.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="encoder output"):
        EmbeddingCache.build(nan_enc, [torch.randn(4, 3)], tmp_path / "f", progress=False)


def _toy_problem(n=512, seed=0):
    """Two Gaussian classes in 2-D; a fixed linear classifier; CE is high near the boundary."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = torch.randn(n, 2, generator=g) + (2 * y[:, None] - 1) * torch.tensor([1.5, 0.0])
    return x, y


@pytest.mark.parametrize("task", ["classifier", "supcon"])
def test_cached_pvu_learns_to_rank_task_loss(tmp_path, task):
    torch.manual_seed(0)
    enc = nn.Linear(2, 2)
    with torch.no_grad():
        enc.weight.copy_(torch.eye(2))
        enc.bias.zero_()
    clf = nn.Linear(2, 2)
    with torch.no_grad():
        clf.weight.copy_(torch.tensor([[-2.0, 0.0], [2.0, 0.0]]))
        clf.bias.zero_()
    x, y = _toy_problem()
    loader = _NoisyLoader(x, y, batch=64)
    opts = {"classifier": clf} if task == "classifier" else {"temperature": 0.5}
    pvu = PVU(enc, task=task, hidden=32, **opts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = pvu.fit(
            loader,
            epochs=8,
            lr=1e-2,
            batch_size=64,
            cache_dir=tmp_path / "c",
            progress=False,
            generator=torch.Generator().manual_seed(0),
        )
    assert out["losses"][-1] < out["losses"][0]
    xt, yt = _toy_problem(seed=1)
    with torch.no_grad():
        u = pvu(xt).uncertainty
    ce = classifier_task_loss(clf, xt, yt)
    rho = spearmanr(u.numpy(), ce.numpy()).statistic
    assert rho > 0.5, rho


class _Passes:
    """Loader over fixed per-pass data ``xs[p]``: pass p yields ``xs[p]`` in order (for building
    the cache), or, with ``seed``, in the order ``randperm(n, generator)`` of a generator seeded
    once, the order the cached path draws its batches in (the uncached reference)."""

    def __init__(self, xs, y, batch, seed=None):
        self.xs, self.y, self.batch, self.p = xs, y, batch, 0
        self.g = None if seed is None else torch.Generator().manual_seed(seed)

    def __iter__(self):
        x = self.xs[self.p % len(self.xs)]
        self.p += 1
        n = len(x)
        order = torch.arange(n) if self.g is None else torch.randperm(n, generator=self.g)
        for s in range(0, n, self.batch):
            idx = order[s : s + self.batch]
            yield x[idx], self.y[idx]


@pytest.mark.parametrize("loss", ["ranking", "mse"])
def test_cached_and_uncached_training_give_equal_heads(tmp_path, loss):
    """Independent of the cache's own bookkeeping: the uncached reference runs the encoder on the
    same per-epoch data in the same batch order; both must end with the same head weights."""
    epochs, batch = 3, 32
    x, y = _toy_problem(96)
    g = torch.Generator().manual_seed(3)
    xs = [x + 0.3 * torch.randn(x.shape, generator=g) for _ in range(epochs)]  # augmentations
    torch.manual_seed(0)
    enc, clf = nn.Linear(2, 4), nn.Linear(4, 2)

    def fresh():
        torch.manual_seed(1)  # same head initialisation for both
        return PVU(enc, classifier=clf, loss=loss, hidden=16)

    ref = fresh()
    init = {k: v.clone() for k, v in ref.head.state_dict().items()}
    out_ref = ref.fit(
        _Passes(xs, y, batch, seed=7), cached=False, epochs=epochs, lr=1e-2, progress=False
    )
    assert len(out_ref["losses"]) == epochs and out_ref["cache_seconds"] == 0.0
    cache = EmbeddingCache.build(enc, _Passes(xs, y, 64), tmp_path / "c", passes=epochs)
    got = fresh()
    out = got.fit(
        cache=cache,
        epochs=epochs,
        batch_size=batch,
        lr=1e-2,
        generator=torch.Generator().manual_seed(7),
        progress=False,
    )
    for k, v in ref.head.state_dict().items():
        assert not torch.allclose(v, init[k])  # the heads did train
        torch.testing.assert_close(got.head.state_dict()[k], v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["losses"], out_ref["losses"], rtol=1e-5)


def test_cache_from_another_encoder_is_refused(tmp_path):
    x, y = _toy_problem(64)
    torch.manual_seed(0)
    enc, other, clf = nn.Linear(2, 4), nn.Linear(2, 4), nn.Linear(4, 2)
    same = nn.Linear(2, 4)
    same.load_state_dict(enc.state_dict())
    assert encoder_fingerprint(same) == encoder_fingerprint(enc)
    assert encoder_fingerprint(other) != encoder_fingerprint(enc)
    cache = EmbeddingCache.build(enc, [(x, y)], tmp_path / "c", progress=False)
    assert cache.encoder_fingerprint == encoder_fingerprint(enc)
    with pytest.raises(ValueError, match="different encoder"):
        PVU(other, classifier=clf, hidden=8).fit(cache=cache, progress=False)
    with pytest.raises(ValueError, match="different encoder"):  # a cache passed as the loader
        PVU(other, classifier=clf, hidden=8).fit(cache, progress=False)
    with pytest.raises(ValueError, match="different encoder"):  # the cache path form
        PVU(other, classifier=clf, hidden=8).fit(cache=str(tmp_path / "c"), progress=False)
    PVU(same, classifier=clf, hidden=8).fit(cache=cache, progress=False)  # same weights: used
    # the encoder changed after the cache was written: refused too
    with torch.no_grad():
        enc.weight.add_(1e-3)
    with pytest.raises(ValueError, match="rebuild"):
        PVU(enc, classifier=clf, hidden=8).fit(cache=cache, progress=False)
    # fitting from the loader into the same directory rebuilds the cache for this encoder
    pvu = PVU(enc, classifier=clf, hidden=8)
    pvu.fit([(x, y)], cache_dir=tmp_path / "c", progress=False)
    assert EmbeddingCache(tmp_path / "c").encoder_fingerprint == encoder_fingerprint(enc)


def test_cache_without_fingerprint_is_corrupted_and_an_old_cache_names_the_rebuild(tmp_path):
    import json

    x, y = _toy_problem(32)
    enc, clf = nn.Linear(2, 4), nn.Linear(4, 2)
    EmbeddingCache.build(enc, [(x, y)], tmp_path / "c", progress=False)
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    assert meta["key"]["weights"] == encoder_fingerprint(enc)
    meta["key"]["weights"] = 5
    (tmp_path / "c" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="corrupted meta.json"):
        EmbeddingCache(tmp_path / "c")
    del meta["key"]
    (tmp_path / "c" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="corrupted meta.json"):
        PVU(enc, classifier=clf, hidden=8).fit(cache=tmp_path / "c", progress=False)
    # a directory of the raw-file format (bayesurl.embedding-cache/2) is refused, naming the fix
    old = tmp_path / "old"
    old.mkdir()
    np.zeros((32, 4), dtype=np.float32).tofile(old / "embeddings.bin")
    from bayesurl.files import seal

    seal(old, {"format": "bayesurl.embedding-cache/2", "n_items": 32, "passes": 1, "dim": 4,
               "dtype": "float32", "has_labels": False}, ["embeddings.bin"])  # fmt: skip
    with pytest.raises(ValueError, match=r"older bayesurl.*overwrite=True"):
        EmbeddingCache(old)
    rebuilt = EmbeddingCache.build(enc, [(x, y)], old, overwrite=True, progress=False)
    assert not (old / "embeddings.bin").exists() and rebuilt.n_items == 32


def test_uncached_bad_input():
    x, y = _toy_problem(128)
    with pytest.raises(ValueError, match="classifier"):
        PVU(nn.Linear(2, 2), task="classifier").fit([(x, y)], progress=False)
    with pytest.raises(ValueError, match="labels"):
        PVU(nn.Linear(2, 2)).fit([x], cached=False, progress=False)
    with pytest.raises(ValueError, match="loss"):
        PVU(nn.Linear(2, 2), loss="hinge")
