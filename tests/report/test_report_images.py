"""Every road to a report shows the images its queries came from (decoded and compared).

One test per road: ``bayesurl run``, ``bayesurl benchmark`` from scratch and on frozen
pretrained features (its folder reported again: the benchmark's own page leaves the
thumbnails to ``bayesurl report DIR``), a protocol over class splits kept in a sweep storage,
``bayesurl folder``; each decodes every thumbnail of the written page and compares it with the
source image it names, read independently (:mod:`_pictures`). Where a result has no way back
to its images the page says so in words and shows none.
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from _pictures import FASHION_MNIST, assert_pictures, idx_images, model
from PIL import Image

from bayesurl.cli import main
from bayesurl.report import write_report
from bayesurl.report.page import LATER_IMAGES
from bayesurl.runs.queries import read_queries
from bayesurl.sweeps import run_sweep

pytestmark = pytest.mark.skipif(
    not (FASHION_MNIST / "t10k-images-idx3-ubyte.gz").is_file(),
    reason="FashionMNIST is not installed (apt-get install dataset-fashion-mnist)",
)

SMALL = ["data.max_train=96", "data.max_test=60", "data.max_ood=40"]
ROOT = Path(__file__).resolve().parents[2]


def _records(folder):
    return [read_queries(p) for p in sorted((folder / "queries").glob("*.npz"))]


def test_run_road(tmp_path, capsys):
    out = tmp_path / "run"
    small = [a for s in SMALL for a in ("--set", s)]
    code = main(["run", "fashion_mnist/ce", "--preset", "smoke", *small, "--out", str(out),
                 "--no-progress"])  # fmt: skip
    assert code == 0
    rec = read_queries(out / "queries.npz")
    assert rec.source.size == rec.u.size and rec.ood_source.size == rec.ood_u.size
    m = assert_pictures((out / "report.html").read_text(), [rec])
    assert any(k.startswith("o") for k in m["thumbs"])  # the OOD digits too


def test_benchmark_road_from_scratch(bench_dir, tmp_path, capsys):
    """``bayesurl report DIR`` on ``bayesurl benchmark``'s folder (two estimators)."""
    page = tmp_path / "bench.html"
    assert main(["report", str(bench_dir), "--out", str(page)]) == 0
    m = assert_pictures(page.read_text(), _records(bench_dir))
    assert len(m["estimators"]) == 2


def test_pretrained_benchmark_road(pretrained_dir, tmp_path):
    """Frozen features: the page shows the 28 x 28 input image, not the feature vector.

    The benchmark writes its page from the results in memory without building the data
    again: its galleries say where the thumbnails are drawn; ``bayesurl report DIR`` draws
    them."""
    (rec,) = _records(pretrained_dir)
    assert rec.source.size == rec.u.size and rec.ood_source.size == rec.ood_u.size
    first = model((pretrained_dir / "report.html").read_text())
    assert first["thumbs"] == {} and [e["images"] for e in first["estimators"]] == [LATER_IMAGES]
    assert first["rows"] and first["estimators"][0]["notes"] is not None
    page = tmp_path / "again.html"
    assert main(["report", str(pretrained_dir), "--out", str(page)]) == 0
    assert_pictures(page.read_text(), [rec])


def test_stored_protocol_road(tmp_path):
    """A protocol over class splits in a sweep storage, reported from its folder."""
    out = tmp_path / "protocol"
    run_sweep(["ce", "feature_norm"], preset="pretrained_smoke", splits=2, device="cpu",
              out=out, storage=f"sqlite:///{tmp_path / 'sweep.db'}",
              overrides=[f"backbone.cache={tmp_path / 'features'}"], progress=False,
              raise_errors=True)  # fmt: skip
    assert json.loads((out / "results.json").read_text())["settings"]["class_splits"]
    info = write_report(out)
    m = model(info["path"].read_text())
    assert [e["split"] for e in m["estimators"]] == [0, 0]
    by_name = {e["name"]: e for e in m["estimators"]}
    recs = [read_queries(out / "queries" / f"{n}_split0_s0.npz") for n in by_name]
    assert_pictures(info["path"].read_text(), recs)


def test_committed_protocol_says_it_has_no_images(tmp_path):
    """The committed protocol kept no per-query record: no picture, and the page says why."""
    folder = ROOT / "results" / "pretrained" / "protocol"
    if not (folder / "results.json").is_file():
        pytest.skip("results/pretrained/protocol is not in this checkout")
    html = write_report(folder, out=tmp_path / "p.html")["path"].read_text()
    m = model(html)
    assert m["thumbs"] == {} and m["estimators"] == [] and len(m["missing"]) == len(m["rows"])
    assert "images cannot be shown" in html


def test_folder_road(tmp_path, capsys):
    """``bayesurl folder`` on 28 x 28 FashionMNIST PNGs, three classes."""
    images = idx_images(FASHION_MNIST / "t10k-images-idx3-ubyte.gz")[:24]
    root = tmp_path / "imgs"
    for i, img in enumerate(images):
        p = root / f"c{i % 3}" / f"{i}.png"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(p)
    out = tmp_path / "out"
    code = main(["folder", str(root), "--out", str(out), "--backbone", "small_convnet",
                 "--random-weights", "--epochs", "1", "--batch-size", "8",
                 "--no-progress"])  # fmt: skip
    assert code == 0
    m = assert_pictures((out / "report.html").read_text(), folder=root)
    assert {Path(n).parent.name for n in m["sources"].values()} <= {"c0", "c1", "c2"}


def test_changed_data_are_said_not_drawn(bench_dir, tmp_path):
    """A record whose images cannot be had back (ids of other images): words, no picture."""
    copy = tmp_path / "changed"
    shutil.copytree(bench_dir, copy, ignore=shutil.ignore_patterns("*.html"))
    for p in (copy / "queries").glob("*.npz"):
        rec = read_queries(p)
        rec.source = rec.source[::-1].copy()
        rec.save(p)
    html = write_report(copy)["path"].read_text()
    m = model(html)
    assert m["thumbs"] == {}
    for e in m["estimators"]:
        assert "not the images the run scored" in e["images"]
    assert html.count("data:image/png") == len(m["plots"])


def test_old_record_without_ids_still_shows_images(bench_dir, tmp_path):
    """Records written before the ids were kept: images by position, classes checked."""
    copy = tmp_path / "old"
    shutil.copytree(bench_dir, copy, ignore=shutil.ignore_patterns("*.html"))
    for p in (copy / "queries").glob("*.npz"):
        with np.load(p) as z:
            kept = {k: z[k] for k in z.files if k not in ("source", "ood_source")}
        np.savez_compressed(p, **kept)
        assert read_queries(p).source.size == 0
    m = model(write_report(copy)["path"].read_text())
    assert m["thumbs"] and all(e["images"] is None for e in m["estimators"])
    # such a record whose classes no longer match the rebuilt data: words, no picture
    for p in (copy / "queries").glob("*.npz"):
        rec = read_queries(p)
        rec.label = np.roll(rec.label, 1)
        rec.save(p)
        assert read_queries(p).source.size == 0
    m = model(write_report(copy)["path"].read_text())
    assert m["thumbs"] == {}
    assert all("the data changed since the run" in e["images"] for e in m["estimators"])
