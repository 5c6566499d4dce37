"""The scores that train nothing against scikit-learn: agreement and time, same run.

On synthetic features of the frozen protocols' shape (``--n`` reference points in ``--classes``
classes, ``--dim`` = 1,280 dimensions, ``--queries`` queries; float64), for 1 and 2 threads:

- ``mahalanobis`` (:class:`bayesurl.posthoc.MahalanobisWrapper`) against
  ``LedoitWolf(assume_centered=True)`` of the class-centred rows and ``.mahalanobis``;
- ``gmm`` (:class:`bayesurl.posthoc.GMMWrapper`, one component per class) against a
  ``GaussianMixture`` with the classes' ``LedoitWolf`` covariances and ``score_samples``;
- ``knn`` (:class:`bayesurl.posthoc.KNNWrapper`, k = 10) against ``NearestNeighbors(metric=
  "cosine")``.

Prints fit and predict seconds of each, bayesurl / scikit-learn ratios (the time of the same
work, same process) and the largest relative difference of u::

    python benchmarks/reference_scores.py --n 2500 --classes 5 --dim 1280 --queries 5000
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from _machine import cpu_name
from sklearn.covariance import LedoitWolf
from sklearn.mixture import GaussianMixture
from sklearn.neighbors import NearestNeighbors
from threadpoolctl import threadpool_limits
from torch import nn

from bayesurl.posthoc import wrap


def _data(n: int, classes: int, dim: int, queries: int, seed: int = 0):
    """Non-negative, correlated features (like pooled CNN features) in ``classes`` groups."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    basis = rng.normal(size=(64, dim)) / 8
    x = np.abs(rng.normal(size=(n, 64)) @ basis + rng.normal(size=(classes, dim))[y])
    q = np.abs(rng.normal(size=(queries, 64)) @ basis + rng.normal(size=(queries, dim)))
    return x, y, q


def _ours(method: str, x, y, q, **options):
    w = wrap(nn.Identity(), method, **options)
    t0 = time.perf_counter()
    w.fit([(torch.as_tensor(x), torch.as_tensor(y))], progress=False)
    t1 = time.perf_counter()
    with torch.no_grad():
        u = w(torch.as_tensor(q)).uncertainty.numpy()
    return u, t1 - t0, time.perf_counter() - t1


def _sklearn(method: str, x, y, q):
    classes = np.unique(y)
    t0 = time.perf_counter()
    mus = np.stack([x[y == c].mean(0) for c in classes])
    if method == "mahalanobis":
        est = LedoitWolf(assume_centered=True).fit(x - mus[y])
        t1 = time.perf_counter()
        u = np.min(np.stack([est.mahalanobis(q - m) for m in mus], 1), 1)
    elif method == "gmm":
        covs = np.stack([LedoitWolf(store_precision=False).fit(x[y == c]).covariance_
                         for c in classes])  # fmt: skip
        gm = GaussianMixture(len(classes))
        gm.weights_ = np.bincount(y) / len(y)
        gm.means_, gm.covariances_ = mus, covs
        gm.precisions_cholesky_ = np.stack([np.linalg.inv(np.linalg.cholesky(c)).T for c in covs])
        t1 = time.perf_counter()
        u = -gm.score_samples(q)
    else:
        nn_ = NearestNeighbors(n_neighbors=10, metric="cosine", algorithm="brute").fit(x)
        t1 = time.perf_counter()
        u = nn_.kneighbors(q)[0].mean(1)
    return u, t1 - t0, time.perf_counter() - t1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2500)
    parser.add_argument("--classes", type=int, default=5)
    parser.add_argument("--dim", type=int, default=1280)
    parser.add_argument("--queries", type=int, default=5000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    x, y, q = _data(args.n, args.classes, args.dim, args.queries)
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; "
          f"torch {torch.__version__}; load {os.getloadavg()[0]:.2f} at start")  # fmt: skip
    print(f"N = {args.n} reference points, {args.classes} classes, D = {args.dim}, "
          f"{args.queries} queries, float64")  # fmt: skip
    print(
        "threads method       ours fit  ours u    sklearn fit  sklearn u  fit ratio  "
        "u ratio  max rel diff"
    )
    for threads in args.threads:
        torch.set_num_threads(threads)
        with threadpool_limits(threads):
            for method, options in (("mahalanobis", {}), ("gmm", {}), ("knn", {"k": 10})):
                ours, of, op = _ours(method, x, y, q, **options)
                ref, sf, sp = _sklearn(method, x, y, q)
                diff = float(np.max(np.abs(ours - ref) / np.maximum(np.abs(ref), 1e-300)))
                print(f"{threads:7d} {method:12s} {of:8.2f}s {op:7.2f}s {sf:12.2f}s "
                      f"{sp:9.2f}s {of / sf:9.2f}x {op / sp:7.2f}x  {diff:.1e}")  # fmt: skip
    print(f"load {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()
