"""Plot a ``--tune`` search: each estimator's validation R-AUROC against its learning rate.

Reads the Optuna studies ``tune:<sweep>:<estimator>`` of a sweep storage (what
``bayesurl benchmark --tune N`` fills) and draws one panel per estimator: every finished trial
(discarded ones, R@1 < 0.1, as crosses at the bottom), the chosen trial ringed, and the
recipe's default rate as a dashed line. The rate is ``train.lr`` for a trained estimator and
``estimator.fit.lr`` for a post-hoc wrapper. Usage (repository root)::

    python tools/tuning_plot.py sqlite:///results/pretrained/tuning/tune.db \\
        --sweep pretrained --out results/pretrained/tuning/tuning.png
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import optuna  # noqa: E402

from bayesurl.runs.config import load_recipe  # noqa: E402

RATE_KEYS = ("train.lr", "estimator.fit.lr")


def studies(url: str, sweep: str) -> dict[str, optuna.Study]:
    """The tuning studies of ``sweep`` in the storage ``url``, by estimator."""
    prefix = f"tune:{sweep}:"
    out = {}
    for s in optuna.get_all_study_summaries(url):
        if s.study_name.startswith(prefix):
            out[s.study_name[len(prefix) :]] = optuna.load_study(
                study_name=s.study_name, storage=url
            )
    return out


def default_rate(estimator: str, key: str, dataset: str) -> float | None:
    """The recipe's rate of ``estimator`` without any preset (the untuned default)."""
    try:
        cfg = load_recipe(f"{dataset}/{estimator}")
    except ValueError:
        return None
    if key == "train.lr":
        return float(cfg.train.lr)
    fit = cfg.estimator.fit or {}
    return float(fit["lr"]) if "lr" in fit else None


def plot(url: str, sweep: str, out: Path, dataset: str = "fashion_mnist") -> Path:
    found = {k: v for k, v in studies(url, sweep).items() if v.trials}
    if not found:
        raise SystemExit(f"no tuning studies of sweep {sweep!r} in {url}")
    cols = 4
    rows = math.ceil(len(found) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    for ax, (name, study) in zip(axes.flat, found.items()):
        trials = study.get_trials(deepcopy=False)
        key = next((k for k in RATE_KEYS if any(k in t.params for t in trials)), None)
        if key is None:
            ax.set_visible(False)
            continue
        done = [t for t in trials if t.state.name == "COMPLETE"]
        pruned = [t for t in trials if t.state.name == "PRUNED"]
        ax.scatter([t.params[key] for t in done], [t.value for t in done], s=14, color="C0")
        if done:
            best = max(done, key=lambda t: t.value)
            ax.scatter(best.params[key], best.value, s=80, facecolors="none", edgecolors="C3")
            low = min(t.value for t in done)
            ax.scatter([t.params[key] for t in pruned], [low] * len(pruned), marker="x",
                       color="0.5", s=14)  # fmt: skip
        d = default_rate(name, key, dataset)
        if d is not None:
            ax.axvline(d, color="0.4", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(key, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(found) :]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("validation R-AUROC", fontsize=8)
    fig.suptitle(
        f"--tune of sweep '{sweep}': trials (dots), chosen (ring), recipe default (dashed)",
        fontsize=10,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("storage", help="SQLAlchemy URL of the sweep storage")
    ap.add_argument("--sweep", required=True, help="the sweep (preset) name")
    ap.add_argument("--out", type=Path, default=Path("tuning.png"))
    ap.add_argument("--dataset", default="fashion_mnist", help="recipe of the defaults")
    a = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(plot(a.storage, a.sweep, a.out, a.dataset))


if __name__ == "__main__":
    main()
