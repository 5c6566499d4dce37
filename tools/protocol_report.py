"""Tables of a protocol sweep (``--preset standard`` or ``--preset pretrained``), for the docs
and the closing note.

Reads ``results.json`` written by ``bayesurl benchmark --preset NAME`` and writes

* ``docs/concepts/_<NAME>_results.inc`` (reStructuredText included by
  ``docs/concepts/which_method.rst``): the per-estimator means with 95 % t-intervals over the
  class splits, the paired comparisons against CE and against the best free baseline
  (Holm-adjusted), the split-half reproducibility over many halvings, URL's crop share and
  mixed R-AUROC, and the training curves' last-epoch changes;
* ``docs/concepts/_<NAME>_verdict.inc``: the verdict in words with its numbers -- the
  split-half Spearman, the R-AUROC order, who beats CE and the best free baseline after Holm,
  where URL's loss prediction and MCInfoNCE rank, OOD and R@1 (:func:`verdict`);

and prints the same tables as plain text (the pages show the plots of the protocol's folder in
``results/`` itself, no copy). A stored sweep that has not finished keeps its
finished runs in ``partial_runs.json`` (written at most once a minute, and after its last
run); ``--interim`` first writes the results of the class
splits on which every estimator has finished into ``FOLDER/interim`` and reports those.
Usage (repository root)::

    python tools/protocol_report.py results/sweeps/standard
    python tools/protocol_report.py results/pretrained/protocol --interim
    python tools/protocol_report.py results/pretrained/protocol_tuned --interim \
        --name pretrained_tuned   # NAME: the docs files (default: the preset)

"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path
from typing import Any

from bayesurl.evaluation.table import Column, metric_column
from bayesurl.stats.comparison import holm
from bayesurl.sweeps.aggregate import complementary_pairs, paired_comparison
from bayesurl.sweeps.record import run_rows
from bayesurl.sweeps.report import (
    CURVES_FILE,
    FREE_BASELINES,
    REPRO_METRICS,
    REPRODUCIBILITY_FILE,
    plot_title,
    plot_training_curves,
    read_results,
    report_columns,
    write_results,
)


def _columns() -> list[Column]:
    """The report's table: the sweep report's shown metric columns (title, digits,
    direction)."""
    return report_columns(shown=True, runs=False)


def _title(key: str) -> str:
    return metric_column(key).title


#: The metrics of the paired and split-half tables (R-AUROC, R@1, OOD AUROC: the sweep
#: report's reproducibility metrics).
PAIRED = REPRO_METRICS


def _cell(d: dict[str, Any] | None, col: Column, best: float | None = None) -> str:
    """Mean ± half-width of the interval with the column's digits; the best mean bold."""
    if not d or d.get("mean") is None:
        return "n/a"
    m, lo, hi = d["mean"], d.get("low"), d.get("high")
    mean = f"**{col.format(m)}**" if best is not None and m == best else col.format(m)
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return mean
    return f"{mean} ± {col.format((hi - lo) / 2)}"


def _best_first(summary: dict[str, Any], key: str = "r_auroc") -> list[str]:
    """The estimators of ``summary`` by their mean ``key``, the best first (the direction its
    column declares), those without it last."""
    up = metric_column(key).higher_is_better

    def rank(n: str) -> tuple[bool, float]:
        m = (summary[n].get(key) or {}).get("mean")
        return m is None, 0.0 if m is None else (-m if up else m)

    return sorted(summary, key=rank)


def _list_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    out = [f".. list-table:: {title}", "   :header-rows: 1", ""]
    for r in [header, *rows]:
        out.append(f"   * - {r[0]}")
        out += [f"     - {c}" for c in r[1:]]
    return "\n".join(out) + "\n"


def _last_change(curve: list[float] | None) -> float | None:
    """Relative change of the last epoch: |c[-1] - c[-2]| / |c[-2]|."""
    if not curve or len(curve) < 2 or not curve[-2]:
        return None
    return abs(curve[-1] - curve[-2]) / abs(curve[-2])


def reliability(runs: list[dict[str, Any]], metric: str) -> dict[str, float] | None:
    """Two-way (estimator x split) variance decomposition of ``metric`` and what it implies.

    ``icc`` is the consistency intra-class correlation ICC(C, 1) = (MS_est - MS_res) /
    (MS_est + (k - 1) MS_res) of one split (k splits, one seed each): the share of a single
    split's metric variance that is a stable estimator difference. By Spearman-Brown, a mean
    over ``m`` splits has reliability m ICC / (1 + (m - 1) ICC), and two disjoint halves of
    ``m`` splits each correlate at about that value; ``splits_for_0.7`` is the total number of
    splits (two halves) for a split-half correlation of 0.7 (``inf`` when ICC <= 0).
    """
    import numpy as np

    ok = [r for r in runs if r.get("error") is None and r.get(metric) is not None]
    ests = sorted({r["estimator"] for r in ok})
    splits = sorted({r["split"] for r in ok})
    table = np.full((len(ests), len(splits)), np.nan)
    for r in ok:
        table[ests.index(r["estimator"]), splits.index(r["split"])] = float(r[metric])
    table = table[~np.isnan(table).any(axis=1)]
    n, k = table.shape
    if n < 3 or k < 2:
        return None
    grand = table.mean()
    ms_e = k * ((table.mean(axis=1) - grand) ** 2).sum() / (n - 1)
    resid = table - table.mean(axis=1, keepdims=True) - table.mean(axis=0, keepdims=True) + grand
    ms_r = (resid**2).sum() / ((n - 1) * (k - 1))
    if ms_e + (k - 1) * ms_r <= 0:  # the metric does not vary: no reliability to speak of
        return None
    icc = (ms_e - ms_r) / (ms_e + (k - 1) * ms_r)
    need = math.inf if icc <= 0 else 2 * math.ceil(0.7 * (1 - icc) / (icc * 0.3))
    return {
        "icc": float(icc),
        "sd_between_estimators": float(math.sqrt(max(ms_e - ms_r, 0.0) / k)),
        "sd_residual": float(math.sqrt(ms_r)),
        "splits_for_0.7": float(need),
    }


def _paired_rows(order: list[str], paired: dict[str, Any], reference: str) -> list[list[str]]:
    rows = []
    for n in order:
        if n == reference:
            continue
        cells = []
        for k in PAIRED:
            p = paired.get(k, {}).get(n)
            if not p or p.get("mean_diff") is None:
                cells.append("n/a")
                continue
            cells.append(
                f"{p['mean_diff']:+.3f} (p {p['p_t']:.2g}, Holm {p['p_t_holm']:.2g}; "
                f"{p['verdict'] or 'verdict withheld'})"
            )
        rows.append([n, *cells])
    return rows


def _spread(r: dict[str, Any]) -> str:
    """The split-half Spearman over the halvings: every value when few, else quantiles."""
    vals = [p["spearman"] for p in r["partitions"] if p["spearman"] is not None]
    if len(vals) <= 10:
        return ", ".join(f"{v:.2f}" for v in vals)
    return f"{len(vals)} halvings: 5 % {r['q05']:.2f}, 95 % {r['q95']:.2f}"


def complete_splits(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs of the class splits on which every estimator of ``runs`` has finished (a
    split still running would bias the estimators' means towards the splits they have); when
    the splits come in complementary pairs, only the pairs of which both splits are complete
    (a pair holds every class once downstream)."""
    ok = [r for r in runs if r.get("error") is None]
    names = {r["estimator"] for r in ok}
    by_split: dict[Any, set[str]] = {}
    for r in ok:
        by_split.setdefault(r["split"], set()).add(r["estimator"])
    keep = {k for k, v in by_split.items() if v == names}
    done = [r for r in ok if r["split"] in keep]
    if done and all(r.get("downstream") for r in done):
        pair_of = complementary_pairs(done)
        size: dict[int, int] = {}
        for k in set(pair_of):
            size[pair_of[k]] = size.get(pair_of[k], 0) + 1
        if any(n == 2 for n in size.values()):
            done = [r for r in done if size[pair_of[r["split"]]] == 2]
    return done


def write_interim(folder: Path) -> Path:
    """Results of the complete splits of ``folder/partial_runs.json`` into ``folder/interim``."""
    part = json.loads((folder / "partial_runs.json").read_text())
    runs = run_rows(part["runs"])
    done = complete_splits(runs)
    splits = sorted({r["split"] for r in done})
    if len(splits) < 2:
        raise SystemExit(f"{folder}: {len(splits)} complete class splits; need >= 2")
    settings = {
        "preset": part.get("preset", ""),
        "interim": True,
        "complete_pairs": True,
        "status": part.get("status"),
        "class_splits": splits,
        "estimators": sorted({r["estimator"] for r in done}),
        "sum_of_run_times_s": sum(float(r.get("total_time") or 0.0) for r in done),
    }
    out = folder / "interim"
    write_results(done, out, settings)
    return out


def _significant_rows(table: dict[str, Any], metric: str, sign: int) -> dict[str, Any]:
    """The paired rows whose difference has ``sign`` and Holm p < 0.05, by estimator."""
    return {
        k: v
        for k, v in table.get(metric, {}).items()
        if isinstance(v, dict)
        and v.get("p_t_holm") is not None
        and v["p_t_holm"] < 0.05
        and (v["mean_diff"] > 0) == (sign > 0)
    }


def _significant(table: dict[str, Any], metric: str, sign: int) -> str:
    """:func:`_significant_rows` as text, or "none"."""
    out = []
    for k, v in _significant_rows(table, metric, sign).items():
        p = f"{v['p_t_holm']:.2g}" if v["p_t_holm"] > 0 else "< 1e-300"
        out.append(f"{k} ({v['mean_diff']:+.3f}, Holm p {p})")
    return ", ".join(out) or "none"


def _ci(summary: dict[str, Any], name: str, metric: str) -> str:
    v = summary[name][metric]
    return f"{v['mean']:.3f} ± {(v['high'] - v['low']) / 2:.3f}"


def _chance_ci(row: dict[str, Any] | None) -> str:
    """``"0.518 [0.501, 0.536]"``: an estimator's mean R-AUROC and its 95 % t-interval over
    the units of the test against chance (``vs_chance``)."""
    if not row or row.get("mean") is None:
        return "n/a"
    lo, hi = row.get("low"), row.get("high")
    if lo is None or hi is None:
        return f"{row['mean']:.3f}"
    return f"{row['mean']:.3f} [{lo:.3f}, {hi:.3f}]"


def _chance_units(ch: dict[str, Any], unit: str) -> str:
    """``"20 complementary pairs"``: the n of the tests against chance (the range when the
    estimators differ)."""
    ns = sorted({r["n"] for r in ch.values() if isinstance(r, dict) and r.get("n")})
    if not ns:
        return unit
    return f"{ns[0]} {unit}" if len(ns) == 1 else f"{ns[0]}-{ns[-1]} {unit}"


def _borderline(ch: dict[str, Any], order: list[str], chance: float = 0.5) -> list[str]:
    """The estimators labelled "at chance" by the Holm-adjusted test whose own (unadjusted)
    interval excludes ``chance``: a label on the edge."""
    out = []
    for k in order:
        r = ch.get(k) or {}
        lo, hi = r.get("low"), r.get("high")
        if r.get("verdict") == "at chance" and lo is not None and hi is not None:
            if lo > chance or hi < chance:
                out.append(k)
    return out


def tuning_line(doc: dict[str, Any]) -> str:
    """What the runs' settings were chosen on, counted over the class splits: the classes
    whose scores chose them (``tuned_on``) and the classes the searches trained on
    (``tuned_trained_on``), each against the split's downstream classes."""
    runs = [r for r in doc["runs"] if r.get("error") is None]
    splits = sorted({int(r["split"]) for r in runs if r.get("split") is not None})
    tuned = [r for r in runs if r.get("tuned_on")]
    if not tuned:
        return (
            "* **Tuning**: none; every run used the recipe's default settings (``tuned_on`` = [])."
        )
    scored: set[int] = set()
    trained: set[int] = set()
    unknown: set[int] = set()
    for r in tuned:
        down = {int(c) for c in r.get("downstream") or ()}
        if down & {int(c) for c in r["tuned_on"]}:
            scored.add(int(r["split"]))
        if r.get("tuned_trained_on") is None:
            unknown.add(int(r["split"]))
        elif down & {int(c) for c in r["tuned_trained_on"]}:
            trained.add(int(r["split"]))
    n = len(splits)
    words = (
        f"* **Tuning**: the settings were scored on a downstream class in "
        f"{len(scored) or 'none'} of the {n} class splits (``tuned_on``); the searches that "
        f"chose them trained on images of a downstream class in {len(trained) or 'none'} "
        f"of the {n} (``tuned_trained_on``)"
    )
    if unknown:
        words += f", and do not record what they trained on in {len(unknown)}"
    if trained:
        words += (
            ": the settings never saw a downstream class's score, but they are not "
            "independent of every downstream image"
        )
    return words + "."


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _ordinal(i: int) -> str:
    return f"{i}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(i if i < 20 else i % 10, 'th') }"


def _halving_cells(r: dict[str, Any] | None) -> list[str]:
    if not r or r.get("median") is None:
        return ["n/a", "n/a", "n/a"]
    return [f"{r['median']:.2f}", f"{r['q05']:.2f}", f"{r['min']:.2f}"]


def _pairs_table(doc: dict[str, Any], key: str) -> dict[str, Any]:
    """The paired tests with the complementary pair as the unit where the doc has them."""
    return doc.get(f"{key}_pairs") or doc.get(key, {})


def _p(row: dict[str, Any] | None, key: str = "p_t_holm") -> str:
    if not row or row.get(key) is None:
        return "n/a"
    v = row[key]
    return "< 1e-300" if v == 0 else f"{v:.2g}"


def verdict_table(doc: dict[str, Any]) -> str:
    """Per estimator: mean R-AUROC with its 95 % interval over the splits, the Holm p-values
    against CE, against chance and against the best above-chance free baseline (the
    complementary pair as the unit where the splits come in pairs)."""
    s = doc["summary"]
    pc = _pairs_table(doc, "paired_vs_ce").get("r_auroc", {})
    pf = _pairs_table(doc, "paired_vs_best_free_baseline").get("r_auroc", {})
    ch = doc.get("vs_chance", {})
    free = doc.get("best_free_baseline")
    unit = "complementary pair" if doc.get("paired_vs_ce_pairs") else "split"
    order = _best_first(s)
    rows = []
    for n in order:
        c = ch.get(n) or {}
        d = pc.get(n) or {}
        f = pf.get(n) or {}
        interval = "" if c.get("low") is None else f" [{c['low']:.3f}, {c['high']:.3f}]"
        rows.append(
            [
                n,
                _cell(s[n].get("r_auroc"), metric_column("r_auroc")),
                "(reference)" if n == "ce" else f"{d.get('mean_diff', 0):+.3f}, Holm p {_p(d)}",
                f"{c.get('verdict') or 'n/a'}{interval}, Holm p {_p(c)}",
                "(reference)"
                if n == free
                else ("n/a" if not f else f"{f.get('mean_diff', 0):+.3f}, Holm p {_p(f)}"),
            ]
        )
    n_splits = len(doc["settings"].get("class_splits") or [])
    return _list_table(
        f"R-AUROC per estimator: mean ± half-width of the 95 % t-interval over the "
        f"{n_splits} splits; paired difference to CE, the test against chance (0.5) with "
        f"the 95 % t-interval over the {_chance_units(ch, unit + 's')} it tests, and the "
        f"paired difference to the best free baseline above chance "
        f"({free or 'none is above chance'}), each a t-test with the {unit} as the unit, "
        f'Holm-adjusted over the estimators ("at chance": not distinguishable from 0.5 at '
        f"Holm p < 0.05; the interval is not adjusted, so one that just excludes 0.5 can "
        f"sit beside it)",
        ["estimator", _title("r_auroc"), "vs CE", "vs chance", f"vs {free or 'free baseline'}"],
        rows,
    )


def halvings_table(doc: dict[str, Any]) -> str:
    """Split-half Spearman of the R-AUROC ranking for random, pair-preserving and
    class-held-out halvings (median, 5 %, minimum) and each class's value."""
    by = {"random": doc["reproducibility"], **(doc.get("reproducibility_by") or {})}
    rows = []
    for h, label in (
        ("random", "random halvings of the splits"),
        ("pairs", "pair-preserving halvings (complementary pairs kept together)"),
        ("class", "class-held-out (splits with class c downstream vs c upstream)"),
    ):
        for m in PAIRED:
            r = (by.get(h) or {}).get(m)
            if not r or r.get("median") is None:
                continue  # this halving was not possible on these splits
            n = r.get("n_partitions", len(r.get("partitions", [])))
            rows.append([f"{label}, {_title(m)}", str(n), *_halving_cells(r)])
    if not rows:
        return (
            "* **Split-half Spearman**: not computed, the class splits are too few to halve "
            "into two sets that each rank the estimators\n"
        )
    cls = ((by.get("class") or {}).get("r_auroc") or {}).get("per_class") or {}
    per = ", ".join(f"{c}: {v:.2f}" for c, v in cls.items() if v is not None)
    return _list_table(
        "Split-half Spearman correlation of the estimators' mean metric between two halves of "
        "the class splits: median, 5 % quantile and minimum over the halvings"
        + (f"; class-held-out R-AUROC per class: {per}" if per else ""),
        ["halving, metric", "halvings", "median", "5 %", "min"],
        rows,
    )


def verdict(doc: dict[str, Any]) -> str:
    """The verdict of a protocol's ``results.json`` as reStructuredText bullets.

    Every number comes from ``doc``; the words only say which way each comparison went, so
    the text stays true when the results change. One line and nothing else when the runs'
    settings may have been tuned on their own downstream classes (``tuning_check``).
    """
    check = doc.get("tuning_check")
    if not check or not check.get("ok"):
        line = (check or {}).get("line") or (
            "NO VERDICT: these results carry no tuning check (the classes each run's settings "
            "were tuned on are not recorded)"
        )
        return f"* **{line}**\n"
    s = doc["summary"]
    by = {"random": doc["reproducibility"], **(doc.get("reproducibility_by") or {})}
    pc = _pairs_table(doc, "paired_vs_ce")
    pf = _pairs_table(doc, "paired_vs_best_free_baseline")
    ch = doc.get("vs_chance", {})
    free = doc.get("best_free_baseline")
    n = len(doc["settings"].get("class_splits") or [])
    unit = "complementary pairs" if doc.get("paired_vs_ce_pairs") else "splits"
    order = _best_first(s)
    trained = [k for k in order if k not in FREE_BASELINES]

    def h(name: str) -> str:
        r = (by.get(name) or {}).get("r_auroc") or {}
        return f"{_num(r.get('median'))} (5 %: {_num(r.get('q05'))}, min {_num(r.get('min'))})"

    def chance(word: str) -> str:
        ks = [k for k in order if (ch.get(k) or {}).get("verdict") == word]
        return ", ".join(f"{k} {_chance_ci(ch.get(k))}" for k in ks) or "none"

    edge = _borderline(ch, order)

    lines = []
    st = doc["settings"].get("status") or {}
    if doc["settings"].get("interim") and st.get("total"):
        planned = st["total"] // max(len(s), 1)
        lines.append(
            f"* **Interim**: the {n} class splits"
            + (f" ({n // 2} complementary pairs)" if doc.get("paired_vs_ce_pairs") else "")
            + f" on which every estimator had finished when the protocol was stopped, of "
            f"{planned} planned."
        )
    lines += [
        tuning_line(doc),
        f"* **Split-half Spearman of the R-AUROC ranking** over the {n} class splits: random "
        f"halvings {h('random')}; pair-preserving {h('pairs')}; class-held-out {h('class')}.",
        f"* **Against chance** (R-AUROC 0.5; each mean with its 95 % t-interval over the "
        f"{_chance_units(ch, unit)}, the label from the t-test per {unit[:-1]}, Holm over the "
        f"{len(s)} estimators): above: {chance('above')}; below: {chance('below')}; not "
        f"distinguishable after Holm: {chance('at chance')}."
        + (
            f" The interval of {', '.join(edge)} excludes 0.5 before the Holm adjustment: "
            f"a label on the edge, not a finding that u carries nothing."
            if edge
            else ""
        ),
        f"* **Against CE** (CE {_ci(s, 'ce', 'r_auroc')} over the {n} splits; paired per "
        f"{unit[:-1]}, Holm over the {len(s) - 1} others), R-AUROC better: "
        f"{_significant(pc, 'r_auroc', 1)}; worse: {_significant(pc, 'r_auroc', -1)}.",
    ]
    if free:
        lines.append(
            f"* **Against the best free baseline above chance** ({free}, R-AUROC "
            f"{_ci(s, free, 'r_auroc')}), R-AUROC better: {_significant(pf, 'r_auroc', 1)}; "
            f"worse: {_significant(pf, 'r_auroc', -1)}."
        )
    else:
        lines.append(
            "* **No free baseline is above chance**, so none is a bar to beat: "
            + ", ".join(
                f"{k} {_chance_ci(ch.get(k))} ({(ch.get(k) or {}).get('verdict')})"
                for k in FREE_BASELINES
                if k in s
            )
            + "."
        )
    url = [k for k in ("losspred", "mcinfonce") if k in trained]
    if url:
        ranks = " and ".join(
            f"{k} {_ordinal(trained.index(k) + 1)} ({_ci(s, k, 'r_auroc')})" for k in url
        )
        held = [k for k in url if k in _significant_rows(pc, "r_auroc", 1)]
        lines.append(
            f"* **URL's observation** (loss prediction and MCInfoNCE among the best R-AUROC): "
            f"of the {len(trained)} trained estimators {ranks}; ahead of CE after Holm: "
            f"{', '.join(held) or 'neither'}."
        )
    lines += [
        f"* **OOD AUROC** (CE {_ci(s, 'ce', 'ood_auroc')}), better than CE: "
        f"{_significant(pc, 'ood_auroc', 1)}; worse: {_significant(pc, 'ood_auroc', -1)}.",
        f"* **R@1** (CE {_ci(s, 'ce', 'r@1')}), better than CE: {_significant(pc, 'r@1', 1)}.",
    ]
    lines += _selective_risk(doc, unit)
    lines += _map_at_r(doc, unit)
    return "\n".join(lines) + "\n"


def _paired_bullet(
    doc: dict[str, Any], unit: str, key: str, *, higher_is_better: bool, head: str
) -> list[str]:
    """One bullet for ``key``: CE's mean, the three best rows, and which rows differ from CE
    (paired per ``unit``, Holm over the estimators, as the other metrics); nothing where a run
    lacks the metric (runs made before it existed, or that did not ask for it)."""
    runs = [r for r in doc["runs"] if r.get("error") is None]
    s = doc["summary"]
    if "ce" not in s or not runs or any(r.get(key) is None for r in runs):
        return []
    table = {
        key: paired_comparison(
            runs,
            key,
            reference="ce",
            unit="pair" if unit.startswith("complementary") else "run",
            higher_is_better=higher_is_better,
        )
    }
    sign = -1.0 if higher_is_better else 1.0
    best = sorted(s, key=lambda k: sign * s[k][key]["mean"])[:3]
    word = ("higher", "lower") if higher_is_better else ("lower", "higher")
    return [
        f"* {head}; CE {_ci(s, 'ce', key)}; {'highest' if higher_is_better else 'lowest'}: "
        + ", ".join(f"{k} {_ci(s, k, key)}" for k in best)
        + f"), {word[0]} than CE"
        + ("" if higher_is_better else " (the difference signed so that + is better)")
        + f": {_significant(table, key, 1)}; {word[1]}: {_significant(table, key, -1)}."
    ]


def _selective_risk(doc: dict[str, Any], unit: str) -> list[str]:
    """The AURC bullet (the selective risk of the queries kept as u rises, lower is better;
    Geifman et al., 2019)."""
    return _paired_bullet(
        doc,
        unit,
        "aurc",
        higher_is_better=False,
        head="**AURC** (the mean risk of the queries kept as u admits more of them, lower is "
        "better; it mixes R@1 with u's ranking, so a row that retrieves better has a lower "
        "AURC even with u at chance",
    )


def _map_at_r(doc: dict[str, Any], unit: str) -> list[str]:
    """The MAP@R bullet (Musgrave et al., 2020: the ranking of each query's R class-mates,
    higher is better): the embedding's retrieval beyond the first neighbour; u plays no part."""
    return _paired_bullet(
        doc,
        unit,
        "map@r",
        higher_is_better=True,
        head="**MAP@R** (the precision over each query's R nearest items, R its number of "
        "class-mates, higher is better; it scores the embedding, u plays no part",
    )


def against(doc: dict[str, Any], other: dict[str, Any], label: str) -> str:
    """Paired difference of each estimator of ``doc`` to the same estimator in ``other`` over
    the (split, seed) pairs both finished (e.g. tuned minus default settings), one observation
    per complementary pair of splits (their differences averaged: the two splits of a pair
    share their ten classes); Holm over the estimators. A table as text (reStructuredText)."""
    mine = [r for r in doc["runs"] if r.get("error") is None]
    theirs = [r for r in other["runs"] if r.get("error") is None]
    keys = {(r["split"], r["seed"]) for r in mine} & {(r["split"], r["seed"]) for r in theirs}
    names = sorted({r["estimator"] for r in mine} & {r["estimator"] for r in theirs})
    cells: dict[str, dict[str, Any]] = {}
    for metric in PAIRED:
        rows = {}
        for n in names:
            recs = [dict(r, estimator="this") for r in mine if r["estimator"] == n]
            recs += [dict(r, estimator="other") for r in theirs if r["estimator"] == n]
            recs = [r for r in recs if (r["split"], r["seed"]) in keys]
            try:
                rows[n] = paired_comparison(recs, metric, reference="other", unit="pair")["this"]
            except (ValueError, KeyError):  # no run with this metric
                continue
        tested = [n for n, r in rows.items() if r.get("p_t") is not None]
        for n, p in zip(tested, holm([rows[n]["p_t"] for n in tested]) if tested else []):
            rows[n]["p_holm"] = p
        cells[metric] = rows
    units = len(
        set(complementary_pairs([r for r in mine if (r["split"], r["seed"]) in keys]).values())
    )
    table = []
    for n in names:
        row = [n]
        for metric in PAIRED:
            r = cells[metric].get(n)
            if not r or r.get("p_holm") is None:
                row.append("n/a")
                continue
            row.append(f"{r['mean_diff']:+.3f} (p {r['p_t']:.2g}, Holm {r['p_holm']:.2g})")
        table.append(row)
    return _list_table(
        f"Paired difference to {label} over the {len(keys)} class splits both finished, "
        f"{units} complementary pairs as the unit: mean difference, paired t-test p and its "
        f"Holm-adjusted value over the {len(names)} estimators",
        ["estimator", *map(_title, PAIRED)],
        table,
    )


def report(
    folder: Path,
    docs: Path | None,
    name: str | None = None,
    other: tuple[Path, str] | None = None,
) -> str:
    doc = read_results(folder)
    summary, repro = doc["summary"], doc["reproducibility"]
    settings = doc["settings"]
    name = name or str(settings.get("preset") or "standard")
    order = _best_first(summary)
    cols = _columns()
    best = {c.key: c.best((summary[n].get(c.key) or {}).get("mean") for n in order) for c in cols}
    rows = [[n, *(_cell(summary[n].get(c.key), c, best[c.key]) for c in cols)] for n in order]
    parts = []
    check = doc.get("tuning_check")
    if not check or not check.get("ok"):
        parts.append(verdict(doc))
    else:
        parts.append(verdict_table(doc))
    parts.append(halvings_table(doc))
    n_splits = len(settings.get("class_splits") or [])
    status = settings.get("status")
    interim = (
        f" (interim: the {n_splits} splits finished of {status['total'] // len(order)})"
        if settings.get("interim") and status
        else ""
    )
    parts.append(
        _list_table(
            f"Preset {name}{interim}: mean ± half-width of the 95 % t-interval over {n_splits} "
            f"class splits (seed 0), sorted by {_title('r_auroc')}; bold: the best mean of each "
            "column (higher is better"
            + "".join(f"; lower for {c.title}" for c in cols if not c.higher_is_better)
            + ")",
            ["estimator", *(c.title for c in cols)],
            rows,
        )
    )
    n_est = len(order) - 1
    unit = "complementary pairs" if doc.get("paired_vs_ce_pairs") else "(split, seed) pairs"
    parts.append(
        _list_table(
            f"Paired difference to CE over the {unit}: mean difference, paired "
            f"t-test p and its Holm-adjusted value over the {n_est} other estimators",
            ["estimator", *map(_title, PAIRED)],
            _paired_rows(order, _pairs_table(doc, "paired_vs_ce"), "ce"),
        )
    )
    free = doc.get("best_free_baseline")
    if free:
        parts.append(
            _list_table(
                f"Paired difference to the best free baseline above chance ({free}), as above",
                ["estimator", *map(_title, PAIRED)],
                _paired_rows(order, _pairs_table(doc, "paired_vs_best_free_baseline"), free),
            )
        )
    rrow = []
    for k in PAIRED:
        t = _title(k)
        r = repro.get(k, {})
        if r.get("mean") is None:
            rrow.append([t, "n/a", "n/a", "n/a", "n/a", str(r.get("note", ""))])
            continue
        med = r.get("median", r["mean"])
        rrow.append(
            [t, f"{med:.2f}", f"{r['mean']:.2f}", f"{r['min']:.2f}", f"{r['max']:.2f}", _spread(r)]
        )
    for key, row in zip(PAIRED, rrow):
        rel = reliability(doc["runs"], key)
        if rel is None:
            row += ["n/a"] * 4
            continue
        need = rel["splits_for_0.7"]
        row += [
            f"{rel['sd_between_estimators']:.3f}",
            f"{rel['sd_residual']:.3f}",
            f"{rel['icc']:.2f}",
            "never (ICC <= 0)" if math.isinf(need) else f"{need:.0f}",
        ]
    parts.append(
        _list_table(
            "Split-half reproducibility: Spearman correlation of the estimators' mean metric "
            "between two disjoint halves of the class splits, over every balanced partition "
            "(or 2,000 random halvings); variance decomposition over estimator x split "
            "(two-way, one seed) and the number of splits a split-half correlation of 0.7 "
            "would need by Spearman-Brown",
            [
                "metric",
                "median",
                "mean",
                "min",
                "max",
                "distribution",
                "SD between estimators",
                "SD estimator x split",
                "ICC (one split)",
                "splits for 0.7",
            ],
            rrow,
        )
    )
    # training curves: did the loss and the probe u settle?
    crow = []
    runs = [r for r in doc["runs"] if r.get("error") is None]
    for n in sorted({r["estimator"] for r in runs}):
        mine = [r for r in runs if r["estimator"] == n]
        lc = [_last_change(r.get("loss_curve")) for r in mine]
        uc = [_last_change(r.get("u_curve")) for r in mine]
        lc = [v for v in lc if v is not None]
        uc = [v for v in uc if v is not None]
        if not lc and not uc:
            continue
        u_ratio = [
            r["u_curve"][-1] / r["u_curve"][0]
            for r in mine
            if r.get("u_curve") and len(r["u_curve"]) > 1 and r["u_curve"][0]
        ]
        crow.append(
            [
                n,
                f"{max(lc):.3f}" if lc else "n/a",
                f"{max(uc):.3f}" if uc else "n/a",
                f"{min(u_ratio):.3g}-{max(u_ratio):.3g}" if u_ratio else "n/a",
            ]
        )
    parts.append(
        _list_table(
            "Training curves (trained estimators): largest relative change over the last "
            "epoch of the loss and of the median u of a fixed batch of 256 training images, "
            "and the ratio of that u after the last to after the first epoch (over the splits)",
            ["estimator", "loss, last epoch", "u, last epoch", "u last / u first"],
            crow,
        )
    )
    if other is not None:
        odoc = read_results(other[0])
        parts.append(against(doc, odoc, other[1]))
    text = "\n".join(parts)
    if docs is not None:
        head = f".. generated by tools/protocol_report.py from {folder}/results.json; do not edit"
        inc = docs / "concepts" / f"_{name}_results.inc"
        inc.write_text(head + "\n\n" + text)
        if "ce" in summary and summary["ce"].get("r_auroc"):
            (docs / "concepts" / f"_{name}_verdict.inc").write_text(head + "\n\n" + verdict(doc))
    return text


def combine(base: Path, rerun: Path, keep_before: Path | None = None) -> Path:
    """Replace the runs of ``base/results.json`` whose estimator was re-run in ``rerun``.

    For a sweep of which some estimators were run again after a fix (here: the four vMF
    methods after the kappa-head warm-up fix): every record of an estimator present in
    ``rerun/results.json`` replaces that estimator's records of ``base``; the summary, paired
    tests, reproducibility and plots are recomputed (:func:`bayesurl.sweeps.report.
    write_results`) into ``base``. The original ``base`` files are first copied to
    ``keep_before`` (default ``base/before_rerun``). Returns the new ``results.json``.
    """
    old, new = read_results(base), read_results(rerun)
    again = {r["estimator"] for r in new["runs"]}
    keep = keep_before if keep_before is not None else base / "before_rerun"
    keep.mkdir(parents=True, exist_ok=True)
    for f in (
        "results.json", CURVES_FILE, REPRODUCIBILITY_FILE, "results.csv", "recall_vs_rauroc.png",
        "training_curves.png",
    ):  # fmt: skip
        if (base / f).exists() and not (keep / f).exists():
            shutil.copy2(base / f, keep / f)
    runs = [r for r in old["runs"] if r["estimator"] not in again] + new["runs"]
    settings = dict(old["settings"])
    settings["rerun"] = {
        "estimators": sorted(again),
        "from": str(rerun),
        "settings": new["settings"],
        "before": str(keep),
    }
    settings["estimators"] = sorted({r["estimator"] for r in runs})
    settings["sum_of_run_times_s"] = sum(float(r.get("total_time") or 0.0) for r in runs)
    return write_results(runs, base, settings)["json"]


def redraw_curves(folder: Path) -> Path | None:
    """Draw ``folder/training_curves.png`` again from the runs and settings of
    ``folder/results.json`` (every run records its curves): nothing is re-run and no other
    file is rewritten. Returns the figure's path (``None`` when no run carries a curve)."""
    doc = read_results(folder)
    return plot_training_curves(
        doc["runs"], folder / "training_curves.png", title=plot_title(doc["settings"])
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="folder holding results.json")
    ap.add_argument("--docs", type=Path, default=Path("docs"), help="docs folder to update")
    ap.add_argument("--no-docs", action="store_true", help="only print the tables")
    ap.add_argument(
        "--rerun",
        type=Path,
        default=None,
        help="a sweep folder whose estimators replace those of FOLDER (see combine())",
    )
    ap.add_argument(
        "--interim",
        action="store_true",
        help="report the complete class splits of FOLDER/partial_runs.json (an unfinished "
        "stored sweep), written to FOLDER/interim",
    )
    ap.add_argument(
        "--name",
        default=None,
        help="name of the docs files (_NAME_results.inc, _NAME_verdict.inc); default: the preset",
    )
    ap.add_argument(
        "--against",
        type=Path,
        default=None,
        metavar="DIR",
        help="add the paired difference of every estimator to its runs in DIR/results.json "
        "(e.g. the same protocol at other settings)",
    )
    ap.add_argument("--against-label", default=None, help="how the table names DIR")
    ap.add_argument(
        "--curves",
        action="store_true",
        help="only draw FOLDER/training_curves.png again from FOLDER/results.json",
    )
    a = ap.parse_args()
    if a.curves:
        print(redraw_curves(a.folder))
        return
    if a.interim:
        a.folder = write_interim(a.folder)
    if a.rerun is not None:
        combine(a.folder, a.rerun)
    other = None if a.against is None else (a.against, a.against_label or str(a.against))
    print(report(a.folder, None if a.no_docs else a.docs, a.name, other))


if __name__ == "__main__":
    main()
