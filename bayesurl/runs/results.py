"""Sweep results: one row per (estimator, seed), aggregated over seeds into one table.

:class:`SweepResults` holds the flat records of :meth:`bayesurl.runs.runner.RunResult.record`
and the sweep's settings; it prints the benchmark table (mean +- std over seeds, URL section
3 / LAM section 5 metrics), writes JSON / CSV, plots R@1 against R-AUROC (URL Fig. 2), and
:func:`merge_results` combines sweeps made separately (e.g. one seed per machine).
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bayesurl.files import atomic_open, write_json
from bayesurl.runs.report import FREE_BASELINES, best_free_baseline

__all__ = ["EXTRA_METRICS", "METRICS", "SweepResults", "format_stat", "merge_results"]

#: Metrics of the table: ``(result key, column title)``.
METRICS: tuple[tuple[str, str], ...] = (
    ("r@1", "R@1"),
    ("r_auroc", "R-AUROC"),
    ("ausc", "AUSC"),
    ("ece", "ECE"),
    ("ood_auroc", "OOD AUROC"),
    ("train_time", "train [s]"),
)

#: Further numbers kept per run and aggregated (JSON / CSV), not shown in the table.
EXTRA_METRICS: tuple[str, ...] = (
    "ause",
    "ood_auprc",
    "map@5",
    "eval_time",
    "train_cpu_time",
    "final_loss",
)


def _mean_std(values: Sequence[float | None]) -> dict[str, Any]:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else None
    return {"mean": mean, "std": std, "n": len(vals)}


def format_stat(stat: Mapping[str, Any], key: str) -> str:
    """``"0.512 +- 0.010"`` (one decimal for times; ``"n/a"`` without a mean)."""
    if stat.get("mean") is None:
        return "n/a"
    digits = 1 if key.endswith("_time") else 3
    s = f"{stat['mean']:.{digits}f}"
    if stat.get("std") is not None:
        s += f" +- {stat['std']:.{digits}f}"
    return s


@dataclass
class SweepResults:
    """Everything a sweep (:func:`bayesurl.runs.sweep.run_sweep`) measured.

    Attributes
    ----------
    runs : list of dict
        One record per (estimator, seed): ``estimator``, ``seed``, every metric of
        :func:`bayesurl.runs.predict.score`, ``train_time`` (wall seconds),
        ``train_cpu_time`` (process CPU seconds, all threads), ``final_loss``, ``steps``,
        ``error`` (``None`` or the exception text of a failed run; its metrics are then
        ``None``).
    settings : dict
        Preset, recipes, data sizes, device, ``world_size`` (processes of a ``torchrun``
        sweep), versions, total wall time.
    main_process : bool
        False on the ranks other than 0 of a ``torchrun`` sweep (they neither write nor
        report; not serialised).
    status : dict or None
        Counts of the sweep's plan (``waiting``, ``running``, ``complete``, ``failed``,
        ``total``; ``None`` on the ranks other than 0 of a stored sweep under torchrun).
    done_here : int
        Runs this process finished.
    paths : dict
        Files written (empty until every run of the plan is finished).
    """

    runs: list[dict[str, Any]]
    settings: dict[str, Any]
    main_process: bool = field(default=True, repr=False, compare=False)
    status: dict[str, int] | None = field(default=None, repr=False, compare=False)
    done_here: int = field(default=0, repr=False, compare=False)
    paths: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def estimators(self) -> list[str]:
        """Method names in run order."""
        return list(dict.fromkeys(r["estimator"] for r in self.runs))

    def summary(self) -> dict[str, dict[str, dict[str, Any]]]:
        """``{estimator: {metric: {"mean", "std", "n"}}}`` over the seeds (std with ddof 1).

        A metric that is ``None`` in every run (the ECE of an estimator without a distribution)
        has ``mean = std = None`` and ``n = 0``; std is ``None`` with a single seed.
        """
        out: dict[str, dict[str, dict[str, Any]]] = {}
        keys = [k for k, _ in METRICS] + list(EXTRA_METRICS)
        for m in self.estimators:
            runs = [r for r in self.runs if r["estimator"] == m]
            out[m] = {k: _mean_std([r.get(k) for r in runs]) for k in keys}
            out[m]["failed"] = {"mean": None, "std": None, "n": sum(bool(r["error"]) for r in runs)}
        return out

    def table(self) -> str:
        """The benchmark table: one row per estimator, mean +- std over seeds."""
        summ = self.summary()
        head = ["estimator", *(title for _, title in METRICS)]
        rows = []
        for m in self.estimators:
            row = [m] + [format_stat(summ[m][k], k) for k, _ in METRICS]
            if summ[m]["failed"]["n"]:
                row[0] += f" ({summ[m]['failed']['n']} failed)"
            rows.append(row)
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        fmt = lambda r: "  ".join(  # noqa: E731
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
        )
        s = self.settings
        seeds = ",".join(str(x) for x in s.get("seeds", []))
        lines = [
            f"bayesurl benchmark: preset {s.get('preset')}, data {s.get('dataset')}, "
            f"seeds {seeds}, device {s.get('device')}",
            fmt(head),
            fmt(["-" * w for w in widths]),
            *(fmt(r) for r in rows),
            "ECE n/a: the estimator has only a scalar u (no distribution to sample; see the "
            "docs, Concepts > Metrics).",
        ]
        free = best_free_baseline(summ)
        if free is not None:
            ref = summ[free]["r_auroc"]["mean"]
            above = [
                f"{m} {summ[m]['r_auroc']['mean']:.3f}"
                for m in self.estimators
                if m not in FREE_BASELINES
                and summ[m]["r_auroc"]["mean"] is not None
                and summ[m]["r_auroc"]["mean"] > ref
            ]
            lines.append(
                f"R-AUROC above the best free baseline ({free} {ref:.3f}): "
                f"{', '.join(above) or 'none'} (means; the paired test needs class splits)"
            )
        errors = [r for r in self.runs if r["error"]]
        lines += [f"FAILED {r['estimator']} seed {r['seed']}: {r['error']}" for r in errors]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{"settings", "summary", "runs"}``."""
        return {"settings": self.settings, "summary": self.summary(), "runs": self.runs}

    def write_json(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_dict` as JSON (``null`` where a metric is undefined)."""
        return write_json(path, self.to_dict(), indent=2, default=str)

    def write_csv(self, path: str | os.PathLike[str]) -> Path:
        """One row per estimator: ``n_seeds``, ``failed`` and ``<metric>_mean`` / ``_std``."""
        p = Path(path)
        summ = self.summary()
        keys = [k for k, _ in METRICS] + list(EXTRA_METRICS)
        cols = ["estimator", "n_seeds", "failed"] + [
            f"{k}_{s}" for k in keys for s in ("mean", "std")
        ]
        with atomic_open(p, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for m in self.estimators:
                n = sum(r["estimator"] == m for r in self.runs)
                row: list[Any] = [m, n, summ[m]["failed"]["n"]]
                for k in keys:
                    for s in ("mean", "std"):
                        v = summ[m][k][s]
                        row.append("" if v is None else f"{v:.10g}")
                w.writerow(row)
        return p

    def plot(self, path: str | os.PathLike[str] | None = None) -> Any:
        """R@1 against R-AUROC, one point per estimator with +- std bars (URL Fig. 2).

        Uses :func:`bayesurl.evaluation.plots.plot_recall_vs_rauroc` on a figure that needs no GUI
        backend; the dashed line marks R-AUROC = 0.5 (u carries no information).

        Returns
        -------
        matplotlib.figure.Figure
        """
        from matplotlib.figure import Figure

        from bayesurl.evaluation import plot_recall_vs_rauroc

        summ = self.summary()
        fig = Figure(figsize=(5.5, 4.2))
        ax = fig.add_subplot(1, 1, 1)
        means = {
            m: {"r@1": summ[m]["r@1"]["mean"], "r_auroc": summ[m]["r_auroc"]["mean"]}
            for m in self.estimators
        }
        plot_recall_vs_rauroc(means, ax=ax)
        for m in self.estimators:
            r1, ra = summ[m]["r@1"], summ[m]["r_auroc"]
            if r1["mean"] is None or ra["mean"] is None:
                continue
            if r1["std"] is not None or ra["std"] is not None:
                ax.errorbar(
                    r1["mean"],
                    ra["mean"],
                    xerr=r1["std"] or 0.0,
                    yerr=ra["std"] or 0.0,
                    fmt="none",
                    ecolor="0.6",
                    lw=0.8,
                )
        ax.axhline(0.5, ls="--", lw=0.8, color="0.5")
        s = self.settings
        ax.set_title(
            f"{s.get('dataset')} zero-shot, preset {s.get('preset')}, "
            f"{len(s.get('seeds', []))} seed(s)",
            fontsize=9,
        )
        fig.tight_layout()
        if path is not None:
            fig.savefig(path, dpi=130)
        return fig

    def save(self, out: str | os.PathLike[str]) -> dict[str, Path]:
        """Write ``results.json``, ``results.csv`` and ``recall_vs_rauroc.png`` into ``out``."""
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        paths = {
            "json": self.write_json(d / "results.json"),
            "csv": self.write_csv(d / "results.csv"),
            "png": d / "recall_vs_rauroc.png",
        }
        self.plot(paths["png"])
        return paths


def merge_results(
    sources: Iterable[str | os.PathLike[str] | SweepResults],
) -> SweepResults:
    """Combine benchmark runs made separately (e.g. one seed per machine) into one result.

    Parameters
    ----------
    sources : iterable
        :class:`SweepResults`, ``results.json`` files, or folders holding one.

    Returns
    -------
    SweepResults
        All runs (estimator order of first appearance, then by seed); the settings of the first
        source with ``seeds`` / ``estimators`` updated and the sources' ``total_time`` summed.

    Raises
    ------
    FileNotFoundError
        If a path holds no ``results.json``.
    ValueError
        If a file is not a benchmark result, the presets or data differ, or an (estimator, seed)
        pair appears twice.
    """
    parts: list[SweepResults] = []
    for src in sources:
        if isinstance(src, SweepResults):
            parts.append(src)
            continue
        path = Path(src)
        if path.is_dir():
            path = path / "results.json"
        if not path.is_file():
            raise FileNotFoundError(f"benchmark result {str(path)!r} does not exist")
        try:
            data = json.loads(path.read_text())
            parts.append(SweepResults(runs=list(data["runs"]), settings=dict(data["settings"])))
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as exc:
            what = f"no {exc} entry" if isinstance(exc, KeyError) else str(exc)
            raise ValueError(f"{str(path)!r} is not a bayesurl benchmark result: {what}") from None
        for i, r in enumerate(parts[-1].runs):
            if not isinstance(r, dict) or not isinstance(r.get("estimator"), str):
                raise ValueError(
                    f"{str(path)!r} is not a bayesurl benchmark result: runs[{i}] has no "
                    "'estimator' name"
                )
            if isinstance(r.get("seed"), bool) or not isinstance(r.get("seed"), int):
                raise ValueError(
                    f"{str(path)!r} is not a bayesurl benchmark result: runs[{i}] has no "
                    "integer 'seed'"
                )
    if not parts:
        raise ValueError("`sources` is empty")
    first = parts[0].settings
    for p in parts[1:]:
        for key in ("preset", "dataset", "sizes", "overrides"):
            if p.settings.get(key) != first.get(key):
                raise ValueError(f"cannot merge benchmark results with different `{key}`")
    runs = [r for p in parts for r in p.runs]
    seen: set[tuple[str, int]] = set()
    for r in runs:
        key = (r["estimator"], int(r["seed"]))
        if key in seen:
            raise ValueError(f"estimator {key[0]!r} seed {key[1]} appears in more than one source")
        seen.add(key)
    order = list(dict.fromkeys(r["estimator"] for r in runs))
    runs.sort(key=lambda r: (order.index(r["estimator"]), int(r["seed"])))
    settings = dict(first)
    settings["seeds"] = sorted({int(r["seed"]) for r in runs})
    settings["estimators"] = order
    settings["total_time"] = sum(float(p.settings.get("total_time") or 0.0) for p in parts)
    settings["merged_from"] = len(parts)
    return SweepResults(runs=runs, settings=settings)
