"""tools/protocol_report.py: the interim report of an unfinished stored sweep."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from bayesurl.sweeps import read_results

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location(
        "protocol_report", ROOT / "tools" / "protocol_report.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(est, split, r_auroc, error=None):
    return {
        "estimator": est, "split": split, "seed": 0, "error": error,
        "r@1": 0.8, "r_auroc": r_auroc, "ood_auroc": 0.7, "ece": None, "ausc": 0.9,
        "tuned_on": [],  # default settings: chosen on no class
    }  # fmt: skip


def test_complete_splits_keeps_only_the_splits_every_estimator_finished():
    tool = _tool()
    runs = [
        _run("ce", 0, 0.5), _run("elk", 0, 0.6), _run("pvu", 0, 0.55),
        _run("ce", 1, 0.5), _run("elk", 1, 0.6),  # pvu still running on split 1
        _run("ce", 2, 0.5), _run("elk", 2, 0.6), _run("pvu", 2, 0.5, error="boom"),
        _run("ce", 3, 0.5), _run("elk", 3, 0.6), _run("pvu", 3, 0.55),
    ]  # fmt: skip
    for r in runs:
        r["method"] = r["estimator"]
    kept = tool.complete_splits(runs)
    assert sorted({r["split"] for r in kept}) == [0, 3]
    assert len(kept) == 6 and all(r["error"] is None for r in kept)


def test_interim_report_writes_results_of_the_complete_splits(tmp_path):
    tool = _tool()
    runs = []
    for split in range(4):
        for i, est in enumerate(("ce", "elk", "pvu", "feature_norm")):
            runs.append(_run(est, split, 0.5 + 0.02 * i + 0.01 * split))
    runs.append(_run("ce", 4, 0.9))  # split 4 unfinished: must not enter the means
    status = {"waiting": 11, "running": 1, "complete": 17, "failed": 0, "total": 20}
    (tmp_path / "partial_runs.json").write_text(
        json.dumps({"preset": "demo", "status": status, "runs": runs})
    )
    out = tool.write_interim(tmp_path)
    doc = read_results(out)
    assert doc["settings"]["class_splits"] == [0, 1, 2, 3]
    assert doc["summary"]["ce"]["r_auroc"]["mean"] == pytest.approx(0.515)
    text = tool.report(out, None)
    assert "interim: the 4 splits finished of 5" in text
    assert "best free baseline above chance (feature_norm" in text


def test_interim_report_needs_two_complete_splits(tmp_path):
    tool = _tool()
    runs = [dict(_run(e, 0, 0.5), method=e) for e in ("ce", "elk", "pvu")]
    (tmp_path / "partial_runs.json").write_text(json.dumps({"preset": "x", "runs": runs}))
    with pytest.raises(SystemExit, match="1 complete class splits"):
        tool.write_interim(tmp_path)


def test_verdict_names_who_beats_ce_and_is_written_under_the_given_name(tmp_path):
    tool = _tool()
    noise = [0.01, -0.02, 0.015, -0.005, 0.02, -0.01, 0.0, 0.005]
    runs = []
    for split, e in enumerate(noise):
        for est, level in (("ce", 0.5), ("pvu", 0.6), ("elk", 0.44), ("losspred", 0.49),
                           ("feature_norm", 0.48)):  # fmt: skip
            jitter = 0.004 * ((split * 7 + len(est)) % 3 - 1)  # paired, not identical
            runs.append(dict(_run(est, split, level + e + jitter), method=est))
    (tmp_path / "partial_runs.json").write_text(json.dumps({"preset": "demo", "runs": runs}))
    out = tool.write_interim(tmp_path)
    doc = read_results(out)
    text = tool.verdict(doc)
    assert "R-AUROC better: pvu (+0.099" in text
    assert "worse: elk (-0.060" in text
    assert "above: pvu 0.6" in text and "below: feature_norm 0.48" in text
    assert "No free baseline is above chance" in text  # feature_norm is no bar to beat
    assert "losspred 3rd" in text and "ahead of CE after Holm: neither" in text
    docs = tmp_path / "docs"
    (docs / "concepts").mkdir(parents=True)
    tool.report(out, docs, "demo_tuned")
    inc = (docs / "concepts" / "_demo_tuned_verdict.inc").read_text()
    assert inc.endswith(text) and (docs / "concepts" / "_demo_tuned_results.inc").is_file()
    assert not (docs / "_static").exists()  # the pages link the plots in results/ itself


def test_against_pairs_each_estimator_with_itself_in_the_other_sweep(tmp_path):
    tool = _tool()
    docs = []
    for shift, name in ((0.0, "default"), (0.05, "tuned")):
        runs = []
        for split in range(6):
            e = 0.01 * ((split * 5) % 4)
            for est in ("ce", "pvu"):
                gain = shift + 0.002 * (split % 3) if est == "pvu" else 0.0
                runs.append(dict(_run(est, split, 0.5 + e + gain), method=est))
        if name == "tuned":
            runs = [r for r in runs if r["split"] != 5]  # not finished there: not paired
        folder = tmp_path / name
        folder.mkdir()
        (folder / "partial_runs.json").write_text(json.dumps({"preset": "p", "runs": runs}))
        docs.append(read_results(tool.write_interim(folder)))
    text = tool.against(docs[1], docs[0], "the defaults")
    assert "over the 5 class splits both finished" in text
    rows = text.split("* - ")
    ce = next(r for r in rows if r.startswith("ce\n"))
    pvu = next(r for r in rows if r.startswith("pvu\n"))
    assert "+0.000 (p 1, Holm 1)" in ce
    r_auroc = pvu.split("\n")[1]
    assert "+0.050" in r_auroc and "Holm 1)" not in r_auroc


def test_against_uses_the_complementary_pair_as_the_unit(tmp_path):
    """Splits 2k and 2k+1 swap their classes: the test runs on the 3 pair means, checked
    against scipy's paired t-test on them (independently of the tool's aggregation)."""
    tool = _tool()
    classes = [((0, 1), (2, 3)), ((2, 3), (0, 1))]
    gains = {0: 0.01, 1: 0.05, 2: 0.02, 3: 0.08, 4: 0.03, 5: 0.01}
    docs = []
    for name in ("default", "tuned"):
        runs = []
        for split in range(6):
            up, down = classes[split % 2]
            up = tuple(c + 10 * (split // 2) for c in up)
            down = tuple(c + 10 * (split // 2) for c in down)
            for est in ("ce", "pvu"):
                gain = gains[split] if (est == "pvu" and name == "tuned") else 0.0
                r = dict(_run(est, split, 0.5 + 0.01 * split + gain), method=est)
                r.update(upstream=list(up), downstream=list(down))
                runs.append(r)
        folder = tmp_path / name
        folder.mkdir()
        (folder / "partial_runs.json").write_text(json.dumps({"preset": "p", "runs": runs}))
        docs.append(read_results(tool.write_interim(folder)))
    text = tool.against(docs[1], docs[0], "the defaults")
    assert "6 class splits both finished, 3 complementary pairs as the unit" in text
    pair_means = [np.mean([gains[2 * k], gains[2 * k + 1]]) for k in range(3)]
    p = scipy.stats.ttest_1samp(pair_means, 0.0).pvalue
    pvu = next(r for r in text.split("* - ") if r.startswith("pvu\n"))
    assert f"{np.mean(pair_means):+.3f} (p {p:.2g}," in pvu.split("\n")[1]


def test_verdict_states_aurc_lower_is_better_against_ce_only_when_every_run_has_it(tmp_path):
    """AURC's bullet: the row whose AURC is lower than CE's in every split is named under
    "lower than CE" (lower is better; the paired difference signed so that + is better),
    the one above CE's under "higher"; runs without AURC (made before it existed) give no
    bullet rather than a mean over some splits."""
    tool = _tool()
    noise = [0.01, -0.02, 0.015, -0.005, 0.02, -0.01, 0.0, 0.005]
    runs = []
    for split, e in enumerate(noise):
        for est, aurc in (("ce", 0.20), ("pvu", 0.15), ("elk", 0.26), ("feature_norm", 0.2)):
            jitter = 0.003 * ((split * 5 + len(est)) % 3 - 1)
            runs.append(dict(_run(est, split, 0.5 + e), method=est, aurc=aurc + e + jitter))
    (tmp_path / "partial_runs.json").write_text(json.dumps({"preset": "demo", "runs": runs}))
    doc = read_results(tool.write_interim(tmp_path))
    text = tool.verdict(doc)
    line = next(x for x in text.splitlines() if x.startswith("* **AURC**"))
    lower, higher = line.split("lower than CE")[1].split("; higher: ")
    assert "pvu (+0.050" in lower and "elk" not in lower
    assert "elk (-0.060" in higher and "pvu" not in higher
    assert "CE 0.20" in line and "lowest: pvu 0.15" in line
    for r in doc["runs"]:
        if r["split"] == 3:
            r["aurc"] = None
    assert "AURC" not in tool.verdict(doc)


def test_verdict_states_map_at_r_higher_is_better_against_ce_only_when_every_run_has_it(
    tmp_path,
):
    """MAP@R's bullet: higher is better, so the row above CE in every split is named under
    "higher than CE" with a positive paired difference and the row below under "lower"; the
    three highest rows are listed, best first; a run without MAP@R (a protocol that did not ask
    for it) gives no bullet."""
    tool = _tool()
    noise = [0.01, -0.02, 0.015, -0.005, 0.02, -0.01, 0.0, 0.005]
    runs = []
    for split, e in enumerate(noise):
        for est, m in (("ce", 0.40), ("feature_norm", 0.47), ("elk", 0.33), ("pvu", 0.4)):
            jitter = 0.003 * ((split * 5 + len(est)) % 3 - 1)
            runs.append(dict(_run(est, split, 0.5 + e), method=est, **{"map@r": m + e + jitter}))
    (tmp_path / "partial_runs.json").write_text(json.dumps({"preset": "demo", "runs": runs}))
    doc = read_results(tool.write_interim(tmp_path))
    line = next(x for x in tool.verdict(doc).splitlines() if x.startswith("* **MAP@R**"))
    higher, lower = line.split("higher than CE: ")[1].split("; lower: ")
    assert "feature_norm (+0.070" in higher and "elk" not in higher
    assert "elk (-0.070" in lower and "feature_norm" not in lower
    assert "pvu" not in higher and "pvu" not in lower
    assert "CE 0.40" in line and "highest: feature_norm 0.47" in line
    top = line.split("highest: ")[1].split("), higher than CE")[0]
    assert top.startswith("feature_norm") and "pvu" in top and "elk" not in top
    for r in doc["runs"]:
        if r["split"] == 3:
            r["map@r"] = None
    assert "MAP@R" not in tool.verdict(doc)
