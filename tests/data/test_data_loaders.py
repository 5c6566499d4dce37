"""Seeded loaders, worker processes and DistributedSampler sharding."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler, TensorDataset

from bayesurl.data import (
    ImageTensorDataset,
    TransformedLoader,
    TwoViews,
    default_augmentation,
    default_transform,
    make_loader,
    set_epoch,
)


def _ds(n=24, transform=None):
    imgs = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 4, 4).contiguous()
    return ImageTensorDataset(imgs, torch.arange(n) % 3, transform)


def _ids(loader):
    # image value == item index (0..n-1), so each batch tells which items it holds
    return [int(v) for xb, _ in loader for v in (xb[:, 0, 0, 0] * 255).round().long()]


def test_workers_and_two_views():
    ds = _ds(transform=TwoViews(default_augmentation(normalize=False)))
    loader = make_loader(ds, 5, shuffle=True, num_workers=2, seed=3)
    seen = 0
    for (v1, v2), y in loader:
        assert v1.shape == v2.shape and v1.shape[1:] == (1, 4, 4) and y.dtype == torch.int64
        seen += len(y)
    assert seen == 24


def test_seeded_shuffle_reproducible():
    ds = _ds()
    a = _ids(make_loader(ds, 4, shuffle=True, seed=7))
    b = _ids(make_loader(ds, 4, shuffle=True, seed=7))
    c = _ids(make_loader(ds, 4, shuffle=True, seed=8))
    assert a == b and a != c and sorted(a) == list(range(24))
    assert _ids(make_loader(ds, 4, shuffle=False)) == list(range(24))
    assert len(_ids(make_loader(ds, 5, shuffle=False, drop_last=True))) == 20


@pytest.mark.parametrize("n", [24, 25])
@pytest.mark.parametrize("shuffle", [False, True])
def test_explicit_replicas_cover_once(n, shuffle):
    ds = _ds(n)
    shards = []
    for rank in (0, 1):
        loader = make_loader(ds, 4, shuffle=shuffle, num_replicas=2, rank=rank, seed=1)
        assert isinstance(loader.sampler, DistributedSampler)
        shards.append(_ids(loader))
    union = shards[0] + shards[1]
    assert len(shards[0]) == len(shards[1]) == -(-n // 2)
    assert set(union) == set(range(n))
    # even n: each item exactly once; odd n: DistributedSampler pads by one repeated item
    assert len(union) - n == (n % 2)
    # drop_last: exactly once, tail dropped
    dropped = [
        _ids(make_loader(ds, 4, shuffle=shuffle, num_replicas=2, rank=r, drop_last=True))
        for r in (0, 1)
    ]
    flat = dropped[0] + dropped[1]
    assert len(flat) == len(set(flat))


@pytest.mark.parametrize("n", [24, 25, 3])
@pytest.mark.parametrize("replicas", [2, 4])
def test_unpadded_shards_partition(n, replicas):
    ds = _ds(n)
    for shuffle in (False, True):
        shards = []
        for rank in range(replicas):
            loader = make_loader(
                ds, 4, shuffle=shuffle, num_replicas=replicas, rank=rank, pad=False, seed=2
            )
            assert len(loader.sampler) == len(range(rank, n, replicas))
            shards.append(_ids(loader))
        flat = [i for shard in shards for i in shard]
        assert sorted(flat) == list(range(n))  # every item exactly once
        if not shuffle:
            assert shards[1] == list(range(1, n, replicas))


def test_set_epoch_changes_order():
    ds = _ds()
    loader = make_loader(ds, 4, shuffle=True, num_replicas=2, rank=0, seed=0)
    set_epoch(loader, 0)
    e0 = _ids(loader)
    set_epoch(loader, 1)
    assert _ids(loader) != e0
    set_epoch(loader, 0)
    assert _ids(loader) == e0
    set_epoch(make_loader(ds, 4, shuffle=True), 3)  # no-op without sharding


def test_bad_arguments():
    ds = _ds()
    with pytest.raises(ValueError, match="batch_size"):
        make_loader(ds, 0, shuffle=False)
    with pytest.raises(ValueError, match="distributed=True"):
        make_loader(ds, 4, shuffle=False, distributed=True)
    with pytest.raises(ValueError, match="rank"):
        make_loader(ds, 4, shuffle=False, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="empty"):
        make_loader(_ds(0), 4, shuffle=False)
    with pytest.raises(TypeError, match="'sampler'"):
        make_loader(ds, 4, shuffle=False, sampler=range(len(ds)))


def test_further_dataloader_arguments_pass_through():
    """DataLoader keywords make_loader does not name reach the DataLoader; persistent workers
    only with workers (a DataLoader without workers refuses them)."""
    ds = _ds()
    assert list(make_loader(ds, 4, shuffle=False, collate_fn=len))[:2] == [4, 4]
    assert make_loader(ds, 4, shuffle=False, persistent_workers=True).persistent_workers is False
    with_workers = make_loader(ds, 4, shuffle=False, num_workers=1, persistent_workers=True)
    assert with_workers.persistent_workers is True


def test_auto_detects_process_group(tmp_path):
    assert not isinstance(make_loader(_ds(), 4, shuffle=False).sampler, DistributedSampler)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        loader = make_loader(_ds(), 4, shuffle=False)
        assert isinstance(loader.sampler, DistributedSampler)
        assert _ids(loader) == list(range(24))
        plain = make_loader(_ds(), 4, shuffle=False, distributed=False)
        assert not isinstance(plain.sampler, DistributedSampler)
    finally:
        dist.destroy_process_group()


def test_datasets_pickle_for_spawned_workers(cub_root):
    import pickle

    from bayesurl.data import CUB200, default_zero_shot, subset

    d = default_zero_shot(force_digits=True, max_train=40, max_ood=5)
    d = d.with_transform(None, TwoViews(default_augmentation()))
    cub = CUB200(cub_root[0], "val")
    for ds in (d.train, d.test, cub, subset(cub, [1, 3], relabel=True)):
        back = pickle.loads(pickle.dumps(ds))
        assert len(back) == len(ds) and torch.equal(back.targets, ds.targets)
    back = pickle.loads(pickle.dumps(d.test))
    torch.testing.assert_close(back[0][0], d.test[0][0])
    assert pickle.loads(pickle.dumps(cub))[1][1] == cub[1][1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_transforms_follow_cuda_device():
    x = torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8, device="cuda")
    for t in (default_augmentation(3), TwoViews(default_augmentation())):
        out = t(x)
        out = out if isinstance(out, torch.Tensor) else out[0]
        assert out.device == x.device


def test_transformed_loader_transforms_the_loaders_batches():
    x = torch.randint(0, 256, (10, 1, 4, 4), dtype=torch.uint8)
    y = torch.arange(10)
    batches = TransformedLoader(
        make_loader(TensorDataset(x, y), 4, shuffle=True, seed=3), default_transform()
    )
    plain = make_loader(TensorDataset(x, y), 4, shuffle=True, seed=3)
    assert len(batches) == len(plain) == 3
    for _ in range(2):  # re-iterable: each pass is a pass of the loader
        got = list(batches)
        want = list(plain)
        assert len(got) == 3
        for (gx, gy), (wx, wy) in zip(got, want, strict=True):
            # the normalisation written out: (x / 255 - mean) / std
            ref = (wx.double() / 255.0 - 0.2860) / 0.3530
            torch.testing.assert_close(gx.double(), ref, rtol=1e-6, atol=1e-6)
            assert torch.equal(gy, wy)
    assert len(batches.dataset) == 10
