"""The one run record and the results it makes: written slim, read back whole.

A run's row (:class:`bayesurl.sweeps.record.RunRecord`) names its estimator ``estimator``;
rows stored before (``method``) read the same. ``results.json`` keeps the summary, the
verdict tables and each run's metrics; the training curves and the reproducibility's
halvings lie compressed beside it and :func:`read_results` puts the document together again,
equal to what was computed. The benchmark command makes its notes and page from what it has
in memory, never reading ``results.json`` back.
"""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesurl.files import FormatError, jsonable
from bayesurl.sweeps.record import RunRecord, estimator_of, run_rows
from bayesurl.sweeps.report import (
    CURVES_FILE,
    REPRODUCIBILITY_FILE,
    RESULTS_FORMAT,
    read_results,
    results_document,
    save_results,
    write_document,
)


def test_a_row_round_trips_and_old_rows_read_the_same():
    row = {"estimator": "ce", "split": 2, "seed": 1, "error": None, "r@1": 0.5, "loss_curve": [1]}
    rec = RunRecord.from_row(row)
    assert (rec.estimator, rec.split, rec.seed, rec.ok) == ("ce", 2, 1, True)
    assert rec.to_row() == row and "loss_curve" not in rec.to_row(curves=False)
    assert rec.curves() == {"loss_curve": [1], "u_curve": None}
    # stored before the name was `estimator`: `method` alone, or both (the committed sweeps)
    old = {"method": "ce", "split": 2, "seed": 1, "error": None, "r@1": 0.5, "loss_curve": [1]}
    assert RunRecord.from_row(old) == rec
    assert RunRecord.from_row({**old, "estimator": "ce"}).to_row() == row
    assert run_rows([old, rec]) == [row, row]
    assert RunRecord.from_row({"estimator": "ce", "seed": 0}).split == 0  # the standard split
    with pytest.raises(ValueError, match="neither 'estimator' nor 'method'"):
        estimator_of({"seed": 0})
    with pytest.raises(ValueError, match="must not hold"):
        RunRecord("ce", 0, values={"method": "x"})
    with pytest.raises(AttributeError):
        rec.estimator = "x"  # frozen


def test_jsonable_makes_every_value_json():
    doc = jsonable(
        {
            1: (np.int64(3), np.float32(0.25), float("nan")),
            "t": torch.tensor([1.0, float("inf")]),
            "s": torch.tensor(2),
            "b": np.bool_(True),
            "o": Path("x"),
        }
    )
    assert doc == {"1": [3, 0.25, None], "t": [1.0, None], "s": 2, "b": True, "o": "x"}
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc


def _records(n_split=4, names=("ce", "a", "b", "c")):
    rng = np.random.default_rng(0)
    out = []
    for k in range(n_split):
        for i, n in enumerate(names):
            out.append(
                {
                    "estimator" if i % 2 else "method": n,
                    "split": k,
                    "seed": 0,
                    "error": None,
                    "r@1": float(0.5 + 0.05 * i + 0.01 * rng.standard_normal()),
                    "r_auroc": float(0.55 + 0.03 * i + 0.01 * rng.standard_normal()),
                    "ood_auroc": float(0.6 + 0.02 * i + 0.01 * rng.standard_normal()),
                    "loss_curve": [2.0, 1.5, 1.2 + 0.01 * k],
                    "u_curve": [0.3, 0.2, 0.1],
                }
            )
    return out


def _canon(x):
    return json.dumps(x, sort_keys=True)


def test_results_are_written_slim_and_read_back_whole(tmp_path):
    recs = _records()
    doc, paths = save_results(recs, tmp_path, {"preset": "t"})
    assert doc == results_document(recs, {"preset": "t"}, queries=tmp_path / "queries")
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["format"] == "bayesurl.results/3"
    assert on_disk["files"] == {"curves": CURVES_FILE, "reproducibility": REPRODUCIBILITY_FILE}
    # results.json: each run's metrics without its curves, one line per run (its column set,
    # then its values; the values every run shares written once); the halvings counted,
    # their list beside
    (cols,) = on_disk["run_columns"]
    assert cols["keys"][:3] == ["estimator", "split", "seed"] and "loss_curve" not in cols["keys"]
    assert cols["same"] == {"seed": 0, "error": None}
    assert [r[:2] for r in on_disk["runs"][:4]] == [[0, "ce"], [0, "a"], [0, "b"], [0, "c"]]
    lines = (tmp_path / "results.json").read_text().splitlines()
    assert sum(line.lstrip().startswith("[0,") for line in lines) == len(recs)
    random = on_disk["reproducibility"]["r_auroc"]
    assert "partitions" not in random and random["n_partitions"] == 3
    assert random["median"] == doc["reproducibility"]["r_auroc"]["median"]
    side = json.loads(gzip.decompress((tmp_path / CURVES_FILE).read_bytes()))
    assert side["curves"][0] == {"loss_curve": [2.0, 1.5, 1.2], "u_curve": [0.3, 0.2, 0.1]}
    # read back: the document as computed, in full
    back = read_results(tmp_path)
    assert _canon(back) == _canon(doc)
    assert len(back["reproducibility"]["r_auroc"]["partitions"]) == 3
    slim = read_results(tmp_path / "results.json", detail=False)
    assert "loss_curve" not in slim["runs"][0] and slim["summary"] == doc["summary"]
    assert paths["json"] == tmp_path / "results.json" and paths["training_curves"].is_file()
    # the same results give the same bytes (the archives carry no time stamp)
    first = {p: (tmp_path / p).read_bytes() for p in ("results.json", CURVES_FILE)}
    save_results(recs, tmp_path, {"preset": "t"})
    assert first == {p: (tmp_path / p).read_bytes() for p in first}


def test_a_standard_split_result_keeps_its_notes_in_results_json(tmp_path):
    """One split: no halving to keep beside; runs without curves: no curves file."""
    recs = [{k: v for k, v in r.items() if "curve" not in k} for r in _records(1)]
    _, paths = save_results(recs, tmp_path, {})
    assert "curves" not in paths and "reproducibility" not in paths
    assert not (tmp_path / CURVES_FILE).exists() and not (tmp_path / REPRODUCIBILITY_FILE).exists()
    doc = read_results(tmp_path)
    assert "note" in doc["reproducibility"]["r_auroc"]


def test_earlier_and_newer_formats(tmp_path):
    """A format-1 file (everything inline, rows naming ``method``) reads as before; a newer
    format is refused; a side file that is not what results.json says is named."""
    doc = results_document(_records(), {"preset": "t"})
    old = {**doc, "format": "bayesurl.results/1"}
    old["runs"] = [
        {"method": r["estimator"], **{k: v for k, v in r.items() if k != "estimator"}}
        for r in doc["runs"]
    ]
    (tmp_path / "results.json").write_text(json.dumps(old, indent=2))
    back = read_results(tmp_path)
    assert _canon({**back, "format": doc["format"]}) == _canon(doc)
    (tmp_path / "results.json").write_text(json.dumps({**old, "format": "bayesurl.results/4"}))
    with pytest.raises(FormatError, match="newer bayesurl"):
        read_results(tmp_path)
    save_results(_records(), tmp_path / "new", {})
    (tmp_path / "new" / CURVES_FILE).write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=CURVES_FILE.replace(".", r"\.")):
        read_results(tmp_path / "new")
    # without the detail the side files are not opened
    assert read_results(tmp_path / "new", detail=False)["runs"]


def test_format_2_rewritten_as_format_3_reads_the_same(tmp_path):
    """Runs of several shapes (a failed run, fields some runs lack, values of one type in
    some runs and another in others) written as format 2 (each run a mapping), read,
    written again (format 3: the runs a table) and read: the same document, every run the
    same mapping in the same key order."""
    recs = _records()
    recs[1] = {k: recs[1][k] for k in ("estimator", "split", "seed")} | {"error": "boom"}
    recs[2] = {**recs[2], "r@1_interval": "wilson", "r@1_n": 40, "interval_level": 0.95}
    recs[3] = {**recs[3], "steps": 10}
    recs[5] = {**recs[5], "steps": 10.0}
    doc = results_document(recs, {"preset": "t"})
    rows = [{k: v for k, v in r.items() if "curve" not in k} for r in doc["runs"]]
    old = {k: v for k, v in doc.items() if k != "runs"}  # written as format 2 wrote it
    old.update(format="bayesurl.results/2", files={}, runs=rows)
    (tmp_path / "results.json").write_text(json.dumps(old, indent=1))
    before = read_results(tmp_path)
    write_document(tmp_path / "new", {**before, "format": RESULTS_FORMAT})
    after = read_results(tmp_path / "new")
    assert [list(r) for r in after["runs"]] == [list(r) for r in before["runs"]]
    assert _canon(after["runs"]) == _canon(before["runs"]) == _canon(rows)
    assert _canon({**after, "format": None}) == _canon({**before, "format": None})
    assert list(after) == list(before)
    table = json.loads((tmp_path / "new" / "results.json").read_text())
    assert len(table["run_columns"]) == 4  # the failed run, the plain ones, two with more
    # a row that does not fit its column set is named
    table["runs"][0] = table["runs"][0][:-1]
    (tmp_path / "new" / "results.json").write_text(json.dumps(table))
    with pytest.raises(ValueError, match=r"runs\[0\] does not fit its run_columns"):
        read_results(tmp_path / "new")


def test_the_benchmark_report_is_made_from_memory(tmp_path, monkeypatch, capsys):
    """``commands/benchmark.report`` prints the table and notes and writes the page from the
    records and the document it holds: reading results.json back fails the test."""
    from bayesurl.commands import benchmark
    from bayesurl.report import page, sources
    from bayesurl.sweeps.results import SweepResults

    recs = _records()
    res = SweepResults(runs=run_rows(recs), settings={"preset": "t", "plan": {"splits": 0}})
    res.save(tmp_path)
    res.status = {"complete": len(recs), "failed": 0, "total": len(recs)}
    res.settings["total_time"] = 1.0

    def refuse(*args, **kwargs):
        raise AssertionError("results read back from disk")

    monkeypatch.setattr(sources, "read_results", refuse)
    monkeypatch.setattr(page, "load_source", refuse)
    assert benchmark.report(res) == 0
    out = capsys.readouterr().out
    assert "report " in out and "0 thumbnails" in out
    html = (tmp_path / "report.html").read_text()
    assert "bayesurl benchmark" in html
