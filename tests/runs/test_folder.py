"""The folder road (bayesurl.runs.folder, ``bayesurl folder``) on tiny synthetic folders."""

import csv
import json
import warnings

import pytest
import torch
from PIL import Image

from bayesurl.cli import main
from bayesurl.runs.folder import score_folder
from bayesurl.runs.queries import read_queries

FAST = {"backbone": "small_convnet", "epochs": 1, "batch_size": 8, "progress": False}


def _folder(root, labelled=True, n=6, corrupt=True):
    """Three colours of noisy squares; one broken PNG."""
    g = torch.Generator().manual_seed(0)
    for c, rgb in enumerate([(220, 30, 30), (30, 200, 30), (30, 30, 220)]):
        for i in range(n):
            px = torch.tensor(rgb).view(1, 1, 3) + 40 * torch.randn(16, 16, 3, generator=g)
            img = Image.fromarray(px.clamp(0, 255).to(torch.uint8).numpy())
            path = root / f"c{c}" / f"{i}.png" if labelled else root / f"c{c}_{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            img.save(path)
    if corrupt:
        bad = root / "c1" / "broken.png" if labelled else root / "broken.png"
        bad.write_bytes(b"\x89PNG\r\n\x1a\n broken")
    return root


def _rows(path):
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("method", ["tau", "pvu", "laplace"])
def test_labelled_folder(tmp_path, method):
    images = _folder(tmp_path / "imgs")
    with pytest.warns(UserWarning, match="broken.png"):
        res = score_folder(images, out=tmp_path / "out", method=method, **FAST)
    rows = _rows(tmp_path / "out" / "uncertainty.csv")
    assert len(rows) == 19  # every file, the unreadable one included with its error
    broken = [r for r in rows if r["path"] == "c1/broken.png"]
    assert (
        len(broken) == 1 and broken[0]["u"] == "" and "UnidentifiedImageError" in broken[0]["error"]
    )
    good = [r for r in rows if not r["error"]]
    # R@1 recomputed from the CSV's classes (the evaluator's number, from an independent path)
    r1 = sum(r["class"] == r["neighbour_class"] for r in good) / len(good)
    assert res.metrics["r@1"] == pytest.approx(r1)
    assert [int(r["u_rank"]) for r in good] == list(range(1, 19))
    us = [float(r["u"]) for r in good]
    assert us == sorted(us, reverse=True)
    info = json.loads((tmp_path / "out" / "folder.json").read_text())
    assert info["sizes"]["unreadable"] == 1 and info["sizes"]["readable"] == 18
    rec = read_queries(tmp_path / "out" / "queries.npz")
    assert rec.labelled and len(rec.meta["paths"]) == 18


def test_unlabelled_folder_and_strict(tmp_path):
    images = _folder(tmp_path / "flat", labelled=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = score_folder(images, out=tmp_path / "out", **FAST)
    assert res.metrics is None and not res.record.labelled
    rows = _rows(tmp_path / "out" / "uncertainty.csv")
    assert {r["class"] for r in rows} == {""} and len(rows) == 19
    with pytest.raises(ValueError, match="broken.png"):
        score_folder(images, out=tmp_path / "strict", strict=True, **FAST)
    with pytest.raises(ValueError, match="`method`"):
        score_folder(images, out=tmp_path / "x", method="bogus", **FAST)


def test_command_writes_csv_and_report(tmp_path, capsys):
    images = _folder(tmp_path / "imgs", corrupt=False)
    out = tmp_path / "out"
    code = main(["folder", str(images), "--out", str(out), "--backbone", "small_convnet",
                 "--random-weights", "--epochs", "1", "--batch-size", "8",
                 "--no-progress"])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "r@1=" in printed and "report" in printed
    assert (out / "uncertainty.csv").is_file() and (out / "report.html").is_file()
    assert main(["folder", str(tmp_path / "absent"), "--out", str(out)]) == 2
