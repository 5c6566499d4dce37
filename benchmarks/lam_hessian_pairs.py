"""LAM's Hessian pair set measured on four roads: which pairs should enter the GGN?

The post-hoc and online last-layer Laplace of :func:`bayesurl.laplace.MetricLaplace` sums the
contrastive GGN over mined pairs. Two options pick them: ``hessian_miner`` (which tuples of a
batch are mined) and ``hessian_pairs`` (whether mined negatives outside the margin, where the
loss is flat, still enter). The pair sets compared (:data:`PAIR_SETS`):

- ``hard_inside``: the hardest positive and negative of each anchor, negatives outside the
  margin dropped (``hard`` / ``inside_margin``; the default until this comparison);
- ``hard_all``: the same tuples, every one entering (``hard`` / ``all_mined``);
- ``triplets_all``: the LAM code's every triplet of ``TripletMarginMiner(margin, "all")``
  (at most 5,000 per batch), every one entering (``triplets`` / ``all_mined``);
- ``loss_pairs``: LAM section 3's pairs, every positive and every negative inside the
  margin (``loss_pairs``; ``hessian_pairs`` changes nothing for them);
- ``triplets_inside`` (road 1 only): the LAM code's triplets, negatives outside the margin
  dropped.

Roads (each writes ``<out>/<road>.json`` as its parts finish; ``summary`` joins them):

1. ``pml``: the PML-trained net of ``results/lam/pml_comparison.txt`` (post-hoc with the
   evidence prior, and online LAM with ``plot_7``'s settings), 1,000 test queries, 500 digits.
2. ``table2``: LAM Table 2 from its recipe (``fashion_mnist_closed``, preset ``full``, seeds
   0-2): one stored sweep of a copy of the recipe with one ``lam_posthoc`` / ``lam_online``
   row per pair set (the deterministic base trained once per seed).
3. ``protocol``: the ``lam_posthoc`` / ``lam_online`` rows of the frozen-feature protocols
   (``--preset pretrained --untuned``: 40 FashionMNIST splits, 20 clipart splits), one stored
   sweep per pair set with ``--set estimator.kwargs.hessian_*``; ``hard_inside`` is read from
   the committed protocol records (the script checks that it re-runs them bit for bit).
4. ``folder``: ``bayesurl folder --method laplace`` (:func:`bayesurl.folder.score_folder`)
   on two labelled folders (1,000 Open Clip Art PNGs, 1,000 FashionMNIST test PNGs), at the
   folder's approximation (``positive`` / ``euclidean``) and at LAM's (``fixed`` / ``arccos``).

Intervals: over splits (protocols; t-interval, paired t-test and Wilcoxon between pair sets
over the same splits, complementary pairs as the unit as in the protocol reports) and over
queries for single runs (DeLong's variance of an AUROC, DeLong's paired test between two u on
the same queries; against chance the Mann-Whitney test of AUROC = 0.5).

Usage (from the repository root; long roads in the background, resumable)::

    python benchmarks/lam_hessian_pairs.py pml --out results/lam/hessian_pairs
    python benchmarks/lam_hessian_pairs.py table2 --work WORK --out results/lam/hessian_pairs
    python benchmarks/lam_hessian_pairs.py protocol --dataset fashion_mnist --work WORK ...
    python benchmarks/lam_hessian_pairs.py protocol --dataset clipart --work WORK ...
    python benchmarks/lam_hessian_pairs.py folder --work WORK --out results/lam/hessian_pairs
    python benchmarks/lam_hessian_pairs.py summary --out results/lam/hessian_pairs
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _machine import cpu_name
from scipy import stats

REPO = Path(__file__).resolve().parents[1]

#: name -> MetricLaplace options; the first is the reference of every paired test
PAIR_SETS: dict[str, dict[str, str]] = {
    "hard_inside": {"hessian_miner": "hard", "hessian_pairs": "inside_margin"},
    "hard_all": {"hessian_miner": "hard", "hessian_pairs": "all_mined"},
    "triplets_all": {"hessian_miner": "triplets", "hessian_pairs": "all_mined"},
    "loss_pairs": {"hessian_miner": "loss_pairs", "hessian_pairs": "inside_margin"},
}
EXTRA_SETS = {"triplets_inside": {"hessian_miner": "triplets", "hessian_pairs": "inside_margin"}}
REFERENCE = "hard_inside"
METRICS = ("r_auroc", "ood_auroc")


# -- statistics over queries -------------------------------------------------------------------
def _midrank_components(
    scores: np.ndarray, positive: np.ndarray
) -> tuple[float, np.ndarray, np.ndarray]:
    """AUROC (ties 1/2) and DeLong's structural components ``V10`` (per positive) and ``V01``
    (per negative) of one score (DeLong, DeLong & Clarke-Pearson 1988; midranks as in Sun &
    Xu 2014)."""
    x, y = scores[positive], scores[~positive]
    m, n = len(x), len(y)
    r_all = stats.rankdata(np.concatenate([x, y]))
    r_x, r_y = stats.rankdata(x), stats.rankdata(y)
    v10 = (r_all[:m] - r_x) / n  # share of negatives below each positive (ties 1/2)
    v01 = 1.0 - (r_all[m:] - r_y) / m  # share of positives above each negative
    auc = float(v10.mean())
    return auc, v10, v01


def delong(
    scores: Sequence[float], positive: Sequence[bool], level: float = 0.95
) -> dict[str, Any]:
    """AUROC of ``scores`` for ``positive`` with DeLong's interval and the Mann-Whitney test of
    AUROC = 0.5 (two-sided)."""
    s = np.asarray(scores, dtype=np.float64)
    p = np.asarray(positive, dtype=bool)
    auc, v10, v01 = _midrank_components(s, p)
    m, n = len(v10), len(v01)
    var = v10.var(ddof=1) / m + v01.var(ddof=1) / n
    se = math.sqrt(max(var, 0.0))
    z = stats.norm.ppf(0.5 + level / 2)
    mw = stats.mannwhitneyu(s[p], s[~p], alternative="two-sided")
    return {
        "auroc": auc,
        "low": auc - z * se,
        "high": auc + z * se,
        "se": se,
        "n_pos": m,
        "n_neg": n,
        "p_vs_chance": float(mw.pvalue),
        "verdict": _chance_word(auc, float(mw.pvalue)),
    }


def delong_paired(
    a: Sequence[float], b: Sequence[float], positive: Sequence[bool], level: float = 0.95
) -> dict[str, Any]:
    """DeLong's test of two correlated AUROCs (two u on the same queries): ``b - a``."""
    p = np.asarray(positive, dtype=bool)
    auc_a, v10a, v01a = _midrank_components(np.asarray(a, np.float64), p)
    auc_b, v10b, v01b = _midrank_components(np.asarray(b, np.float64), p)
    m, n = len(v10a), len(v01a)
    s10 = np.cov(np.stack([v10a, v10b]))
    s01 = np.cov(np.stack([v01a, v01b]))
    cov = s10 / m + s01 / n
    var = cov[0, 0] + cov[1, 1] - 2 * cov[0, 1]
    d = auc_b - auc_a
    se = math.sqrt(max(var, 0.0))
    z = stats.norm.ppf(0.5 + level / 2)
    pval = 1.0 if se == 0 else float(2 * stats.norm.sf(abs(d) / se))
    return {"diff": d, "low": d - z * se, "high": d + z * se, "se": se, "p": pval}


def _chance_word(auc: float, p: float, alpha: float = 0.05) -> str:
    if p >= alpha:
        return "at chance"
    return "above" if auc > 0.5 else "below (inverted)"


def query_metrics(u: np.ndarray, wrong: np.ndarray, id_u: np.ndarray, ood_u: np.ndarray) -> dict:
    """R-AUROC (positive: R@1 wrong) and OOD AUROC (positive: OOD) with DeLong intervals."""
    out = {"r_auroc": delong(u, wrong)}
    if len(ood_u):
        out["ood_auroc"] = delong(
            np.concatenate([id_u, ood_u]),
            np.r_[np.zeros(len(id_u), bool), np.ones(len(ood_u), bool)],
        )
    return out


def paired_queries(
    ref: tuple[np.ndarray, ...], other: tuple[np.ndarray, ...]
) -> dict[str, dict[str, Any]]:
    """DeLong's paired test of ``other - ref`` for both AUROCs (same queries, same OOD images);
    each tuple is ``(u, wrong, id_u, ood_u)``."""
    u0, w0, i0, o0 = ref
    u1, w1, i1, o1 = other
    if np.array_equal(w0, w1):
        out = {"r_auroc": delong_paired(u0, u1, w0)}
    else:  # two nets (online): other right / wrong queries, the two AUROCs taken as independent
        a, b = delong(u0, w0), delong(u1, w1)
        d, se = b["auroc"] - a["auroc"], math.hypot(a["se"], b["se"])
        z = stats.norm.ppf(0.975)
        out = {
            "r_auroc": {
                "diff": d,
                "low": d - z * se,
                "high": d + z * se,
                "se": se,
                "p": float(2 * stats.norm.sf(abs(d) / se)),
                "unpaired": True,
            }
        }
    if len(o0):
        lab = np.r_[np.zeros(len(i0), bool), np.ones(len(o0), bool)]
        out["ood_auroc"] = delong_paired(np.r_[i0, o0], np.r_[i1, o1], lab)
    return out


# -- shared plumbing ---------------------------------------------------------------------------
def _machine() -> dict[str, Any]:
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "load_average": os.getloadavg(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip(),
    }


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _save(path: Path, doc: dict[str, Any]) -> None:
    from bayesurl.files import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(doc, indent=1, sort_keys=False, default=float) + "\n")


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- road 1: the PML-trained net ---------------------------------------------------------------
def _authors_compare():
    spec = importlib.util.spec_from_file_location("lac", REPO / "tools" / "lam_authors_compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _over_seeds(
    runs: Mapping[str, Any], mode: str, sets: Sequence[str], seeds: Sequence[int]
) -> dict:
    """Per pair set: mean and t-interval over the seeds' nets, the test against chance and the
    paired t-test against :data:`REFERENCE` over the same seeds."""

    out: dict[str, Any] = {}
    for name in sets:
        row: dict[str, Any] = {}
        for metric in METRICS:
            x = np.array([runs[f"{mode}/{name}/seed{s}"][metric]["auroc"] for s in seeds])
            ref = np.array([runs[f"{mode}/{REFERENCE}/seed{s}"][metric]["auroc"] for s in seeds])
            row[metric] = _interval_row(x, ref, name == REFERENCE)
        out[name] = row
    return out


def _interval_row(x: np.ndarray, ref: np.ndarray | None, is_ref: bool) -> dict[str, Any]:
    """Mean, t-interval and tests of per-unit AUROCs ``x`` (against 0.5 and, paired, ``ref``)."""
    from bayesurl.stats.comparison import t_interval

    m, lo, hi = t_interval(x)
    row: dict[str, Any] = {"n": int(x.size), "mean": m, "low": lo, "high": hi}
    row["p_vs_chance"] = float(stats.ttest_1samp(x, 0.5).pvalue) if x.size > 1 else None
    row["verdict"] = None if row["p_vs_chance"] is None else _chance_word(m, row["p_vs_chance"])
    if ref is not None and not is_ref and x.size > 1:
        d = x - ref
        dm, dlo, dhi = t_interval(d)
        row["vs_reference"] = {
            "n": int(d.size), "diff": dm, "low": dlo, "high": dhi,
            "p_t": float(stats.ttest_rel(x, ref).pvalue),
            "p_wilcoxon": None if np.all(d == 0) else float(stats.wilcoxon(d).pvalue),
        }  # fmt: skip
    return row


PML_SEEDS = (0, 1, 2, 3, 4)


def road_pml(out: Path) -> None:
    """Post-hoc (evidence prior, batches of 128) and online LAM (``plot_7``'s settings:
    prior 1, alpha 0.01, 5 epochs) per pair set on the PML-trained net of
    ``pml_comparison.txt`` (seed 0) and on four more nets trained the same way (seeds 1-4)."""
    from torch.utils.data import DataLoader, TensorDataset

    from bayesurl.data import as_tensors, default_transform, default_zero_shot
    from bayesurl.evaluation import r_at_1
    from bayesurl.laplace import MetricLaplace, train_online

    lac = _authors_compare()
    path = out / "pml.json"
    doc = _load(path)
    doc.setdefault("settings", {
        "road": "PML-trained net of results/lam/pml_comparison.txt (seed 0) and four more "
                "trained the same way (seeds 1-4: initialisation and batch order)",
        "net": "conv 16-32, fc 128, linear 32; PML ContrastiveLoss(0, 0.2) + "
               "MultiSimilarityMiner(0.1), Adam 1e-3, 5 epochs, 3,000 FashionMNIST train images",
        "posthoc": "fixed / arccos, margin 0.2, batches of 128, evidence-optimised prior",
        "online": "fixed / arccos, margin 0.2, prior 1, alpha 0.01, Adam 1e-3, 5 epochs, "
                  "batches of 128 (plot_7's settings), its own net from the seed",
        "queries": "1,000 FashionMNIST test images (classes 5-9); OOD 500 scikit-learn digits",
        "threads": 1,
        "machine": _machine(),
    })  # fmt: skip
    doc.setdefault("runs", {})
    torch.set_num_threads(1)
    data = default_zero_shot(max_train=3000, max_test=1000, max_ood=500, val_fraction=0.0)
    to_input = default_transform(1)
    (x_tr, y_tr), (x_te, y_te), (x_ood, _) = (
        as_tensors(s, to_input) for s in (data.train, data.test, data.ood)
    )
    sets = {**PAIR_SETS, **EXTRA_SETS}
    for seed in PML_SEEDS:
        if all(f"{m}/{n}/seed{seed}" in doc["runs"] for m in ("posthoc", "online") for n in sets):
            continue
        net = lac.train_pml_net(x_tr, y_tr, seed)
        with torch.no_grad():
            checksum = float(sum(p.abs().sum() for p in net.parameters()))
            z_te = net(x_te)
        doc.setdefault("net_checksum", {})[str(seed)] = checksum
        _, correct = r_at_1(z_te, y_te)
        wrong = (~correct).numpy()
        for mode in ("posthoc", "online"):
            arrays: dict[str, tuple[np.ndarray, ...]] = {}
            for name, opts in sets.items():
                key = f"{mode}/{name}/seed{seed}"
                t0 = time.process_time()
                if mode == "posthoc":
                    la = MetricLaplace(net, approximation="fixed", geometry="arccos", margin=0.2,
                                       **opts)  # fmt: skip
                    la.fit(DataLoader(TensorDataset(x_tr, y_tr), 128), progress=False)
                    la.optimize_prior_precision()
                    te, wr = la.predictive(x_te), wrong
                else:
                    torch.manual_seed(seed)
                    net_o = lac._net()
                    la = MetricLaplace(
                        net_o, mode="online", approximation="fixed", geometry="arccos",
                        margin=0.2, prior_precision=1.0, alpha=0.01, dataset_size=len(y_tr),
                        **opts,
                    )  # fmt: skip
                    opt = torch.optim.Adam(net_o.parameters(), lr=1e-3)
                    gen = torch.Generator().manual_seed(seed)
                    loader = DataLoader(TensorDataset(x_tr, y_tr), 128, shuffle=True, generator=gen)
                    train_online(la, loader, opt, epochs=5, progress=False,
                                 generator=torch.Generator().manual_seed(seed))  # fmt: skip
                    net_o.eval()
                    te = la.predictive(x_te)
                    _, corr_o = r_at_1(te.embedding, y_te)
                    wr = (~corr_o).numpy()
                ood = la.predictive(x_ood)
                u, uo = te.uncertainty.double().numpy(), ood.uncertainty.double().numpy()
                arrays[name] = (u, wr, u, uo)
                rec = query_metrics(u, wr, u, uo)
                rec.update(
                    options=opts, n_queries=len(u), n_wrong=int(wr.sum()), n_ood=len(uo),
                    r1=float(1 - wr.mean()), n_pairs=la.n_pairs,
                    clamped_fraction=la.clamped_fraction,
                    prior_precision=float(torch.as_tensor(la.prior_precision).mean()),
                    cpu_s=time.process_time() - t0,
                )  # fmt: skip
                doc["runs"][key] = rec
                r_auc, o_auc = rec["r_auroc"]["auroc"], rec["ood_auroc"]["auroc"]
                _log(f"pml {key}: R-AUROC {r_auc:.3f} OOD {o_auc:.3f} "
                     f"clamped {la.clamped_fraction:.3f}")  # fmt: skip
            for name in sets:
                if name != REFERENCE:
                    doc["runs"][f"{mode}/{name}/seed{seed}"]["vs_reference"] = paired_queries(
                        arrays[REFERENCE], arrays[name]
                    )
        _save(path, doc)
    doc["over_seeds"] = {
        mode: _over_seeds(doc["runs"], mode, list(sets), PML_SEEDS)
        for mode in ("posthoc", "online")
    }
    _save(path, doc)
    _log(f"wrote {path}")


# -- the sweeps of roads 2 and 3 ---------------------------------------------------------------
def _sweep(args: list[str], folder: Path, log: Path, stop_after: int | None = None) -> None:
    """``bayesurl benchmark ARGS --out FOLDER`` as a niced child process, its output appended to
    ``log``; with ``stop_after`` it is stopped (SIGTERM, resumable) once that many runs are in
    ``FOLDER/partial_runs.json``."""
    cmd = ["nice", "-n", "10", sys.executable, "-m", "bayesurl", "benchmark", *args,
           "--out", str(folder), "--no-progress"]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    _log(" ".join(cmd))
    with open(log, "a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        child = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
        while child.poll() is None:
            time.sleep(10)
            if stop_after is not None and len(_partial(folder)) >= stop_after:
                child.terminate()
                child.wait()
                return
    if child.returncode != 0:
        raise SystemExit(f"the sweep in {folder} failed (exit {child.returncode}); see {log}")


def _sweep_runs(folder: Path) -> list[dict[str, Any]]:
    """The finished runs of the sweep in ``folder`` (``[]`` when it wrote no results)."""
    from bayesurl.sweeps import read_results

    if not (folder / "results.json").is_file():
        return []
    return [r for r in read_results(folder, detail=False)["runs"] if r.get("error") is None]


def _partial(folder: Path) -> list[dict[str, Any]]:
    done = _sweep_runs(folder)
    if done:
        return done
    doc = _load(folder / "partial_runs.json")
    return [r for r in doc.get("runs", []) if r.get("error") is None]


def _finished(folder: Path, n_runs: int) -> bool:
    return len(_sweep_runs(folder)) >= n_runs


def _query_arrays(folder: Path, run: str) -> tuple[np.ndarray, ...]:
    """``(u, wrong, id_u, ood_u)`` of one run's per-query record (``queries/<run>.npz``): the
    OOD AUROC's in-distribution side is ``id_u`` where the run had one, else the queries."""
    from bayesurl.runs.queries import read_queries

    rec = read_queries(folder / "queries" / f"{run}.npz")
    u = rec.u.astype(np.float64)
    id_u = rec.id_u.astype(np.float64) if len(rec.id_u) else u
    return u, ~rec.hit, id_u, rec.ood_u.astype(np.float64)


#: LAM Table 2: the recipe's two LAM rows, renamed per pair set in a copy of the recipe
TABLE2_ROWS = ("lam_posthoc", "lam_online")
TABLE2_SEEDS = (0, 1, 2)


def _table2_recipe(work: Path) -> Path:
    """A copy of ``fashion_mnist_closed.toml`` with ``<row>_<pair set>`` rows beside the
    recipe's own: the same table, the pair-set options added to its ``kwargs`` (every pair set
    named, so the rows do not depend on the library's default)."""
    import tomllib

    src = REPO / "bayesurl" / "runs" / "recipes" / "fashion_mnist_closed.toml"
    text = src.read_text()
    tables = tomllib.loads(text)["estimators"]
    lines = [text, "", "# -- added by benchmarks/lam_hessian_pairs.py: one row per pair set"]
    for row in TABLE2_ROWS:
        t = tables[row]
        for name, opts in PAIR_SETS.items():
            kwargs = {**t["kwargs"], **opts}
            lines.append(f"[estimators.{row}_{name}]")
            lines.append(f'kind = "{t["kind"]}"')
            lines.append(f'mode = "{t["mode"]}"')
            lines.append(f'base = "{t["base"]}"')
            lines.append(f"kwargs = {_toml_table(kwargs)}")
            if "train" in t:
                lines.append(f"train = {_toml_table(t['train'])}")
            lines.append("fit = { optimize_prior = false }")
            lines.append("")
    path = work / "fashion_mnist_closed_pairs.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml_table(d: Mapping[str, Any]) -> str:
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.items()) + " }"


def _row_name(row: str, pair_set: str) -> str:
    return f"{row}_{pair_set}"


def road_table2(work: Path, out: Path) -> None:
    """LAM Table 2 from its recipe, one stored sweep with every pair set's rows."""
    from bayesurl.sweeps import read_results

    recipe = _table2_recipe(work / "table2")
    folder = work / "table2" / "sweep"
    methods = ["deterministic"] + [_row_name(r, n) for r in TABLE2_ROWS for n in PAIR_SETS]
    n_runs = len(methods) * len(TABLE2_SEEDS)
    if not _finished(folder, n_runs):
        _sweep(
            ["--dataset", str(recipe), "--preset", "full", "--seeds", "0,1,2",
             "--methods", ",".join(methods), "--threads", "1",
             "--storage", f"sqlite:///{folder / 'sweep.db'}"],
            folder, work / "table2.log",
        )  # fmt: skip
    runs = {(r["estimator"], r["seed"]): r for r in _partial(folder)}
    committed = {
        (r["estimator"], r["seed"]): r
        for r in read_results(REPO / "results" / "lam" / "fashion_mnist_closed", detail=False)[
            "runs"
        ]
    }
    doc: dict[str, Any] = {
        "settings": {
            "road": "LAM Table 2 from its recipe: fashion_mnist_closed, preset full (every "
                    "image), seeds 0-2, one thread per run; a copy of the recipe with one "
                    "lam_posthoc / lam_online row per pair set (the deterministic base trained "
                    "once per seed; fixed / arccos, margin 0.7, prior 1, no evidence tuning)",
            "recipe_copy": recipe.read_text(),
            "queries": "10,000 FashionMNIST test images (all ten classes); OOD 1,797 "
                       "scikit-learn digits",
            "machine": _machine(),
        },
        "reproduces_committed": {},
        "runs": {},
        "over_seeds": {},
    }  # fmt: skip
    for row in TABLE2_ROWS:
        for seed in TABLE2_SEEDS:
            mine, old = runs.get((_row_name(row, REFERENCE), seed)), committed.get((row, seed))
            if mine and old:
                doc["reproduces_committed"][f"{row}/seed{seed}"] = {
                    k: [old[k], mine[k]] for k in ("r@1", "r_auroc", "ood_auroc")
                }
        for seed in TABLE2_SEEDS:
            ref = _query_arrays(folder, f"{_row_name(row, REFERENCE)}_s{seed}")
            for name, opts in PAIR_SETS.items():
                run = f"{_row_name(row, name)}_s{seed}"
                arr = _query_arrays(folder, run)
                rec = query_metrics(*arr)
                r = runs[(_row_name(row, name), seed)]
                rec.update(options=opts, n_queries=len(arr[0]), n_wrong=int(arr[1].sum()),
                           n_ood=len(arr[3]), r1=r["r@1"],
                           clamped_fraction=r.get("clamped_fraction"),
                           evaluator={k: r[k] for k in METRICS})  # fmt: skip
                for k in METRICS:  # the script's AUROC is the evaluator's
                    assert abs(rec[k]["auroc"] - r[k]) < 1e-6, (run, k, rec[k]["auroc"], r[k])
                if name != REFERENCE:
                    rec["vs_reference"] = paired_queries(ref, arr)
                doc["runs"][f"{row}/{name}/seed{seed}"] = rec
        doc["over_seeds"][row] = _over_seeds(doc["runs"], row, list(PAIR_SETS), TABLE2_SEEDS)
        # all seeds' queries at once: the mean of the per-seed DeLong differences, its
        # variance the mean of theirs / n (the three nets held fixed)
        for name in PAIR_SETS:
            if name == REFERENCE:
                continue
            pooled = {}
            for k in METRICS:
                ds = [doc["runs"][f"{row}/{name}/seed{s}"]["vs_reference"][k] for s in TABLE2_SEEDS]
                d = float(np.mean([x["diff"] for x in ds]))
                se = math.sqrt(sum(x["se"] ** 2 for x in ds)) / len(ds)
                pooled[k] = {"diff": d, "low": d - 1.96 * se, "high": d + 1.96 * se, "se": se,
                             "p": float(2 * stats.norm.sf(abs(d) / se)) if se else 1.0}  # fmt: skip
            doc["over_seeds"][row][name]["pooled_delong_vs_reference"] = pooled
    _save(out / "table2.json", doc)
    _log(f"wrote {out / 'table2.json'}")


#: the committed protocol folders (their lam rows are the reference pair set)
PROTOCOLS = {
    "fashion_mnist": ("results/pretrained/crossfit/default", 40),
    "clipart": ("results/clipart/protocol", 20),
}
PROTOCOL_ROWS = ("lam_posthoc", "lam_online")
#: how far a re-run of a committed protocol run may move (R@1, AUROCs): the re-runs of main
#: at the time moved one or two of 5,000 queries' neighbours and the AUROCs by <= 0.001
RERUN_TOLERANCE = 0.005
#: the order the protocols' sweeps run in (the LAM code's pair set and LAM section 3's first)
PROTOCOL_ORDER = ("hard_inside", "triplets_all", "loss_pairs", "hard_all")


def road_protocol(dataset: str, work: Path, out: Path, cache: str) -> None:
    """The protocol's two LAM rows at every split, one stored sweep per pair set; the
    reference pair set is the committed storage's, after checking that its first four runs
    come out the same here."""
    from bayesurl.sweeps import read_results

    committed_dir, n_splits = PROTOCOLS[dataset]
    committed = [
        r for r in read_results(REPO / committed_dir, detail=False)["runs"]
        if r["estimator"] in PROTOCOL_ROWS and r.get("error") is None
    ]  # fmt: skip
    n_runs = len(PROTOCOL_ROWS) * n_splits
    base = ["--preset", "pretrained", "--untuned", "--threads", "1",
            "--methods", ",".join(PROTOCOL_ROWS), "--set", f"backbone.cache={cache}"]  # fmt: skip
    if dataset != "fashion_mnist":
        base = ["--dataset", dataset, *base]
    log = work / f"protocol_{dataset}.log"
    records: list[dict[str, Any]] = []
    check: dict[str, Any] = {}
    for name in PROTOCOL_ORDER:
        opts = PAIR_SETS[name]
        folder = work / f"protocol_{dataset}" / name
        sets = [f"--set=estimator.kwargs.{k}={v}" for k, v in opts.items()]
        if name == REFERENCE:
            if len(_partial(folder)) < 4:
                _sweep([*base, *sets], folder, log, stop_after=4)
            old = {(r["estimator"], r["split"]): r for r in committed}
            for r in _partial(folder):
                o = old[(r["estimator"], r["split"])]
                check[f"{r['estimator']}/split{r['split']}"] = {
                    k: [o[k], r[k]] for k in ("r@1", *METRICS)
                }
                if any(abs(o[k] - r[k]) > RERUN_TOLERANCE for k in ("r@1", *METRICS)):
                    raise SystemExit(f"{dataset}: {r['key']} differs from the committed run")
            runs = committed
        else:
            if not _finished(folder, n_runs):
                _sweep([*base, *sets], folder, log)
            runs = _partial(folder)
        for r in runs:
            records.append({**r, "estimator": f"{r['estimator']}/{name}"})
        _log(f"protocol {dataset} {name}: {len(runs)} runs")
        if len(runs) == n_runs:  # the pair sets finished so far, written as they finish
            _protocol_doc(records, dataset, base, check, out)


def _protocol_doc(
    records: list[dict[str, Any]], dataset: str, base: list[str], check: dict, out: Path
) -> None:
    from bayesurl.sweeps.aggregate import chance_test, paired_comparison, summarize

    committed_dir, n_splits = PROTOCOLS[dataset]
    doc: dict[str, Any] = {
        "settings": {
            "road": f"{dataset} frozen-feature protocol ({committed_dir}): bayesurl benchmark "
                    f"{' '.join(base)} --set estimator.kwargs.hessian_miner=... "
                    "--set estimator.kwargs.hessian_pairs=... (one stored sweep per pair set)",
            "reference_runs": f"{REFERENCE}: the committed records of {committed_dir}",
            "splits": n_splits,
            "machine": _machine(),
        },
        "reference_rerun_check": check,
        "per_split": {
            f"{r['estimator']}/split{r['split']}": {
                k: r.get(k) for k in ("r@1", *METRICS, "train_time", "cpu_time")
            }
            for r in records
        },
    }  # fmt: skip
    summary = summarize(records, ["r@1", *METRICS])
    doc["train_time_median_s"] = {
        n: float(np.median([r["train_time"] for r in records if r["estimator"] == n]))
        for n in summary
    }
    doc["summary"] = {n: {k: v for k, v in d.items() if k != "_runs"} for n, d in summary.items()}
    doc["vs_chance"] = {m: chance_test(records, m, unit="pair") for m in METRICS}
    doc["vs_chance_per_split"] = {m: chance_test(records, m, unit="split") for m in METRICS}
    doc["vs_reference"] = {}
    for row in PROTOCOL_ROWS:
        mine = [r for r in records if r["estimator"].startswith(f"{row}/")]
        doc["vs_reference"][row] = {
            m: {
                "pair": paired_comparison(mine, m, reference=f"{row}/{REFERENCE}", unit="pair"),
                "split": paired_comparison(mine, m, reference=f"{row}/{REFERENCE}", unit="run"),
            }
            for m in METRICS
        }
    _save(out / f"protocol_{dataset}.json", doc)
    _log(f"wrote {out / f'protocol_{dataset}.json'}")


# -- road 4: bayesurl folder --method laplace ---------------------------------------------------
FOLDER_APPROXIMATIONS = {
    "folder": {},  # the folder's own: the wrapper's positive / euclidean
    "lam": {"approximation": "fixed", "geometry": "arccos"},
}
FOLDER_IMAGES = 1000


def _fmnist_folder(root: Path, n: int) -> None:
    """The first ``n / 10`` FashionMNIST test images of each class as 28 px PNGs, one
    sub-folder per class."""
    from PIL import Image

    from bayesurl.data.fmnist import FASHION_MNIST_CLASSES, fashion_mnist

    data = fashion_mnist(split="test")
    per = n // 10
    taken = dict.fromkeys(range(10), 0)
    for i in range(len(data.targets)):
        c = int(data.targets[i])
        if taken[c] >= per:
            continue
        name = f"{c}_{FASHION_MNIST_CLASSES[c].replace('/', '-').replace(' ', '_').lower()}"
        (root / name).mkdir(parents=True, exist_ok=True)
        Image.fromarray(data.images[i].reshape(28, 28).numpy()).save(root / name / f"{i:05d}.png")
        taken[c] += 1
        if all(v >= per for v in taken.values()):
            break


def _folders(work: Path) -> dict[str, Path]:
    """The two labelled folders (built once): Open Clip Art as ``benchmarks/folder_road.py``
    builds it, and FashionMNIST test PNGs."""
    spec = importlib.util.spec_from_file_location(
        "folder_road", REPO / "benchmarks" / "folder_road.py"
    )
    folder_road = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(folder_road)
    out = {
        "clipart": work / "folders" / "clipart",
        "fashion_mnist": work / "folders" / "fashion_mnist",
    }
    for name, build in (("clipart", folder_road.build_folder), ("fashion_mnist", _fmnist_folder)):
        done = out[name].parent / f"{name}.done"
        if not done.is_file():
            if out[name].exists():
                import shutil

                shutil.rmtree(out[name])
            out[name].mkdir(parents=True)
            build(out[name], FOLDER_IMAGES)
            done.write_text("ok\n")
    return out


def road_folder(work: Path, out: Path) -> None:
    """``bayesurl folder --method laplace`` (its defaults: EfficientNet-Lite0 with ImageNet
    weights, 224 px, every image fitted with its nearest neighbour as its positive) per pair set,
    at the folder's approximation and at LAM's."""
    from bayesurl.folder import FolderOptions, score_folder

    path = out / "folder.json"
    doc = _load(path)
    doc.setdefault("settings", {
        "road": "bayesurl folder DIR --method laplace (score_folder), defaults: "
                "efficientnet_lite0 with ImageNet weights, 224 px, fit on every image (<= 5000) "
                "paired with its nearest other image, labels unused; --option for the pair set "
                "and (row 'lam') approximation=fixed, geometry=arccos",
        "folders": {"clipart": f"{FOLDER_IMAGES} Open Clip Art PNGs, ten largest classes, round "
                               "robin (benchmarks/folder_road.py build_folder)",
                    "fashion_mnist": f"{FOLDER_IMAGES} FashionMNIST test PNGs (the first 100 "
                                     "of each class, 28 px, upscaled by the road)"},
        "ood": "none: a folder has no OOD set (R-AUROC only)",
        "threads": torch.get_num_threads(),
        "machine": _machine(),
    })  # fmt: skip
    doc.setdefault("runs", {})
    cache = work / "folder_features"
    for folder_name, root in _folders(work).items():
        for approx, aopts in FOLDER_APPROXIMATIONS.items():
            arrays: dict[str, tuple[np.ndarray, ...]] = {}
            for name, popts in PAIR_SETS.items():
                key = f"{folder_name}/{approx}/{name}"
                run_dir = work / "folder_runs" / folder_name / approx / name
                if key not in doc["runs"] or not (run_dir / "queries.npz").is_file():
                    t0 = time.perf_counter()
                    opts = FolderOptions(
                        method="laplace", backbone="efficientnet_lite0", pretrained=True,
                        cache=cache, progress=False, wrapper_options={**aopts, **popts},
                    )  # fmt: skip
                    res = score_folder(root, out=run_dir, options=opts)
                    info = res.info
                    rec = {
                        "options": {**aopts, **popts},
                        "evaluator": {"r_auroc": res.metrics["r_auroc"], "r@1": res.metrics["r@1"]},
                        "fit": info["fit"],
                        "seconds": time.perf_counter() - t0,
                    }
                    doc["runs"][key] = rec
                from bayesurl.runs.queries import read_queries

                q = read_queries(run_dir / "queries.npz")
                u, wrong = q.u.astype(np.float64), ~q.hit
                arrays[name] = (u, wrong, u, np.zeros(0))
                rec = doc["runs"][key]
                rec.update(query_metrics(u, wrong, u, np.zeros(0)))
                rec.update(n_queries=len(u), n_wrong=int(wrong.sum()), r1=float(1 - wrong.mean()))
                assert abs(rec["r_auroc"]["auroc"] - rec["evaluator"]["r_auroc"]) < 1e-6
                _log(f"folder {key}: R-AUROC {rec['r_auroc']['auroc']:.3f} "
                     f"[{rec['r_auroc']['low']:.3f}, {rec['r_auroc']['high']:.3f}]")  # fmt: skip
                _save(path, doc)
            for name in PAIR_SETS:
                if name != REFERENCE:
                    doc["runs"][f"{folder_name}/{approx}/{name}"]["vs_reference"] = paired_queries(
                        arrays[REFERENCE], arrays[name]
                    )
            _save(path, doc)
    _log(f"wrote {path}")


# -- the four-road table ------------------------------------------------------------------------
def _cell_query(rec: Mapping[str, Any], metric: str) -> dict[str, Any] | None:
    """One run's AUROC over its queries (DeLong) and its paired difference to the reference."""
    if metric not in rec:
        return None
    r = rec[metric]
    cell = {"value": r["auroc"], "low": r["low"], "high": r["high"],
            "n": (f"{r['n_pos'] + r['n_neg']} queries, {r['n_pos']} wrong" if metric == "r_auroc"
                  else f"{r['n_neg']} ID + {r['n_pos']} OOD"),
            "unit": "DeLong",
            "p_vs_chance": r["p_vs_chance"], "verdict": r["verdict"]}  # fmt: skip
    vs = rec.get("vs_reference", {}).get(metric)
    if vs:
        cell["vs_reference"] = {k: vs[k] for k in ("diff", "low", "high", "p")}
    return cell


def _cell_seeds(row: Mapping[str, Any], metric: str, unit: str) -> dict[str, Any]:
    r = row[metric]
    cell = {"value": r["mean"], "low": r["low"], "high": r["high"], "n": r["n"], "unit": unit,
            "p_vs_chance": r["p_vs_chance"], "verdict": r["verdict"]}  # fmt: skip
    if "vs_reference" in r:
        v = r["vs_reference"]
        cell["vs_reference"] = {"diff": v["diff"], "low": v["low"], "high": v["high"],
                                "p": v["p_t"], "p_wilcoxon": v["p_wilcoxon"]}  # fmt: skip
    return cell


def _cells(out: Path) -> list[dict[str, Any]]:
    """Every (road, row, pair set) with both AUROCs, its interval, n and its tests."""
    cells: list[dict[str, Any]] = []

    def add(road: str, row: str, pair_set: str, metrics: dict[str, Any]) -> None:
        cells.append({"road": road, "row": row, "pair_set": pair_set,
                      "options": {**PAIR_SETS, **EXTRA_SETS}[pair_set], **metrics})  # fmt: skip

    pml = _load(out / "pml.json")
    for mode in ("posthoc", "online"):
        for name, row in pml.get("over_seeds", {}).get(mode, {}).items():
            add(
                "1 pml",
                f"{mode}, 5 nets",
                name,
                {m: _cell_seeds(row, m, "nets, t") for m in METRICS},
            )
        for name in {**PAIR_SETS, **EXTRA_SETS}:
            rec = pml.get("runs", {}).get(f"{mode}/{name}/seed0")
            if rec:
                add("1 pml", f"{mode}, seed 0", name, {m: _cell_query(rec, m) for m in METRICS})
    t2 = _load(out / "table2.json")
    for row, per in t2.get("over_seeds", {}).items():
        for name, r in per.items():
            cell = {m: _cell_seeds(r, m, "seeds, t") for m in METRICS}
            for m in METRICS:
                pooled = r.get("pooled_delong_vs_reference", {}).get(m)
                if pooled:
                    cell[m]["vs_reference_delong"] = pooled
            add("2 table2", row, name, cell)
    for ds in PROTOCOLS:
        doc = _load(out / f"protocol_{ds}.json")
        for key, per in doc.get("summary", {}).items():
            row, name = key.split("/")
            cell = {}
            for m in METRICS:
                s = per[m]
                ch = doc["vs_chance"][m][key]
                cell[m] = {"value": s["mean"], "low": s["low"], "high": s["high"], "n": s["n"],
                           "unit": "splits, t", "p_vs_chance": ch["p_t"],
                           "p_vs_chance_unit": f"complementary pairs (n {ch['n']}), t",
                           "verdict": ch["verdict"]}  # fmt: skip
                if name != REFERENCE:
                    v = doc["vs_reference"][row][m]["pair"][key]
                    vs = doc["vs_reference"][row][m]["split"][key]
                    cell[m]["vs_reference"] = {
                        "diff": v["mean_diff"], "low": v["low"], "high": v["high"],
                        "p": v["p_t"], "p_wilcoxon": v["p_wilcoxon"], "n": v["n"],
                        "unit": "complementary pairs, paired t",
                        "per_split": {"n": vs["n"], "p": vs["p_t"], "diff": vs["mean_diff"]},
                    }  # fmt: skip
            add(f"3 protocol {ds}", row, name, cell)
    fo = _load(out / "folder.json")
    for key, rec in fo.get("runs", {}).items():
        folder, approx, name = key.split("/")
        add("4 folder", f"{folder}, {approx}", name, {m: _cell_query(rec, m) for m in METRICS})
    return cells


def _fmt(c: Mapping[str, Any] | None) -> str:
    if c is None:
        return "n/a"
    s = f"{c['value']:.3f} [{c['low']:.3f}, {c['high']:.3f}]"
    mark = {"above": " ▲", "below": " ▼", "below (inverted)": " ▼"}.get(c.get("verdict") or "", "")
    return f"{s}{mark} (n {c['n']}, {c['unit']})"


def _fmt_diff(c: Mapping[str, Any] | None) -> str:
    if c is None or "vs_reference" not in c:
        return ""
    v = c["vs_reference"]
    return f"{v['diff']:+.3f} [{v['low']:+.3f}, {v['high']:+.3f}] p {v['p']:.2g}"


#: the rows that count for a road's verdict (the others are reported beside them): road 1's
#: five nets (the seed-0 runs are one of them), the folder's own approximation (what ``bayesurl
#: folder`` does; the ``lam`` rows are a what-if)
VERDICT_ROWS = {
    "1 pml": ("posthoc, 5 nets", "online, 5 nets"),
    "4 folder": ("clipart, folder", "fashion_mnist, folder"),
}
ALPHA = 0.05
#: a difference counts only from this size on (AUROC units): smaller ones are significant
#: on thousands of paired queries without mattering to anyone reading the u
MIN_EFFECT = 0.005


def _road_verdicts(cells: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per road and pair set: its (row, AUROC) cells significantly better / worse than
    :data:`REFERENCE` (paired test, two-sided p < :data:`ALPHA`; road 2: the pooled DeLong
    test over its three seeds' queries, its seed t-test having n = 3; and at least
    :data:`MIN_EFFECT` in size) and the road's word:
    ``better`` (some better, none worse), ``worse`` (the reverse), ``mixed`` or ``no
    difference``."""
    out: dict[str, dict[str, Any]] = {}
    for c in cells:
        if c["pair_set"] == REFERENCE or c["pair_set"] not in PAIR_SETS:
            continue
        rows = VERDICT_ROWS.get(c["road"])
        if rows is not None and c["row"] not in rows:
            continue
        v = out.setdefault(c["road"], {}).setdefault(
            c["pair_set"], {"better": [], "worse": [], "cells": 0, "diffs": []}
        )
        for m in METRICS:
            cell = c.get(m)
            if not cell:
                continue
            test = cell.get("vs_reference_delong") or cell.get("vs_reference")
            if not test or test.get("p") is None:
                continue
            v["cells"] += 1
            v["diffs"].append(test["diff"])
            if test["p"] < ALPHA and abs(test["diff"]) >= MIN_EFFECT:
                v["better" if test["diff"] > 0 else "worse"].append(
                    f"{c['row']} {m} {test['diff']:+.3f}"
                )
    for per in out.values():
        for v in per.values():
            b, w = bool(v["better"]), bool(v["worse"])
            v["verdict"] = ("mixed" if b and w else "better" if b else "worse" if w
                            else "no difference")  # fmt: skip
    return out


def summary(out: Path) -> None:
    """``hessian_pairs.json`` (every cell with its settings, the roads' verdicts) and the
    full table ``table.md``."""
    cells = _cells(out)
    roads = {
        "pml": _load(out / "pml.json").get("settings"),
        "table2": _load(out / "table2.json").get("settings"),
        **{f"protocol_{d}": _load(out / f"protocol_{d}.json").get("settings") for d in PROTOCOLS},
        "folder": _load(out / "folder.json").get("settings"),
    }
    verdicts = _road_verdicts(cells)
    wins = {n: sum(per.get(n, {}).get("verdict") == "better" for per in verdicts.values())
            for n in PAIR_SETS if n != REFERENCE}  # fmt: skip
    # a tie on roads goes to the larger mean paired difference over every counted cell
    mean_diff = {
        n: float(np.mean([d for per in verdicts.values() for d in per.get(n, {}).get("diffs", [])]))
        for n in wins
    }
    default = max(wins, key=lambda n: (wins[n], mean_diff[n]))
    _save(out / "hessian_pairs.json", {
        "pair_sets": {**PAIR_SETS, **EXTRA_SETS}, "reference": REFERENCE,
        "verdict_rule": "per road, a pair set is 'better' than the reference when at least one "
                        "of its (row, AUROC) paired tests is significantly positive (two-sided "
                        f"p < {ALPHA}, difference >= {MIN_EFFECT}) and none significantly "
                        "negative (the same); the default is the set better on the most roads, "
                        "a tie broken by the larger mean paired difference over the counted "
                        "cells",
        "road_verdicts": verdicts, "roads_better": wins, "mean_paired_difference": mean_diff,
        "chosen": default if wins[default] > 0 else REFERENCE, "roads": roads, "cells": cells,
    })  # fmt: skip
    lines = [
        "| road | row | pair set | R-AUROC [95%] | R-AUROC vs hard_inside | OOD AUROC [95%] "
        "| OOD AUROC vs hard_inside |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        r, o = c.get("r_auroc"), c.get("ood_auroc")
        lines.append(f"| {c['road']} | {c['row']} | {c['pair_set']} | {_fmt(r)} | {_fmt_diff(r)} "
                     f"| {_fmt(o)} | {_fmt_diff(o)} |")  # fmt: skip
    lines += ["", "| road | pair set | verdict vs hard_inside | better | worse |",
              "|---|---|---|---|---|"]  # fmt: skip
    for road, per in verdicts.items():
        for name, v in per.items():
            lines.append(f"| {road} | {name} | {v['verdict']} | {'; '.join(v['better'])} | "
                         f"{'; '.join(v['worse'])} |")  # fmt: skip
    lines += ["", "roads better than hard_inside: "
              + ", ".join(f"{n} {k}" for n, k in wins.items())]  # fmt: skip
    (out / "table.md").write_text("\n".join(lines) + "\n")
    for m in METRICS:
        _display_csv(cells, m, out / f"{m}.csv")
    _readme_tables(out, verdicts, wins)
    _log(f"wrote {out / 'hessian_pairs.json'}, {out / 'table.md'} and the display tables")


README_MARK = ("<!-- tables: benchmarks/lam_hessian_pairs.py summary -->", "<!-- /tables -->")


def _readme_tables(out: Path, verdicts: Mapping[str, Any], wins: Mapping[str, int]) -> None:
    """The display tables and the verdicts as markdown between :data:`README_MARK` in
    ``README.md`` (left alone when it has no such block)."""
    import csv

    readme = out / "README.md"
    if not readme.is_file():
        return
    text = readme.read_text()
    start, end = README_MARK
    if start not in text or end not in text:
        return
    lines = [start, ""]
    for m, title in (("ood_auroc", "OOD AUROC"), ("r_auroc", "R-AUROC")):
        rows = list(csv.reader((out / f"{m}.csv").read_text().splitlines()))
        lines += [f"**{title}**", "", "| " + " | ".join(rows[0]) + " |",
                  "|" + "---|" * len(rows[0])]  # fmt: skip
        lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
        lines.append("")
    lines += ["**Verdicts against hard_inside** (the rule above)", "",
              "| road | pair set | verdict | significantly better | significantly worse |",
              "|---|---|---|---|---|"]  # fmt: skip
    for road, per in verdicts.items():
        for name, v in per.items():
            lines.append(f"| {road} | {name} | {v['verdict']} | {'; '.join(v['better'])} | "
                         f"{'; '.join(v['worse'])} |")  # fmt: skip
    lines += ["", "Roads on which each set is better: "
              + ", ".join(f"{n} {k}" for n, k in wins.items()), "", end]  # fmt: skip
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    readme.write_text(head + "\n".join(lines) + tail)


#: the rows of the docs' display tables (road 1's single-net runs and road 4's what-if are in
#: table.md and the JSON)
DISPLAY_ROWS = {
    "1 pml": ("posthoc, 5 nets", "online, 5 nets"),
    "4 folder": ("clipart, folder", "fashion_mnist, folder", "clipart, lam", "fashion_mnist, lam"),
}


def _display_csv(cells: Sequence[Mapping[str, Any]], metric: str, path: Path) -> None:
    """One row per (road, row), one column per pair set: ``mean [low, high]`` with ▲ / ▼
    above / below chance, * where the difference to the reference is significant (p <
    :data:`ALPHA`, at least :data:`MIN_EFFECT`)."""
    import csv
    import io

    rows: dict[tuple[str, str], dict[str, str]] = {}
    ns: dict[tuple[str, str], str] = {}
    for c in cells:
        want = DISPLAY_ROWS.get(c["road"])
        if (want is not None and c["row"] not in want) or c["pair_set"] not in PAIR_SETS:
            continue
        cell = c.get(metric)
        if not cell:
            continue
        text = f"{cell['value']:.3f} [{cell['low']:.2f}, {cell['high']:.2f}]"
        text += {"above": " ▲", "below": " ▼", "below (inverted)": " ▼"}.get(
            cell.get("verdict") or "", ""
        )
        test = cell.get("vs_reference_delong") or cell.get("vs_reference")
        if test and test.get("p") is not None and test["p"] < ALPHA:
            if abs(test["diff"]) >= MIN_EFFECT:
                text += " *"
        rows.setdefault((c["road"], c["row"]), {})[c["pair_set"]] = text
        ns[(c["road"], c["row"])] = f"{cell['n']} ({cell['unit']})"
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["road", "row", "n", *PAIR_SETS])
    for (road, row), per in rows.items():
        w.writerow([road, row, ns[(road, row)], *(per.get(n, "") for n in PAIR_SETS)])
    path.write_text(buf.getvalue())


# -- main --------------------------------------------------------------------------------------
ROADS: dict[str, Callable[..., None]] = {}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("road", choices=["pml", "table2", "protocol", "folder", "summary"])
    ap.add_argument("--out", type=Path, default=REPO / "results" / "lam" / "hessian_pairs")
    ap.add_argument("--work", type=Path, default=REPO / "runs" / "hessian_pairs")
    ap.add_argument("--dataset", default="fashion_mnist", help="protocol: fashion_mnist or clipart")
    ap.add_argument("--cache", default="/work/features", help="protocol: backbone.cache")
    args = ap.parse_args(argv)
    if args.road == "pml":
        road_pml(args.out)
    elif args.road == "table2":
        road_table2(args.work, args.out)
    elif args.road == "protocol":
        road_protocol(args.dataset, args.work, args.out, args.cache)
    elif args.road == "folder":
        road_folder(args.work, args.out)
    else:
        summary(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
