"""Frozen features: a frozen encoder's embeddings, computed once and kept as a data source.

The PVU thesis' "cache everything" (section 5.3): once an encoder is frozen, its embeddings
are data. One package holds what every user of them shares:

- :mod:`~bayesurl.features.encoding` -- :func:`encode` (the post-hoc input rule every fit,
  cache and prediction encodes under), :func:`encode_batches` (the one loop that runs a
  frozen encoder over batches, with augmentation draws) and :class:`FrozenEncoder` (a
  backbone behind its image transform and resize);
- :mod:`~bayesurl.features.store` -- the one on-disk format (sealed shards) in two views:
  :class:`FeatureStore` (content-addressed by each image's SHA-1: the frozen-feature runs and
  ``bayesurl folder``) and :class:`EmbeddingCache` (augmentation passes over a loader: PVU's
  training data);
- :mod:`~bayesurl.features.sets` -- a set of images swapped for its cached features
  (:func:`cached_features`, :class:`CachedFeatures` with each row's source image), and the
  batch transforms of cached rows (:class:`FirstView`, :class:`RandomView`).

The post-hoc wrappers (:mod:`bayesurl.posthoc`) and the runs (:mod:`bayesurl.runs`, with
``backbone.freeze``) sit above it.
"""

from __future__ import annotations

from bayesurl.features.encoding import FrozenEncoder, encode, encode_batches
from bayesurl.features.sets import (
    CachedFeatures,
    FirstView,
    RandomView,
    cached_features,
    source_digests,
)
from bayesurl.features.store import (
    EmbeddingCache,
    EmbeddingShard,
    FeatureStore,
    encoder_fingerprint,
    image_digests,
    view_seed,
    write_shard,
)

__all__ = [
    "CachedFeatures",
    "EmbeddingCache",
    "EmbeddingShard",
    "FeatureStore",
    "FirstView",
    "FrozenEncoder",
    "RandomView",
    "cached_features",
    "encode",
    "encode_batches",
    "encoder_fingerprint",
    "image_digests",
    "source_digests",
    "view_seed",
    "write_shard",
]
