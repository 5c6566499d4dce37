"""Cost of each URL method relative to CE, measured in the same run on the same backbone/batch.

For every registered method (``bayesurl.methods.available()``) this times

- one training step (forward, ``training_loss``, backward, SGD step) and
- inference (``forward(x)`` under ``torch.no_grad`` in eval mode) per sample,

and prints both divided by CE's. URL appendix C.7 (Table 1) reports epoch times between -22% and
+28% of CE for the approaches it benchmarks and 3.5x CE's inference time for full-network
MC dropout; the head-only MC dropout here targets <= 1.5x.

Methods are timed in interleaved rounds (every method once per round, ``--repeats`` rounds) and
summarised by the median, so that load drifting on a shared machine affects all alike.

Usage::

    python benchmarks/methods.py                       # small conv net, 28x28, batch 64
    python benchmarks/methods.py --backbone resnet18 --input-shape 3,64,64 --batch-size 32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch
from tqdm import tqdm

import bayesurl.methods as methods

URL_TRAIN_RANGE = (-0.22, 0.28)  # URL appendix C.7: epoch time relative to CE
MCDROPOUT_TARGET = 1.5  # head-only MC dropout inference vs CE


def build(name: str, args: argparse.Namespace) -> methods.Method:
    """Create method ``name`` with the shared backbone settings (tolerates methods that do not
    take ``num_classes``, e.g. self-supervised ones)."""
    kw: dict[str, Any] = {"backbone": args.backbone, "embed_dim": args.embed_dim}
    try:
        return methods.create(name, num_classes=args.num_classes, **kw)
    except TypeError:
        return methods.create(name, **kw)


def make_batch(method: methods.Method, args: argparse.Namespace, gen: torch.Generator):
    shape = (args.batch_size, *args.input_shape)
    x = torch.randn(shape, generator=gen)
    y = torch.randint(0, args.num_classes, (args.batch_size,), generator=gen)
    if method.two_view:
        return (x, torch.randn(shape, generator=gen)), y
    return x, y


def train_step(method: methods.Method, opt: torch.optim.Optimizer, batch) -> float:
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = method.training_loss(batch)
    loss.backward()
    opt.step()
    return time.perf_counter() - t0


def infer(method: methods.Method, x: torch.Tensor) -> float:
    t0 = time.perf_counter()
    with torch.no_grad():
        method(x)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backbone", default="small_convnet", help="timm name or small_convnet")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=20, help="timed rounds per method")
    p.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    p.add_argument("--embed-dim", type=int, default=64)
    p.add_argument("--num-classes", type=int, default=5)
    p.add_argument(
        "--input-shape",
        default=None,
        help="C,H,W of the inputs (default 1,28,28 for small_convnet, else 3,64,64)",
    )
    p.add_argument("--methods", default=None, help="comma-separated subset (CE always added)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--plot", default=None, help="write a bar chart of the ratios to this file")
    p.add_argument("--no-progress", action="store_true", help="disable the tqdm bar")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.input_shape is None:
        args.input_shape = "1,28,28" if args.backbone == "small_convnet" else "3,64,64"
    args.input_shape = tuple(int(s) for s in args.input_shape.split(","))
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    names = methods.available() if args.methods is None else args.methods.split(",")
    if "ce" not in names:
        names = ["ce", *names]
    models: dict[str, methods.Method] = {}
    failed: dict[str, str] = {}
    for name in names:
        try:
            models[name] = build(name, args)
        except Exception as err:  # report, keep benchmarking the others
            failed[name] = f"{type(err).__name__}: {err}"
    if "ce" not in models:
        print(f"CE could not be built: {failed.get('ce')}", file=sys.stderr)
        return 1

    gen = torch.Generator().manual_seed(args.seed)
    batches = {n: make_batch(m, args, gen) for n, m in models.items()}
    x_eval = torch.randn((args.batch_size, *args.input_shape), generator=gen)
    opts = {n: torch.optim.SGD(m.parameters(), lr=1e-3) for n, m in models.items()}
    train_t: dict[str, list[float]] = {n: [] for n in models}
    infer_t: dict[str, list[float]] = {n: [] for n in models}
    for m in models.values():
        m.on_epoch_start(0)

    # reference for head-only MC dropout: URL's full-network dropout needs n_passes backbone
    # passes; timed here as n_passes forwards of the CE model (dropout itself is ~free)
    full_passes = getattr(getattr(models.get("mcdropout"), "head", None), "n_passes", 10)
    full_t: list[float] = []

    rounds = args.warmup + args.repeats
    for r in tqdm(range(rounds), desc="rounds", disable=args.no_progress):
        for name in list(models):
            m = models[name]
            try:
                m.train()
                t_train = train_step(m, opts[name], batches[name])
                m.eval()
                t_inf = infer(m, x_eval)
            except Exception as err:
                failed[name] = f"{type(err).__name__}: {err}"
                del models[name]
                continue
            if r >= args.warmup:
                train_t[name].append(t_train)
                infer_t[name].append(t_inf)
        if r >= args.warmup:
            full_t.append(sum(infer(models["ce"], x_eval) for _ in range(full_passes)))

    ce_train = statistics.median(train_t["ce"])
    ce_inf = statistics.median(infer_t["ce"])
    print(
        f"\nbackbone={args.backbone} input={args.input_shape} batch={args.batch_size} "
        f"embed_dim={args.embed_dim} threads={args.threads} repeats={args.repeats} (medians)"
    )
    header = (
        f"{'method':<11} {'views':>5} {'train ms/step':>13} {'x CE':>6} {'x CE/img':>8} "
        f"{'infer ms/sample':>15} {'x CE':>6}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for name in models:
        tr = statistics.median(train_t[name])
        inf = statistics.median(infer_t[name])
        views = 2 if models[name].two_view else 1
        rows.append((name, tr / ce_train, inf / ce_inf))
        print(
            f"{name:<11} {views:>5} {1e3 * tr:>13.2f} {tr / ce_train:>6.2f} "
            f"{tr / ce_train / views:>8.2f} {1e3 * inf / args.batch_size:>15.4f} "
            f"{inf / ce_inf:>6.2f}"
        )
    for name, msg in failed.items():
        print(f"{name:<11} failed: {msg}")
    print(
        "\nviews: images per example in a training step. Two-view (self-supervised) methods "
        "push 2 x batch images,\nso 'x CE/img' divides their ratio by 2 (URL gives them "
        "smaller batches)."
    )
    lo, hi = URL_TRAIN_RANGE
    print(f"URL appendix C.7: training cost {1 + lo:.2f}x to {1 + hi:.2f}x of CE; ", end="")
    print("full-network MC dropout inference 3.5x CE.")
    if "mcdropout" in models:
        ratio = dict((n, i) for n, _, i in rows)["mcdropout"]
        verdict = "meets" if ratio <= MCDROPOUT_TARGET else "MISSES"
        print(f"head-only MC dropout inference: {ratio:.2f}x CE ({verdict} <= {MCDROPOUT_TARGET}x)")
    full = statistics.median(full_t) / ce_inf
    print(f"full-network dropout reference ({full_passes} backbone passes): {full:.2f}x CE")

    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 3.5))
        idx = range(len(rows))
        ax.bar([i - 0.2 for i in idx], [r[1] for r in rows], 0.4, label="training step")
        ax.bar([i + 0.2 for i in idx], [r[2] for r in rows], 0.4, label="inference")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(list(idx), [r[0] for r in rows], rotation=30)
        ax.set_ylabel("time / CE time")
        ax.set_title(f"cost relative to CE ({args.backbone}, batch {args.batch_size})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot written to {args.plot}")
    return 0 if not failed else 2


if __name__ == "__main__":
    sys.exit(main())
