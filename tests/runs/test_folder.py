"""The folder road (bayesurl.folder, ``bayesurl folder``) on tiny synthetic folders."""

import csv
import json
import warnings
from dataclasses import replace

import pytest
import torch
from _image_folders import noisy_squares
from PIL import Image

import bayesurl.folder.encode as encoding
import bayesurl.folder.road as road
from bayesurl.backbones import build_backbone, data_config
from bayesurl.cli import main
from bayesurl.data import default_augmentation, default_transform
from bayesurl.data.folder import ReadableImages, scan_image_folder
from bayesurl.data.transforms import PilToUint8
from bayesurl.folder import FolderMethod, FolderOptions, score_folder
from bayesurl.folder.methods import FIT_PLANS
from bayesurl.runs.queries import read_queries

FAST = {"backbone": "small_convnet", "epochs": 1, "batch_size": 8, "progress": False}


def _folder(root, labelled=True, n=6, corrupt=True):
    """Three colours of noisy squares; one broken PNG."""
    noisy_squares(root, n, labelled)
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
    assert len(broken) == 1 and broken[0]["u"] == "" and "not an image" in broken[0]["error"]
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


@pytest.mark.parametrize(
    ("name", "value"),
    [("views", 1), ("fit_max", 1), ("epochs", 0), ("batch_size", 1), ("workers", -1),
     ("epochs", 1.5)],
)  # fmt: skip
def test_options_name_the_bad_argument(name, value):
    with pytest.raises(ValueError, match=f"`{name}` must be an integer >= "):
        FolderOptions(**{name: value})
    with pytest.raises(ValueError, match="unknown `method` 'bogus'; valid: tau, pvu, laplace"):
        FolderOptions(method="bogus")
    assert FolderOptions(method="LaPlace").method is FolderMethod.LAPLACE


def test_options_and_settings_give_the_same_table(tmp_path):
    images = _folder(tmp_path / "imgs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        score_folder(images, out=tmp_path / "kw", method="pvu", seed=2, **FAST)
        score_folder(images, out=tmp_path / "opt", options=FolderOptions("pvu", seed=2, **FAST))
    csvs = [(tmp_path / d / "uncertainty.csv").read_bytes() for d in ("kw", "opt")]
    assert csvs[0] == csvs[1]
    with pytest.raises(TypeError, match="not both"):
        score_folder(images, out=tmp_path / "x", options=FolderOptions(), seed=1)
    with pytest.raises(TypeError, match="bogus"):
        score_folder(images, out=tmp_path / "x", bogus=1)


def test_command_writes_csv_and_report(tmp_path, capsys):
    images = _folder(tmp_path / "imgs", corrupt=False)
    out = tmp_path / "out"
    code = main(["folder", str(images), "--out", str(out), "--backbone", "small_convnet",
                 "--random-weights", "--epochs", "1", "--batch-size", "8",
                 "--no-progress"])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    # each metric with its 95 % interval over the images
    r1 = next(line for line in printed.splitlines() if line.startswith("R@1 "))
    assert "95 % Wilson interval over" in r1 and "report" in printed
    assert (out / "uncertainty.csv").is_file() and (out / "report.html").is_file()
    assert main(["folder", str(tmp_path / "absent"), "--out", str(out)]) == 2


def test_wrapper_options_reach_the_wrapper_and_the_command(tmp_path, capsys):
    """``wrapper_options`` / ``--option``: the Laplace pair set of the folder's fit; the
    Laplace u's measured inversion is on its page and printed, with labels or without."""
    images = _folder(tmp_path / "imgs", corrupt=False)
    opts = {"approximation": "fixed", "geometry": "arccos", "hessian_miner": "triplets",
            "hessian_pairs": "all_mined"}  # fmt: skip
    res = score_folder(images, out=tmp_path / "api", method="laplace", wrapper_options=opts,
                       **FAST)  # fmt: skip
    info = json.loads((tmp_path / "api" / "folder.json").read_text())
    assert info["settings"]["wrapper_options"] == opts
    plain = score_folder(images, out=tmp_path / "plain", method="laplace", **FAST)
    assert not torch.equal(torch.as_tensor(res.record.u), torch.as_tensor(plain.record.u))
    code = main(["folder", str(images), "--out", str(tmp_path / "cli"), "--method", "laplace",
                 "--backbone", "small_convnet", "--random-weights", "--batch-size", "8",
                 "--no-progress", *(f"--option={k}={v}" for k, v in opts.items())])  # fmt: skip
    assert code == 0
    assert "caution: Measured on two labelled folders" in capsys.readouterr().out
    csvs = [(tmp_path / d / "uncertainty.csv").read_bytes() for d in ("api", "cli")]
    assert csvs[0] == csvs[1]
    page = (tmp_path / "cli" / "README.md").read_text()
    assert "**Caution.** Measured on two labelled folders" in page and "R-AUROC 0.32" in page
    with pytest.raises(ValueError, match="`wrapper_options`: method 'laplace' has no option 'x'"):
        FolderOptions(method="laplace", wrapper_options={"x": 1})
    with pytest.raises(ValueError, match="'last_layer'"):  # set by the folder itself
        FolderOptions(method="laplace", wrapper_options={"last_layer": "0"})
    assert main(["folder", str(images), "--out", str(tmp_path / "bad"), "--option", "x"]) == 2


def _spy_backbone(monkeypatch):
    """Record the distinct rows every backbone built by the folder road encodes (the feature
    store pads a short batch with repeats of its last row)."""

    rows = []
    build = encoding.build_backbone

    def distinct(x):
        return len(torch.unique(x.reshape(len(x), -1), dim=0))

    def spied(*args, **kwargs):
        model, info = build(*args, **kwargs)
        model.register_forward_hook(lambda m, inp, out: rows.append(distinct(inp[0])))
        return model, info

    monkeypatch.setattr(encoding, "build_backbone", spied)
    return rows


def _capture_features(monkeypatch):
    """Record what the road hands on: the views the u is fitted on, the features it scores."""
    seen = {}
    fit, predict = road.fit_wrapper, road.predict

    def spied_fit(method, views, **kwargs):
        seen["views"] = views
        return fit(method, views, **kwargs)

    def spied_predict(fn, feats, transform, **kwargs):
        seen["feats"] = feats
        return predict(fn, feats, transform, **kwargs)

    monkeypatch.setattr(road, "fit_wrapper", spied_fit)
    monkeypatch.setattr(road, "predict", spied_predict)
    return seen


def test_each_image_decoded_once_and_encoded_once_per_view(tmp_path, monkeypatch):
    images = _folder(tmp_path / "imgs")  # 18 readable images and one broken file
    decoded = []
    getitem = ReadableImages.__getitem__

    def spied_getitem(self, index):
        decoded.append(index)
        return getitem(self, index)

    monkeypatch.setattr(ReadableImages, "__getitem__", spied_getitem)
    rows = _spy_backbone(monkeypatch)
    seen = _capture_features(monkeypatch)
    with pytest.warns(UserWarning, match="broken.png"):
        score_folder(images, out=tmp_path / "out", fit_max=10, **FAST)
    assert sorted(decoded) == list(range(19))  # every file once, the broken one included
    fit_rows = seen["views"].shape[0]
    assert fit_rows in (9, 10)  # the seeded sample of 10 files, less the broken one if drawn
    # one plain row per readable image, two augmented views per readable fit image
    assert sum(rows) == 18 + 2 * fit_rows


@pytest.mark.parametrize("method", ["pvu", "laplace"])
def test_plain_view_methods_encode_each_image_once(tmp_path, monkeypatch, method):
    """pvu and laplace pair each fit image with its nearest neighbour: no augmented view is
    encoded, and the pairs equal a brute-force cosine argmax over the fit sample."""
    images = _folder(tmp_path / "imgs")
    rows = _spy_backbone(monkeypatch)
    seen = _capture_features(monkeypatch)
    with pytest.warns(UserWarning, match="broken.png"):
        res = score_folder(images, out=tmp_path / "out", method=method, fit_max=10, **FAST)
    assert sum(rows) == 18  # one plain row per readable image, nothing else
    scan = scan_image_folder(images)
    gen = torch.Generator().manual_seed(FAST.get("seed", 0))
    fit_ids = set(torch.randperm(len(scan.paths), generator=gen)[:10].tolist())
    readable = [i for i in range(len(scan.paths)) if scan.paths[i] != "c1/broken.png"]
    keep = [k for k, i in enumerate(readable) if i in fit_ids]
    sample = seen["feats"].double()[keep]
    unit = sample / sample.norm(dim=1, keepdim=True)
    sim = unit @ unit.T
    sim.fill_diagonal_(-float("inf"))
    partner = sim.argmax(dim=1)
    pairs = seen["views"].double()
    assert pairs.shape[:2] == (len(keep), 2)
    torch.testing.assert_close(pairs[:, 0], sample)
    torch.testing.assert_close(pairs[:, 1], sample[partner])
    assert res.info["sizes"]["fit_images"] == len(keep)
    assert "nearest neighbour" in " ".join(res.info["describe"])


def test_the_default_fit_sample_is_sized_by_what_a_fit_image_costs():
    """tau encodes two views per fit image: 500 by default; pvu and laplace none: 5000; an
    explicit value is kept, and a bad one named."""
    assert FolderOptions(method="tau").fit_max == 500
    assert FolderOptions().fit_max == 500  # tau is the default method
    assert FolderOptions(method="pvu").fit_max == 5000
    assert FolderOptions(method="LAPLACE").fit_max == 5000
    assert FolderOptions(method="tau", fit_max=40).fit_max == 40
    with pytest.raises(ValueError, match="`fit_max`"):
        FolderOptions(method="pvu", fit_max=1)


def test_the_default_fit_sample_bounds_the_encoded_views(tmp_path, monkeypatch):
    """With more readable images than the default sample (set to 7 here), tau encodes the
    views of that many."""
    monkeypatch.setitem(
        FIT_PLANS, FolderMethod.TAU, replace(FIT_PLANS[FolderMethod.TAU], fit_max=7)
    )
    images = _folder(tmp_path / "imgs", corrupt=False)
    rows = _spy_backbone(monkeypatch)
    seen = _capture_features(monkeypatch)
    res = score_folder(images, out=tmp_path / "out", **FAST)
    assert seen["views"].shape[0] == 7 and sum(rows) == 18 + 2 * 7
    assert res.info["settings"]["fit_max"] == 7


def test_outputs_equal_a_per_image_reference(tmp_path, monkeypatch):
    """Brute force: each image decoded and encoded alone, the views' draws replayed."""
    images = _folder(tmp_path / "imgs")
    seen = _capture_features(monkeypatch)
    with pytest.warns(UserWarning, match="broken.png"):
        res = score_folder(images, out=tmp_path / "out", fit_max=10, seed=3, **FAST)

    scan = scan_image_folder(images)
    torch.manual_seed(3)
    backbone, _ = build_backbone("small_convnet", in_chans=3)
    backbone.eval()
    cfg = data_config(backbone)
    size = cfg.input_size[1]
    transform = default_transform(3, mean=cfg.mean, std=cfg.std)
    augment = default_augmentation(3, mean=cfg.mean, std=cfg.std)
    pixels = {}
    for i, rel in enumerate(scan.paths):
        try:
            with Image.open(scan.root / rel) as im:
                im.load()
                pixels[i] = PilToUint8(size)(im)
        except OSError:
            continue
    gen = torch.Generator().manual_seed(3)
    fit_ids = set(torch.randperm(len(scan.paths), generator=gen)[:10].tolist())
    aug_gen = torch.Generator().manual_seed(3)
    plain, views = [], []
    with torch.no_grad():
        for i in sorted(pixels):
            plain.append(backbone(transform(pixels[i][None]))[0])
        batch = FAST["batch_size"]
        for lo in range(0, len(scan.paths), batch):  # the documented stream: batch by batch
            sub = [
                i
                for i in range(lo, min(lo + batch, len(scan.paths)))
                if i in pixels and i in fit_ids
            ]
            if not sub:
                continue
            drawn = [augment(torch.stack([pixels[i] for i in sub]), aug_gen) for _ in range(2)]
            for k in range(len(sub)):
                views.append(torch.stack([backbone(d[k : k + 1])[0] for d in drawn]))
    ref_plain, ref_views = torch.stack(plain).double(), torch.stack(views).double()
    torch.testing.assert_close(seen["feats"].double(), ref_plain, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(seen["views"].double(), ref_views, rtol=1e-5, atol=1e-6)
    # the nearest neighbours (cosine, self excluded) of the reference features
    unit = ref_plain / ref_plain.norm(dim=1, keepdim=True)
    sim = unit @ unit.T
    sim.fill_diagonal_(-float("inf"))
    assert res.record.neighbour.tolist() == sim.argmax(dim=1).tolist()


def test_cache_reuses_the_plain_features_and_changes_nothing(tmp_path, monkeypatch):
    images = _folder(tmp_path / "imgs", corrupt=False)
    rows = _spy_backbone(monkeypatch)
    cache = tmp_path / "cache"
    score_folder(images, out=tmp_path / "a", cache=cache, **FAST)
    first = sum(rows)
    rows.clear()
    score_folder(images, out=tmp_path / "b", cache=cache, **FAST)
    assert first == 3 * 18 and sum(rows) == 2 * 18  # the second run encodes the views only
    assert (tmp_path / "a" / "uncertainty.csv").read_bytes() == (
        tmp_path / "b" / "uncertainty.csv"
    ).read_bytes()
