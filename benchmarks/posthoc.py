"""Post-hoc uncertainty benchmark: cached PVU speed-up and Laplace prediction cost.

1. PVU head training from the memory-mapped embedding cache against uncached training (the
   encoder runs on every step), on the same data and epochs. The PVU paper reports 180x on GPU
   (thesis section 5.3); the target here is >= 50x on CPU. The backbone is a timm ``resnet18``
   (random weights) on 64 x 64 RGB inputs, so its forward pass dominates an uncached step.
2. ``wrap(encoder, "laplace")`` prediction time relative to the bare encoder's forward pass
   (the closed-form last-layer predictive adds a few small matrix products).

3. ``--fashion``: the issue's tutorial experiment. An encoder trained with plain
   cross-entropy on the FashionMNIST upstream classes 0-4 is wrapped three ways (PVU, TaU,
   Laplace); R-AUROC (u against "R@1 wrong", URL section 3.1) on the downstream classes 5-9
   and OOD AUROC (upstream test = in-distribution, downstream test = OOD) are compared with the
   classifier's own softmax entropy measured in the same run.

Every figure is a ratio against (or a difference to) a reference measured in the same run.

Usage::

    python benchmarks/posthoc.py [--n 512] [--epochs 2] [--batch 128] [--threads 1]
    python benchmarks/posthoc.py --fashion --skip-pvu --skip-laplace
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import timm
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import nn
from torch.utils.data import TensorDataset

from bayesurl.backbones import SmallConvNet
from bayesurl.data import (
    TransformedLoader,
    default_augmentation,
    default_transform,
    fashion_mnist,
    make_loader,
)
from bayesurl.posthoc import EmbeddingCache, wrap


def _batches(
    x: torch.Tensor, y: torch.Tensor, batch: int, transform: nn.Module, *, seed: int = 0
) -> TransformedLoader:
    """Reshuffled ``(transform(x), y)`` batches of a fixed image set, fresh draws per pass."""
    loader = make_loader(TensorDataset(x, y), batch, shuffle=True, seed=seed)
    return TransformedLoader(loader, transform)


def _flip_noise() -> nn.Module:
    """Horizontal flip and pixel noise on float images (no crop, rotation or normalisation)."""
    return default_augmentation(3, scale=(1.0, 1.0), degrees=0.0, normalize=False)


class _Encoder(nn.Module):
    """resnet18 features -> linear embedding (the last layer Laplace uses)."""

    def __init__(self, dim: int = 128) -> None:
        super().__init__()
        self.backbone = timm.create_model("resnet18", pretrained=False, num_classes=0)
        self.proj = nn.Linear(self.backbone.num_features, dim)
        self.embed_dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.backbone(x))


def _interleaved(fns: dict, repeats: int) -> dict[str, float]:
    """Median time of each function, calls interleaved so machine load hits all alike."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _timed(fn, repeats: int = 1) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_pvu(args: argparse.Namespace) -> dict[str, float]:
    torch.manual_seed(0)
    x = torch.randn(args.n, 3, 64, 64)
    y = torch.randint(0, 10, (args.n,))
    enc = _Encoder().eval()
    clf = nn.Linear(128, 10)
    progress = not args.no_progress

    uncached = wrap(enc, "pvu", classifier=clf)
    t_uncached = _timed(
        lambda: uncached.fit(
            _batches(x, y, args.batch, _flip_noise()),
            cached=False,
            epochs=args.epochs,
            progress=progress,
        )
    )
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        cache = EmbeddingCache.build(
            enc,
            _batches(x, y, args.batch, _flip_noise()),
            tmp,
            passes=args.epochs,
            progress=progress,
        )
        t_build = time.perf_counter() - t0
        cached = wrap(enc, "pvu", classifier=clf)
        t_cached = _timed(
            lambda: cached.fit(
                cache=cache, epochs=args.epochs, batch_size=args.batch, progress=False
            ),
            repeats=3,
        )
    return {"uncached": t_uncached, "cache_build": t_build, "cached": t_cached}


def bench_laplace(args: argparse.Namespace) -> dict[str, float]:
    torch.manual_seed(1)
    enc = _Encoder().eval()
    n_fit = 2 * args.batch
    fit_loader = _batches(
        torch.randn(n_fit, 3, 64, 64), torch.arange(n_fit) % 8, args.batch, _flip_noise()
    )
    wrapped = wrap(enc, "laplace", margin=1.0)
    wrapped.fit(fit_loader, progress=not args.no_progress)
    x = torch.randn(args.batch, 3, 64, 64)
    with torch.no_grad():
        enc(x)
        wrapped(x)  # warm-up
        return _interleaved(
            {
                "encoder": lambda: enc(x),
                "wrapped": lambda: wrapped(x),
                "metric_laplace_predictive": lambda: wrapped.la.predictive(x),
            },
            args.repeats,
        )


def _r1_wrong(emb: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """R@1 errors: cosine nearest neighbour (self excluded by index) has another label."""
    z = F.normalize(emb, dim=1)
    sim = z @ z.T
    sim.fill_diagonal_(-float("inf"))
    return y[sim.argmax(1)] != y


def bench_fashion(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    progress = not args.no_progress
    train, test = fashion_mnist(split="train"), fashion_mnist(split="test")
    xtr, ytr = train.images, train.targets  # uint8 [N, 1, 28, 28]
    up = ytr < 5
    xtr, ytr = xtr[up][: args.fashion_train], ytr[up][: args.fashion_train]
    xte, yte = default_transform()(test.images), test.targets
    n_eval = args.fashion_eval
    x_in, y_in = xte[yte < 5][:n_eval], yte[yte < 5][:n_eval]
    x_out, y_out = xte[yte >= 5][:n_eval], yte[yte >= 5][:n_eval]

    augment, plain = default_augmentation(), default_transform()
    enc = SmallConvNet(1, num_features=64, width=16)
    clf = nn.Linear(64, 5)
    opt = torch.optim.Adam([*enc.parameters(), *clf.parameters()], lr=2e-3)
    t0 = time.perf_counter()
    enc.train()
    for _ in range(args.fashion_epochs):
        for xb, yb in _batches(xtr, ytr, 128, augment, seed=args.seed):
            loss = F.cross_entropy(clf(enc(xb)), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    enc.eval()
    print(
        f"\nFashionMNIST: CE encoder (SmallConvNet w16, 64-d) on classes 0-4, "
        f"{len(xtr)} images x {args.fashion_epochs} epochs in {time.perf_counter() - t0:.0f} s"
    )

    def scores(fn):
        with torch.no_grad():
            return torch.cat([fn(x_in[i : i + 500]) for i in range(0, n_eval, 500)]), torch.cat(
                [fn(x_out[i : i + 500]) for i in range(0, n_eval, 500)]
            )

    with torch.no_grad():
        emb_out = torch.cat([enc(x_out[i : i + 500]) for i in range(0, n_eval, 500)])
        acc = (
            (
                clf(torch.cat([enc(x_in[i : i + 500]) for i in range(0, n_eval, 500)])).argmax(1)
                == y_in
            )
            .float()
            .mean()
        )
    wrong = _r1_wrong(emb_out, y_out).numpy()
    print(
        f"  upstream test accuracy {float(acc):.3f}; downstream R@1 {1 - wrong.mean():.3f} "
        "(the same for every wrapper: embeddings are unchanged)"
    )

    rows = {}
    rows["CE softmax entropy (reference)"] = (
        scores(lambda x: torch.special.entr(clf(enc(x)).softmax(1)).sum(1)),
        0.0,
    )
    w = wrap(enc, "pvu", classifier=clf)
    t0 = time.perf_counter()
    w.fit(
        _batches(xtr, ytr, 128, augment, seed=args.seed),
        epochs=args.fashion_epochs,
        lr=1e-3,
        progress=progress,
    )
    rows["wrap(enc, 'pvu', classifier=clf)"] = (
        scores(lambda x: w(x).uncertainty),
        (time.perf_counter() - t0),
    )
    w = wrap(enc, "tau")
    t0 = time.perf_counter()
    w.fit(
        _batches(xtr, ytr, 128, nn.Identity(), seed=args.seed),
        augment=augment,
        epochs=args.fashion_epochs,
        lr=1e-2,
        progress=progress,
    )
    rows["wrap(enc, 'tau')"] = scores(lambda x: w(x).uncertainty), time.perf_counter() - t0
    for name, opts in (
        ("wrap(enc, 'laplace', classifier=clf)", {"classifier": clf}),
        ("wrap(enc, 'laplace') [metric, LAM]", {}),
    ):
        try:
            w = wrap(enc, "laplace", **opts)
        except ImportError:
            print(f"  (bayesurl.laplace is not installed: no row for {name})")
            continue
        t0 = time.perf_counter()
        try:
            w.fit(_batches(xtr, ytr, 256, plain, seed=args.seed), progress=progress)
        except ValueError as exc:
            print(f"  {name}: fit failed: {exc}")
            continue
        rows[name] = scores(lambda x, w=w: w(x).uncertainty), time.perf_counter() - t0

    print(f"\n  {'u(x)':38s} {'R-AUROC':>8s} {'OOD AUROC':>10s}   fit time")
    ref = None
    table = []
    for name, ((u_in, u_out), secs) in rows.items():
        r_auroc = roc_auc_score(wrong, u_out.numpy())
        ood = roc_auc_score(
            np.r_[np.zeros(len(u_in)), np.ones(len(u_out))], torch.cat([u_in, u_out]).numpy()
        )
        table.append((name, r_auroc, ood))
        if ref is None:
            ref = (r_auroc, ood)
            print(f"  {name:38s} {r_auroc:8.3f} {ood:10.3f}")
        else:
            print(
                f"  {name:38s} {r_auroc:8.3f} {ood:10.3f}   {secs:6.1f} s"
                f"   (vs reference {r_auroc - ref[0]:+.3f} / {ood - ref[1]:+.3f})"
            )

    if args.plot:
        _plot(table, args.plot)


def _plot(table: list[tuple[str, float, float]], path: str) -> None:
    """Grouped bars of R-AUROC and OOD AUROC per u(x), chance level dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [
        t[0].replace("wrap(enc, ", "").replace(")", "", 1) if t[0].startswith("wrap(") else t[0]
        for t in table
    ]
    pos = np.arange(len(table))
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.bar(pos - 0.2, [t[1] for t in table], 0.4, label="R-AUROC (downstream)")
    ax.bar(pos + 0.2, [t[2] for t in table], 0.4, label="OOD AUROC")
    ax.axhline(0.5, color="grey", ls="--", lw=1)
    ax.set_xticks(pos, names, rotation=15, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_title("Post-hoc u(x) on a CE encoder, FashionMNIST 0-4 -> 5-9")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"  plot written to {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=512, help="images per epoch")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5, help="timing repeats (median)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-laplace", action="store_true")
    p.add_argument("--skip-pvu", action="store_true")
    p.add_argument("--fashion", action="store_true", help="run the FashionMNIST comparison")
    p.add_argument("--fashion-train", type=int, default=12000)
    p.add_argument("--fashion-eval", type=int, default=5000)
    p.add_argument("--fashion-epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0, help="--fashion: seed of the whole run")
    p.add_argument("--plot", default=None, help="--fashion: save a bar chart (PNG) here")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), resnet18 @ 64x64, "
        f"N={args.n}, epochs={args.epochs}, batch={args.batch}"
    )

    if args.fashion:
        bench_fashion(args)
    if not args.skip_pvu:
        r = bench_pvu(args)
        print("\nPVU head training, same data and epochs (PVU reports 180x on GPU; target >= 50x)")
        print(f"  uncached (encoder every step) : {r['uncached']:8.3f} s   (reference)")
        print(
            f"  cached (memory-mapped)        : {r['cached']:8.3f} s   "
            f"speed-up {r['uncached'] / r['cached']:7.1f}x"
        )
        print(
            f"  cache build (once)            : {r['cache_build']:8.3f} s   "
            f"{r['cache_build'] / r['uncached']:.2f}x the uncached run"
        )
        print(
            f"  build + cached training       : {r['cache_build'] + r['cached']:8.3f} s   "
            f"speed-up {r['uncached'] / (r['cache_build'] + r['cached']):7.2f}x (single run)"
        )

    if not args.skip_laplace:
        r = bench_laplace(args)
        print(
            f"\nwrap(encoder, 'laplace') prediction, batch {args.batch} (median of {args.repeats})"
        )
        print(f"  bare encoder                  : {r['encoder'] * 1e3:8.2f} ms  (reference)")
        print(
            f"  wrapped (closed form u)       : {r['wrapped'] * 1e3:8.2f} ms  "
            f"{r['wrapped'] / r['encoder']:.3f}x"
        )
        print(
            f"  MetricLaplace.predictive      : {r['metric_laplace_predictive'] * 1e3:8.2f} ms"
            f"  {r['metric_laplace_predictive'] / r['encoder']:.3f}x"
        )


if __name__ == "__main__":
    main()
