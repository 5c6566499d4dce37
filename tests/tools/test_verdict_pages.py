"""The verdict pages' generated tables: written again from the committed ``results/`` they
match the committed includes byte for byte, and every "above / at / below chance" label in
them stands beside its interval (a label alone reads as a categorical fact; CE's "at chance"
at the defaults is 0.518 [0.501, 0.536], on the edge)."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from bayesurl.sweeps import read_results

ROOT = Path(__file__).resolve().parents[2]
CONCEPTS = ROOT / "docs" / "concepts"

#: (results folder, docs name, --against folder): the includes of docs/concepts/which_method.rst
PROTOCOLS = (
    ("results/pretrained/crossfit/default", "pretrained", None),
    (
        "results/pretrained/crossfit/tuned",
        "pretrained_tuned",
        "results/pretrained/crossfit/default",
    ),
    ("results/clipart/protocol", "clipart", None),
    ("results/sweeps/standard", "standard", None),
)
CROSS = ("results/clipart/protocol", "results/pretrained/crossfit/default")

NUM = r"\d\.\d{3}"
WITH_INTERVAL = re.compile(rf"^[\w@]+ {NUM} \[{NUM}, {NUM}\]$")


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("folder", "name", "against"), PROTOCOLS)
def test_protocol_includes_are_written_from_the_committed_results(
    tmp_path, monkeypatch, folder, name, against
):
    tool = _tool("protocol_report")
    monkeypatch.chdir(ROOT)  # the includes name the results folder relative to the root
    (tmp_path / "concepts").mkdir()
    other = None if against is None else (Path(against), against)
    tool.report(Path(folder), tmp_path, name, other)
    for kind in ("results", "verdict"):
        committed = CONCEPTS / f"_{name}_{kind}.inc"
        if not committed.exists():  # the standard sweep has no verdict page
            assert kind == "verdict" and name == "standard"
            continue
        written = (tmp_path / "concepts" / f"_{name}_{kind}.inc").read_text()
        assert written == committed.read_text(), (
            f"{committed.relative_to(ROOT)} is stale: write it again with "
            f"tools/protocol_report.py {folder} --name {name}"
        )


def test_cross_domain_include_is_written_from_the_committed_results(monkeypatch):
    tool = _tool("cross_domain_report")
    monkeypatch.chdir(ROOT)
    docs = {
        lab: read_results(ROOT / f, detail=False)
        for lab, f in zip(("clipart", "FashionMNIST"), CROSS)
    }
    res = tool.cross_domain(docs)
    res["sources"] = dict(zip(("clipart", "FashionMNIST"), CROSS))
    assert tool.rst(res, res["sources"]) == (CONCEPTS / "_cross_domain.inc").read_text()
    committed = json.loads((ROOT / "results/clipart/cross_domain.json").read_text())
    assert json.loads(json.dumps(res)) == committed


def _verdict_lists(text: str) -> dict[str, list[str]]:
    """The estimators listed after each chance label of the "Against chance" bullet."""
    line = next(x for x in text.splitlines() if x.startswith("* **Against chance**"))
    body = line.split("): ", 1)[1]
    out = {}
    for label, nxt in (
        ("above: ", "; below: "),
        ("; below: ", "; not distinguishable after Holm: "),
        ("; not distinguishable after Holm: ", None),
    ):
        part = body.split(label, 1)[1]
        part = part.split(nxt, 1)[0] if nxt else part.split(". ", 1)[0].rstrip(".")
        out[label.strip("; :")] = [] if part == "none" else part.split(", ")
    # the items are "name mean [lo, hi]": rejoin what the split at ", " cut apart
    return {k: [", ".join(v[i : i + 2]) for i in range(0, len(v), 2)] for k, v in out.items()}


@pytest.mark.parametrize("name", ["pretrained", "pretrained_tuned", "clipart"])
def test_every_chance_label_of_a_verdict_page_has_its_interval(name):
    text = (CONCEPTS / f"_{name}_verdict.inc").read_text()
    lists = _verdict_lists(text)
    folder = next(f for f, docs_name, _ in PROTOCOLS if docs_name == name)
    doc = json.loads((ROOT / folder / "results.json").read_text())
    # every estimator of the protocol carries one label
    assert sum(map(len, lists.values())) == len(doc["vs_chance"]) >= 19
    for label, items in lists.items():
        for item in items:
            assert WITH_INTERVAL.match(item), (name, label, item)
            m, lo, hi = map(float, re.findall(NUM, item))
            assert lo <= m <= hi
            if label == "above":
                assert lo > 0.5
            elif label == "below":
                assert hi < 0.5
    free = [x for x in text.splitlines() if x.startswith("* **No free baseline")]
    for line in free:
        for item in re.findall(r"(\w+ [^()]+) \((?:above|below|at chance)\)", line):
            assert WITH_INTERVAL.match(item.split(": ")[-1]), item
    tables = (CONCEPTS / f"_{name}_results.inc").read_text()
    cells = re.findall(r"^     - ((?:above|below|at chance).*)$", tables, flags=re.M)
    assert len(cells) == len(doc["vs_chance"])
    for cell in cells:
        assert re.match(rf"^(above|below|at chance) \[{NUM}, {NUM}\], Holm p ", cell), cell


def test_cross_domain_spearman_has_its_intervals_and_n():
    text = (CONCEPTS / "_cross_domain.inc").read_text()
    cells = re.findall(r"^     - ([+-]\d\.\d\d.*\(p .*)$", text, flags=re.M)
    assert len(cells) == 3  # R-AUROC, R@1, OOD AUROC
    both = json.loads((ROOT / "results/clipart/cross_domain.json").read_text())["estimators"]
    for cell in cells:
        pattern = rf"^[+-]\d\.\d\d \[[+-]\d\.\d\d, [+-]\d\.\d\d\] \(p \S+, n {len(both)}\)$"
        assert re.match(pattern, cell), cell


def test_tuning_line_counts_splits_whose_search_trained_on_a_downstream_class():
    tool = _tool("protocol_report")
    runs = [
        # scored on 3, 4 (upstream); the search trained on 0, 1, 2: 0 is downstream here
        {"split": 0, "downstream": [0, 5], "tuned_on": [3, 4], "tuned_trained_on": [0, 1, 2]},
        {"split": 1, "downstream": [6, 8], "tuned_on": [3, 4], "tuned_trained_on": [0, 1, 2]},
        {"split": 2, "downstream": [3, 9], "tuned_on": [3, 4], "tuned_trained_on": [0, 1, 2]},
    ]
    line = tool.tuning_line({"runs": runs})
    assert "scored on a downstream class in 1 of the 3 class splits" in line
    assert "trained on images of a downstream class in 1 of the 3" in line
    defaults = tool.tuning_line({"runs": [{"split": 0, "downstream": [1], "tuned_on": []}]})
    assert "none; every run used the recipe's default settings" in defaults
    committed = (CONCEPTS / "_pretrained_tuned_verdict.inc").read_text()
    assert "scored on a downstream class in none of the 40" in committed
    assert "trained on images of a downstream class in 38 of the 40" in committed


def test_spearman_interval_covers_the_truth():
    """Fisher's z with Fieller's variance: 95 % coverage of the population Spearman of a
    bivariate normal (6 / pi asin(r / 2)) at the docs' n = 19, within simulation error."""
    tool = _tool("cross_domain_report")
    rng = np.random.default_rng(3)
    n, r, draws = 19, 0.5, 1000
    truth = 6 / math.pi * math.asin(r / 2)
    hits = 0
    for _ in range(draws):
        x = rng.multivariate_normal([0, 0], [[1, r], [r, 1]], n)
        lo, hi = tool.spearman_interval(float(stats.spearmanr(x[:, 0], x[:, 1]).statistic), n)
        hits += lo <= truth <= hi
    assert 0.93 <= hits / draws <= 0.98


def test_pair_bootstrap_has_no_width_without_split_noise():
    tool = _tool("cross_domain_report")
    rng = np.random.default_rng(0)
    means = rng.uniform(0.4, 0.6, (7, 1))
    a = np.repeat(means, 5, axis=1)  # every pair gives each estimator the same value
    b = np.repeat(means[::-1] + 0.01 * np.arange(7)[:, None], 4, axis=1)
    lo, hi = tool.pair_bootstrap(a, b, draws=50)
    rho = stats.spearmanr(a[:, 0], b[:, 0]).statistic
    assert lo == pytest.approx(rho) and hi == pytest.approx(rho)
    noisy_lo, noisy_hi = tool.pair_bootstrap(a + rng.normal(0, 0.2, a.shape), b, draws=200)
    assert noisy_hi - noisy_lo > 0.1


def test_the_pages_quote_chance_intervals_from_the_results():
    """Every "mean [low, high]" typed into the verdict pages' prose is an estimator's test
    against chance or a metric's summary over the splits in a committed results.json (or a
    folder row's interval in results/folder_reference), and the sentences that claimed more
    than the data carry stay gone."""
    known = set()
    for folder, _, _ in PROTOCOLS[:3]:
        doc = json.loads((ROOT / folder / "results.json").read_text())
        rows = list(doc["vs_chance"].values())
        # each metric's mean over the splits with its t-interval, as the protocol summarises it
        rows += [
            st
            for stats in doc["summary"].values()
            for st in stats.values()
            if isinstance(st, dict) and st.get("low") is not None and "mean" in st
        ]
        for row in rows:
            known.add(f"{row['mean']:.3f} [{row['low']:.3f}, {row['high']:.3f}]")
    # the folder rows of the scores that train nothing (benchmarks/folder_reference_rows.py)
    folders = json.loads((ROOT / "results/folder_reference/results.json").read_text())
    for rows in folders["folders"].values():
        for row in rows.values():
            for key in ("r@1", "r_auroc", "ausc"):
                low, high = row[f"{key}_interval"][:2]
                known.add(f"{row[key]:.3f} [{low:.3f}, {high:.3f}]")
    pages = [CONCEPTS / "which_method.rst", ROOT / "results/pretrained/crossfit/README.md"]
    pages.append(ROOT / "results/clipart/protocol/README.md")
    for page in pages:
        text = " ".join(page.read_text().split())  # a quote may wrap over two lines
        quoted = re.findall(rf"{NUM} \[{NUM}, {NUM}\]", text)
        assert quoted, page
        assert set(quoted) <= known, (page, set(quoted) - known)
        assert "never saw a test class" not in text
        assert "R-AUROC of 0.63" not in text
        assert "transfer between the domains" not in text
        assert "rank the estimators alike" not in text
