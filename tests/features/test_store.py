"""The one embedding store (:mod:`bayesurl.features.store`) against independent references.

References: numpy arrays and :func:`numpy.save` for the shard files, the encoder called
directly in plain Python loops for every row the loop and the stores hand back, and a
brute-force walk over the loader's batches for the pass-indexed cache.
"""

from __future__ import annotations

import io
import re
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from bayesurl.features import (
    EmbeddingCache,
    EmbeddingShard,
    FeatureStore,
    FrozenEncoder,
    encode_batches,
    image_digests,
    write_shard,
)
from bayesurl.files import CorruptedFileError, seal


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _shard(folder, batches, **kw):
    folder.mkdir(parents=True, exist_ok=True)
    built = write_shard(folder, batches, **kw)
    seal(folder, {**built["meta"], "key": {"weights": "w"}}, built["files"])
    return EmbeddingShard(folder)


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
def test_shard_round_trips_numpy_arrays_and_writes_what_numpy_save_writes(tmp_path, dtype):
    g = _gen(1)
    sizes = [3, 1, 5]
    embs = [torch.randn(n, 2, 4, generator=g, dtype=torch.float64) for n in sizes]
    labs = [torch.randint(0, 9, (n,), generator=g) for n in sizes]
    digests = [f"d{i}" for i in range(sum(sizes))]
    shard = _shard(tmp_path / "s", zip(embs, labs), dtype=dtype, digests=digests)
    want = np.concatenate([e.numpy() for e in embs]).astype(dtype)
    assert shard.features.dtype == np.dtype(dtype) and isinstance(shard.features, np.memmap)
    np.testing.assert_array_equal(np.asarray(shard.features), want)
    np.testing.assert_array_equal(np.asarray(shard.labels), np.concatenate(labs))
    assert shard.digests == digests and len(shard) == 9 and shard.key == {"weights": "w"}
    ref = io.BytesIO()
    np.save(ref, want)
    assert (tmp_path / "s" / "features.npy").read_bytes() == ref.getvalue()


def test_shard_refuses_bad_streams_and_altered_files(tmp_path):
    (tmp_path / "a").mkdir()
    with pytest.raises(ValueError, match="no data"):
        write_shard(tmp_path / "a", iter([]))
    two = [(torch.zeros(2, 1, 3), None), (torch.zeros(2, 1, 4), None)]
    with pytest.raises(ValueError, match="changed shape"):
        write_shard(tmp_path / "a", iter(two))
    mixed = [(torch.zeros(2, 1, 3), torch.zeros(2)), (torch.zeros(2, 1, 3), None)]
    with pytest.raises(ValueError, match="labels"):
        write_shard(tmp_path / "a", iter(mixed))
    with pytest.raises(ValueError, match="`digests`"):
        write_shard(tmp_path / "a", iter([(torch.zeros(2, 1, 3), None)]), digests=["x"])
    shard = _shard(tmp_path / "b", [(torch.ones(4, 1, 3), None)])
    assert shard.labels is None and shard.digests is None
    raw = bytearray((tmp_path / "b" / "features.npy").read_bytes())
    raw[-1] ^= 0x01
    (tmp_path / "b" / "features.npy").write_bytes(bytes(raw))
    with pytest.raises(CorruptedFileError, match="SHA-256"):
        EmbeddingShard(tmp_path / "b")


class _Counting(nn.Module):
    """A deterministic float64 encoder that counts the distinct items it encoded (the store
    pads a short batch with repeats of its last row)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(12, 5).double()
        self.seen = 0

    def forward(self, x):
        self.seen += len(torch.unique(x.reshape(len(x), -1), dim=0))
        return self.lin(x.reshape(len(x), -1).double() / 255)


def test_loop_rows_equal_the_encoder_called_by_hand(tmp_path):
    enc = _Counting().train()
    xs = [torch.randint(0, 256, (n, 3, 2, 2), dtype=torch.uint8, generator=_gen(n)) for n in (4, 3)]
    ys = [torch.arange(len(x)) for x in xs]

    def augment_with(g):
        return lambda x: x.double() + torch.rand(x.shape, generator=g, dtype=torch.float64)

    got = list(encode_batches(enc, zip(xs, ys), views=2, augment=augment_with(_gen(7)),
                              progress=False))  # fmt: skip
    assert enc.training  # the flag is restored
    g = _gen(7)
    aug = augment_with(g)
    for (e, y), x, y_ref in zip(got, xs, ys):
        assert not e.requires_grad and e.shape == (len(x), 3, 5) and e.dtype == torch.float64
        with torch.no_grad():
            rows = [enc.lin(x.reshape(len(x), -1).double() / 255)]
            rows += [enc.lin(aug(x).reshape(len(x), -1) / 255) for _ in range(2)]
        for v, r in enumerate(rows):
            torch.testing.assert_close(e[:, v], r, rtol=0, atol=0)
        assert torch.equal(y, y_ref)
    # views only (no plain row), and nothing to do is an error
    only = next(encode_batches(enc, xs[:1], plain=False, views=1, augment=augment_with(_gen(7)),
                               progress=False))  # fmt: skip
    torch.testing.assert_close(only[0][:, 0], got[0][0][:, 1], rtol=0, atol=0)
    with pytest.raises(ValueError, match="nothing to encode"):
        next(encode_batches(enc, xs, plain=False, progress=False))
    with pytest.raises(ValueError, match="`augment`"):
        next(encode_batches(enc, xs, views=1, progress=False))


def _store(tmp_path, backbone=None):
    backbone = backbone or _Counting()
    enc = FrozenEncoder(backbone, nn.Identity(), resolution=2)
    return FeatureStore(tmp_path / "store", enc, None, 1, {"t": 1}, progress=False)


def _brute(backbone, images):
    with torch.no_grad():
        return torch.stack([backbone.lin(im.reshape(-1).double() / 255) for im in images]).float()


def test_feature_store_addresses_images_by_content_across_calls(tmp_path):
    g = _gen(3)
    a = torch.randint(0, 256, (6, 3, 2, 2), dtype=torch.uint8, generator=g)
    b = torch.randint(0, 256, (4, 3, 2, 2), dtype=torch.uint8, generator=g)
    store = _store(tmp_path)
    first = store.features(a)
    assert store.encoder.backbone.seen == 6
    # b's images are new, a[1] and a[4] (repeated) are not; order and duplicates kept
    mixed = torch.cat([b[:2], a[4:5], b[2:], a[1:2], a[4:5]])
    second = store.features(mixed)
    assert store.encoder.backbone.seen == 10 and store.timings["extract_images"] == 10
    torch.testing.assert_close(first[:, 0], _brute(store.encoder.backbone, a), rtol=0, atol=0)
    torch.testing.assert_close(second[:, 0], _brute(store.encoder.backbone, mixed), rtol=0, atol=0)
    assert len(list((tmp_path / "store").glob("*/shard-*"))) == 2
    shards = [EmbeddingShard(s) for s in sorted((tmp_path / "store").glob("*/shard-*"))]
    assert sorted(d for s in shards for d in s.digests) == sorted(image_digests(torch.cat([a, b])))
    # a store of other weights never reads these shards: another key, another folder
    other = _Counting()
    with torch.no_grad():
        other.lin.weight.add_(1.0)
    again = _store(tmp_path, other)
    torch.testing.assert_close(again.features(a)[:, 0], _brute(other, a), rtol=0, atol=0)
    assert other.seen == 6 and len(list((tmp_path / "store").iterdir())) == 2


def test_feature_store_rebuilds_a_corrupted_shard_and_never_reads_it(tmp_path):
    x = torch.randint(0, 256, (5, 3, 2, 2), dtype=torch.uint8, generator=_gen(4))
    store = _store(tmp_path)
    store.features(x)
    path = next((tmp_path / "store").glob("*/shard-*")) / "features.npy"
    raw = bytearray(path.read_bytes())
    raw[-4:] = np.float32(1e30).tobytes()  # same size, another value
    path.write_bytes(bytes(raw))
    fresh = _store(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fresh.features(x)
    assert any("rebuilding" in str(w.message) for w in caught)
    assert fresh.encoder.backbone.seen == 5  # encoded again, not read
    torch.testing.assert_close(got[:, 0], _brute(fresh.encoder.backbone, x), rtol=0, atol=0)


class _ShuffledPasses:
    """Each pass a new order of the items and new noise: labels differ row by row per pass."""

    def __init__(self, x, y, batch):
        self.x, self.y, self.batch, self.g = x, y, batch, _gen(9)
        self.passes: list[list[tuple[torch.Tensor, torch.Tensor]]] = []

    def __iter__(self):
        order = torch.randperm(len(self.x), generator=self.g)
        noisy = self.x[order] + 0.1 * torch.randn(
            self.x.shape, generator=self.g, dtype=self.x.dtype
        )
        self.passes.append([])
        for s in range(0, len(order), self.batch):
            item = (noisy[s : s + self.batch], self.y[order[s : s + self.batch]])
            self.passes[-1].append(item)
            yield item


def test_pass_cache_batches_equal_a_brute_force_walk(tmp_path):
    torch.manual_seed(0)
    enc = nn.Linear(4, 3).double()
    x, y = torch.randn(11, 4, dtype=torch.float64), torch.arange(11) % 4
    loader = _ShuffledPasses(x, y, batch=4)
    cache = EmbeddingCache.build(enc, loader, tmp_path / "c", passes=3, dtype="float64",
                                 progress=False)  # fmt: skip
    assert (cache.passes, cache.n_items, cache.dim, cache.input_shape) == (3, 11, 3, (4,))
    again = EmbeddingCache(tmp_path / "c")
    for p in range(3):
        with torch.no_grad():
            ref_e = torch.cat([enc(xb) for xb, _ in loader.passes[p]]).float()
        ref_y = torch.cat([yb for _, yb in loader.passes[p]])
        plain = list(again.batches(5, pass_index=p, shuffle=False))
        assert [len(e) for e, _ in plain] == [5, 5, 1]
        torch.testing.assert_close(torch.cat([e for e, _ in plain]), ref_e, rtol=0, atol=0)
        assert torch.equal(torch.cat([lab for _, lab in plain]), ref_y)
        order = torch.randperm(11, generator=_gen(p))
        shuffled = list(again.batches(4, pass_index=p + 3, drop_last=True, generator=_gen(p)))
        assert [len(e) for e, _ in shuffled] == [4, 4]
        torch.testing.assert_close(torch.cat([e for e, _ in shuffled]), ref_e[order[:8]])
        assert torch.equal(torch.cat([lab for _, lab in shuffled]), ref_y[order[:8]])


def test_pass_cache_refuses_another_encoder(tmp_path):
    torch.manual_seed(0)
    enc, other = nn.Linear(2, 3), nn.Linear(2, 3)
    cache = EmbeddingCache.build(enc, [torch.randn(5, 2)], tmp_path / "c", progress=False)
    cache.check_encoder(enc)
    with pytest.raises(ValueError, match="different encoder"):
        cache.check_encoder(other)
    # the features store's shards are not pass caches: refused as such, not misread
    store = _store(tmp_path)
    store.features(torch.zeros(2, 3, 2, 2, dtype=torch.uint8))
    with pytest.raises(CorruptedFileError, match="n_items"):
        EmbeddingCache(next((tmp_path / "store").glob("*/shard-*")))


def _bars(text: str) -> list[str]:
    return [s for s in text.replace("\r", "\n").splitlines() if "/s]" in s]


def test_extraction_bars_count_images_toward_a_total(tmp_path, capsys):
    """The feature store's extraction (batches from a generator) and the pass cache (a
    DataLoader) show images out of the total with a time left, not a bare batch count
    ("16it")."""
    from torch.utils.data import DataLoader, TensorDataset

    g = _gen(5)
    images = torch.randint(0, 256, (300, 3, 2, 2), dtype=torch.uint8, generator=g)
    store = _store(tmp_path)
    store.progress = True
    store.features(images)
    err = capsys.readouterr().err
    bars = _bars(err)
    assert bars and all(re.search(r"\d+/300 \[", b) and "img" in b for b in bars), bars
    assert not re.search(r"\b\d+it\b", err)
    x = torch.randn(50, 3)
    for drop_last, total in ((False, 50), (True, 48)):
        loader = DataLoader(TensorDataset(x), batch_size=16, drop_last=drop_last)
        EmbeddingCache.build(nn.Linear(3, 2), loader, tmp_path / f"c{total}", progress=True)
        bars = _bars(capsys.readouterr().err)
        assert bars and all(f"/{total} [" in b and "img" in b for b in bars), bars
