"""Recipe: the MCInfoNCE controlled experiment (MCI section 5.1, appendix B, Tables 1 / 3).

Trains a probabilistic encoder on contrastive pairs from a known vMF generative process and
reports how well it recovers the true posteriors: Spearman and mean absolute difference of
pairwise cosines (location) and of kappa (certainty), mean +- standard error over seeds.

Examples
--------
The paper's D = 2 protocol (Table 6: batch 512, 512 MC samples, 8,192 batches)::

    python examples/controlled/mcinfonce.py --dim 2 --seeds 0 1 2 3 4 --out d2.json

ELK / HIB rows (Table 3; the authors trained both jointly, not phase-wise)::

    python examples/controlled/mcinfonce.py --dim 2 --loss elk --joint
    python examples/controlled/mcinfonce.py --dim 2 --loss hib --joint

D = 10 "ambiguous" (Table 1: 100,000 batches, M = 32 negatives in the kappa phase)::

    python examples/controlled/mcinfonce.py --dim 10 --batches 100000 --negatives 32

The set-up and commands behind ``results/controlled/`` are on the docs page "The MCInfoNCE
controlled experiment" (``docs/controlled_experiment.rst``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import torch

from bayesurl.experiments.controlled import ControlledConfig, run_controlled

METRICS = ("location_mae", "location_spearman", "certainty_mae", "certainty_spearman")


def build_parser() -> argparse.ArgumentParser:
    """Command-line options (defaults: the paper's D = 2 row of Table 6)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=2, help="latent = input dimension D (2)")
    p.add_argument("--loss", choices=["mcinfonce", "elk", "hib"], default="mcinfonce")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--batches", type=int, default=8192, help="training batches (8192)")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--samples", type=int, default=512, help="MC samples per posterior (512)")
    p.add_argument(
        "--negatives", type=int, default=1, help="M negatives per anchor in the kappa phase (1)"
    )
    p.add_argument(
        "--mu-negatives", type=int, default=0, help="M in the mu phase; 0 = rolled in-batch"
    )
    p.add_argument("--joint", action="store_true", help="train mu and kappa jointly")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument(
        "--kappa-lr", type=float, default=None, help="base lr of kappa_hat (default: schedule)"
    )
    p.add_argument("--lr-decay", type=float, default=0.1, help="lr factor per quarter (0.1)")
    p.add_argument(
        "--smooth-steps",
        type=int,
        default=0,
        help="smooth the generator's mu for this many steps (authors' code: 5000; 0: off)",
    )
    p.add_argument(
        "--acceptance",
        choices=["eq53", "vmf"],
        default="eq53",
        help="positive rejection rule: the paper's eq. 53 (default) or proportional to the vMF",
    )
    p.add_argument("--kappa-min", type=float, default=16.0)
    p.add_argument("--kappa-max", type=float, default=32.0)
    p.add_argument("--kappa-pos", type=float, default=20.0)
    p.add_argument("--hib-scale", type=float, default=1.0, help="a of MCI eq. 54")
    p.add_argument("--hib-bias", type=float, default=0.0, help="b of MCI eq. 54")
    p.add_argument(
        "--divide-positive",
        action="store_true",
        help="MCInfoNCE denominator as printed in eq. 7 (positive / M too), not the code's",
    )
    p.add_argument(
        "--mu-inits",
        type=int,
        default=1,
        help="best of this many mu initialisations by a warm-up's validation loss (1: off)",
    )
    p.add_argument("--mu-warmup", type=int, default=512, help="warm-up batches per mu init")
    p.add_argument("--n-eval", type=int, default=10_000, help="fresh evaluation inputs")
    p.add_argument("--eval-every", type=int, default=0, help="intermediate evaluations")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", type=Path, default=None, help="JSON file for the results")
    p.add_argument("--plot-dir", type=Path, default=None, help="save one figure per seed")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    return p


def summarise(runs: list[dict]) -> dict[str, dict[str, float]]:
    """Mean and standard error (std / sqrt(n), as in the paper's tables) over seeds."""
    out = {}
    for m in METRICS:
        vals = torch.tensor([r["metrics"][m] for r in runs], dtype=torch.float64)
        se = float(vals.std(unbiased=True) / math.sqrt(len(vals))) if len(vals) > 1 else 0.0
        out[m] = {"mean": float(vals.mean()), "stderr": se}
    return out


def main(argv: list[str] | None = None) -> dict:
    """Run every seed, print a table row per seed and the summary, write the JSON."""
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.eval_every:  # one line per intermediate evaluation (the run may take hours)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    runs = []
    t0 = time.perf_counter()
    for seed in args.seeds:
        cfg = ControlledConfig(
            dim=args.dim,
            loss=args.loss,
            seed=seed,
            kappa_min=args.kappa_min,
            kappa_max=args.kappa_max,
            kappa_pos=args.kappa_pos,
            batch_size=args.batch_size,
            n_batches=args.batches,
            n_samples=args.samples,
            n_negatives=args.negatives,
            mu_negatives=args.mu_negatives,
            phasewise=not args.joint,
            lr=args.lr,
            lr_decay=args.lr_decay,
            smooth_steps=args.smooth_steps,
            acceptance=args.acceptance,
            kappa_lr=args.kappa_lr,
            hib_scale=args.hib_scale,
            hib_bias=args.hib_bias,
            divide_positive=args.divide_positive,
            mu_inits=args.mu_inits,
            mu_warmup=args.mu_warmup,
            n_eval=args.n_eval,
            eval_every=args.eval_every,
        )
        plot = None
        if args.plot_dir is not None:
            os.makedirs(args.plot_dir, exist_ok=True)
            plot = str(args.plot_dir / f"{args.loss}_d{args.dim}_seed{seed}.png")
        res = run_controlled(cfg, progress=not args.no_progress, plot_path=plot)
        runs.append(res)
        m = res["metrics"]
        print(
            f"seed {seed}: location MAE {m['location_mae']:.3f} rank {m['location_spearman']:.3f}"
            f" | certainty MAE {m['certainty_mae']:.2f} rank {m['certainty_spearman']:.3f}"
            f" | {res['seconds']['total']:.0f}s",
            flush=True,
        )
    summary = summarise(runs)
    print(
        f"{args.loss} D={args.dim} ({len(runs)} seeds): "
        + ", ".join(f"{k} {v['mean']:.3f} +- {v['stderr']:.3f}" for k, v in summary.items())
    )
    result = {
        "experiment": "MCInfoNCE controlled experiment (MCI section 5.1, appendix B)",
        "argv": sys.argv[1:] if argv is None else argv,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "summary": summary,
        "runs": runs,
        "seconds": time.perf_counter() - t0,
        "torch": torch.__version__,
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
