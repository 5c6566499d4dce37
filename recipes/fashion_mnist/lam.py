"""LAM's closed-set protocol on FashionMNIST, digits as OOD (LAM section 4, Table 2).

Methods: deterministic contrastive training, post-hoc LAM and online LAM on the grid
{fixed, positive, full} x {euclidean, arccos} (LAM Table 1), and MC dropout. A small conv net
(:class:`bayesurl.backbones.SmallConvNet`) ending in a linear embedding layer is trained with
the contrastive loss of LAM eq. 1 (:class:`bayesurl.losses.contrastive.ContrastiveLoss`);
retrieval is evaluated on the FashionMNIST test set (leave-one-out kNN), OOD on sklearn's
digits upsampled to 28 x 28. Metrics (:func:`bayesurl.evaluation.evaluate`): mAP@1/5/10,
OOD AUROC / AUPRC (u of ID vs OOD), AUSC, retrieval ECE from the posterior samples.

Writes ``results.json``, ``table.md`` and ``ood_auroc.png`` to ``--out``.

Run: ``python recipes/fashion_mnist/lam.py --seeds 3 --epochs 5`` (``--quick`` for a smoke
run of a few minutes on two CPU cores).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

from bayesurl.backbones import SmallConvNet
from bayesurl.evaluation import evaluate
from bayesurl.laplace import MetricLaplace, train_contrastive, train_online

APPROXIMATIONS = ("fixed", "positive", "full")
GEOMETRIES = ("euclidean", "arccos")
METRICS = ("map@1", "map@5", "map@10", "ood_auroc", "ood_auprc", "ausc", "ece")
LAM_TABLE2 = {  # LAM Table 2, FashionMNIST vs MNIST (mAP@1, AUROC, AUSC, ECE)
    "online LAM (paper)": {"map@1": 0.81, "ood_auroc": 0.98, "ausc": 0.89, "ece": 0.02},
    "post-hoc LAM (paper)": {"map@1": 0.78, "ood_auroc": 0.96, "ausc": 0.86, "ece": 0.03},
}


def load_data(n_train: int, n_test: int, n_ood: int, seed: int) -> dict[str, Tensor]:
    """FashionMNIST train/test subsets and upsampled digits, standardised float tensors."""
    from bayesurl.data import digits, fashion_mnist

    g = torch.Generator().manual_seed(seed)

    def take(ds: Any, n: int) -> tuple[Tensor, Tensor]:
        idx = torch.randperm(len(ds), generator=g)[: min(n, len(ds))]
        x = ds.images[idx].float() / 255.0
        return (x - 0.2860) / 0.3530, ds.targets[idx]

    xtr, ytr = take(fashion_mnist(split="train"), n_train)
    xte, yte = take(fashion_mnist(split="test"), n_test)
    xood, _ = take(digits(size=28), n_ood)
    return {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte, "x_ood": xood}


def embed(model: nn.Module, x: Tensor, batch_size: int = 512) -> Tensor:
    model.eval()
    with torch.no_grad():
        return torch.cat([model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)])


def batched(fn: Callable[[Tensor], Any], x: Tensor, batch_size: int = 512) -> list[Any]:
    return [fn(x[i : i + batch_size]) for i in range(0, len(x), batch_size)]


def mc_dropout_samples(model: nn.Module, x: Tensor, n: int, seed: int) -> Tensor:
    """``[n, N, D]`` normalised embeddings with only the dropout layers in train mode."""
    model.eval()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.train()
    torch.manual_seed(seed)
    with torch.no_grad():
        out = torch.stack([F.normalize(embed_keep_mode(model, x), dim=1) for _ in range(n)])
    model.eval()
    return out


def embed_keep_mode(model: nn.Module, x: Tensor, batch_size: int = 512) -> Tensor:
    return torch.cat([model(x[i : i + batch_size]) for i in range(0, len(x), batch_size)])


def score(
    emb: Tensor,
    labels: Tensor,
    u: Tensor | None,
    u_ood: Tensor | None,
    samples: Tensor | None,
) -> dict[str, float | None]:
    res = evaluate(
        emb,
        labels,
        uncertainties=u,
        samples=samples,
        ood_uncertainties=u_ood,
        ks=(1, 5, 10),
        map_ks=(1, 5, 10),
    )
    return {k: res.get(k) for k in METRICS}


def lam_scores(la: Any, data: dict[str, Tensor], n_samples: int, seed: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    outs = batched(lambda xb: la.predictive(xb, n_samples=n_samples, generator=gen), data["x_test"])
    ood = batched(lambda xb: la.predictive(xb), data["x_ood"])
    emb = torch.cat([o.embedding for o in outs])
    u = torch.cat([o.uncertainty for o in outs])
    samples = torch.cat([o.samples for o in outs], dim=1) if n_samples > 0 else None
    u_ood = torch.cat([o.uncertainty for o in ood])
    res = score(emb, data["y_test"], u, u_ood, samples)
    res["clamped_fraction"] = la.clamped_fraction
    res["prior_precision"] = float(la.prior_precision.mean())
    return res


def tune_prior(la: Any) -> str:
    """Marginal-likelihood prior precision; if every Hessian entry is clamped, keep the prior
    and say so (the posterior then equals the prior)."""
    try:
        la.optimize_prior_precision()
    except ValueError as exc:
        tqdm.write(f"  prior kept at {float(la.prior_precision.mean()):g}: {exc}")
        return "all Hessian entries clamped; prior precision not tuned"
    return ""


def make_model(args: argparse.Namespace, dropout: float = 0.0) -> nn.Module:
    return SmallConvNet(num_features=args.embed_dim, width=args.width, dropout=dropout)


def run_seed(args: argparse.Namespace, seed: int, data: dict[str, Tensor]) -> list[dict]:
    rows: list[dict] = []
    n_train = len(data["y_train"])

    def loader(shuffle_seed: int) -> DataLoader:
        g = torch.Generator().manual_seed(shuffle_seed)
        ds = TensorDataset(data["x_train"], data["y_train"])
        return DataLoader(ds, batch_size=args.batch_size, shuffle=True, generator=g)

    def record(method: str, res: dict, seconds: float, **extra: Any) -> None:
        rows.append({"method": method, "seed": seed, "train_s": seconds, **extra, **res})
        tqdm.write(
            f"seed {seed} {method:34s} "
            + " ".join(f"{k}={v:.3f}" for k, v in res.items() if isinstance(v, float))
        )

    # deterministic (also the MAP of post-hoc LAM)
    torch.manual_seed(seed)
    det = make_model(args)
    opt = torch.optim.Adam(det.parameters(), lr=args.lr)
    t = time.perf_counter()
    train_contrastive(
        det, loader(seed), opt, args.epochs, margin=args.margin, progress=args.progress
    )
    t_det = time.perf_counter() - t
    record(
        "deterministic", score(embed(det, data["x_test"]), data["y_test"], None, None, None), t_det
    )

    # post-hoc LAM on the deterministic model
    for approximation, geometry in itertools.product(APPROXIMATIONS, GEOMETRIES):
        la = MetricLaplace(det, approximation=approximation, geometry=geometry, margin=args.margin)
        t = time.perf_counter()
        fit_loader = DataLoader(TensorDataset(data["x_train"], data["y_train"]), args.batch_size)
        la.fit(fit_loader, progress=args.progress)
        note = tune_prior(la)
        t_fit = time.perf_counter() - t
        res = lam_scores(la, data, args.n_samples, seed)
        if note:
            res["note"] = note
        record(f"post-hoc LAM {approximation}/{geometry}", res, t_det + t_fit)

    # online LAM, one training per grid cell
    for approximation, geometry in itertools.product(APPROXIMATIONS, GEOMETRIES):
        torch.manual_seed(seed)
        model = make_model(args)
        la = MetricLaplace(
            model,
            mode="online",
            approximation=approximation,
            geometry=geometry,
            margin=args.margin,
            prior_precision=args.online_prior,
            alpha=args.alpha,
            dataset_size=n_train,
        )
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        t = time.perf_counter()
        train_online(
            la,
            loader(seed),
            opt,
            args.epochs,
            generator=torch.Generator().manual_seed(seed),
            optimize_prior_every=args.prior_every or None,
            progress=args.progress,
        )
        t_on = time.perf_counter() - t
        note = tune_prior(la) if args.prior_every else ""
        res = lam_scores(la, data, args.n_samples, seed)
        if note:
            res["note"] = note
        record(f"online LAM {approximation}/{geometry}", res, t_on)

    # MC dropout
    torch.manual_seed(seed)
    mc = make_model(args, dropout=args.dropout)
    opt = torch.optim.Adam(mc.parameters(), lr=args.lr)
    t = time.perf_counter()
    train_contrastive(
        mc, loader(seed), opt, args.epochs, margin=args.margin, progress=args.progress
    )
    t_mc = time.perf_counter() - t
    s_test = mc_dropout_samples(mc, data["x_test"], args.n_samples, seed)
    s_ood = mc_dropout_samples(mc, data["x_ood"], args.n_samples, seed + 1)
    from bayesurl.evaluation.functional import uncertainty_from_samples

    res = score(
        None,
        data["y_test"],
        uncertainty_from_samples(s_test),
        uncertainty_from_samples(s_ood),
        s_test,
    )
    record("MC dropout", res, t_mc)
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    out = []
    for method in dict.fromkeys(r["method"] for r in rows):
        rs = [r for r in rows if r["method"] == method]
        agg: dict[str, Any] = {"method": method, "n_seeds": len(rs)}
        for k in (*METRICS, "clamped_fraction", "train_s"):
            vals = [r[k] for r in rs if isinstance(r.get(k), (int, float))]
            if vals:
                agg[k] = (float(np.mean(vals)), float(np.std(vals)))
        out.append(agg)
    return out


def table(summary: list[dict]) -> str:
    cols = (*METRICS, "clamped_fraction", "train_s")
    lines = [
        "| method | " + " | ".join(cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for s in summary:
        cells = []
        for c in cols:
            if c in s:
                m, sd = s[c]
                cells.append(f"{m:.3f} ± {sd:.3f}" if c != "train_s" else f"{m:.0f}")
            else:
                cells.append("n/a")
        lines.append(f"| {s['method']} | " + " | ".join(cells) + " |")
    for name, vals in LAM_TABLE2.items():
        lines.append(
            f"| {name} | " + " | ".join(f"{vals[c]:.2f}" if c in vals else "" for c in cols) + " |"
        )
    return "\n".join(lines)


def plot(summary: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s["method"] for s in summary if "ood_auroc" in s]
    means = [s["ood_auroc"][0] for s in summary if "ood_auroc" in s]
    sds = [s["ood_auroc"][1] for s in summary if "ood_auroc" in s]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(names) + 1.5))
    ax.barh(names, means, xerr=sds, color="tab:blue", alpha=0.8)
    ax.axvline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("OOD AUROC (FashionMNIST vs digits)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3, help="number of seeds (0, 1, ...)")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="small data, 1 seed, 1 epoch")
    p.add_argument("--n-train", type=int, default=10000)
    p.add_argument("--n-test", type=int, default=2000)
    p.add_argument("--n-ood", type=int, default=1797)
    p.add_argument("--n-samples", type=int, default=32, help="posterior draws for ECE")
    p.add_argument("--embed-dim", type=int, default=32)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--margin", type=float, default=0.2)
    p.add_argument("--alpha", type=float, default=1e-3, help="online Hessian memory (eq. 5)")
    p.add_argument("--online-prior", type=float, default=1.0)
    p.add_argument(
        "--prior-every",
        type=int,
        default=50,
        help="online: marglik prior update every k steps (0 = LAM's fixed prior)",
    )
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--out", type=Path, default=Path("results/fashion_mnist_lam"))
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.epochs = 1, 1
        args.n_train, args.n_test, args.n_ood, args.n_samples = 2000, 500, 500, 16
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for seed in tqdm(range(args.seeds), desc="seeds", disable=not args.progress):
        data = load_data(args.n_train, args.n_test, args.n_ood, seed)
        rows.extend(run_seed(args, seed, data))
        summary = summarise(rows)
        (args.out / "results.json").write_text(
            json.dumps(
                {
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "runs": rows,
                    "summary": summary,
                    "paper": LAM_TABLE2,
                },
                indent=1,
            )
        )
    summary = summarise(rows)
    text = table(summary)
    (args.out / "table.md").write_text(text + "\n")
    plot(summary, args.out / "ood_auroc.png")
    print(text)
    auroc = {s["method"]: s["ood_auroc"][0] for s in summary if "ood_auroc" in s}
    best_online = max((v for k, v in auroc.items() if k.startswith("online")), default=float("nan"))
    best_posthoc = max(
        (v for k, v in auroc.items() if k.startswith("post-hoc")), default=float("nan")
    )
    mc = auroc.get("MC dropout", float("nan"))
    print(
        f"\nOOD AUROC best online {best_online:.3f}, best post-hoc {best_posthoc:.3f}, "
        f"MC dropout {mc:.3f}; online > post-hoc > MC dropout holds: "
        f"{best_online > best_posthoc > mc}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
