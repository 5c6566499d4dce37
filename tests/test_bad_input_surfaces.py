"""Bad input on the newer surfaces: folder options and images, ``bayesurl report`` on result
folders, storage URLs, fit options, evaluator options, class splits, ``--set`` overrides.

Each case is a mistake a user could plausibly make; each must give a clear one-line error
naming the argument as typed (the keyword in Python, the flag on the command line) where the
input enters, or be handled correctly with the file listed -- never a silent wrong result,
never a library's traceback.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from _image_folders import noisy_squares
from PIL import Image

from bayesurl.cli import main
from bayesurl.data.class_splits import class_splits, crossfit_splits
from bayesurl.evaluation import Evaluator
from bayesurl.folder import FolderOptions, score_folder
from bayesurl.training import FitOptions, fit

FAST = {"backbone": "small_convnet", "epochs": 1, "batch_size": 8, "progress": False}
HERE = Path(__file__).parent


def _helper(rel: str):
    """A helper module of another test folder (tests/ is no package)."""
    spec = importlib.util.spec_from_file_location(Path(rel).stem, HERE / rel)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _png_claiming(path: Path, width: int, height: int) -> None:
    """A small valid PNG whose header claims ``width`` x ``height`` pixels."""
    Image.new("L", (4, 4), 128).save(path)
    raw = bytearray(path.read_bytes())
    ihdr = raw[12:29]  # b"IHDR" + 13 bytes of data
    ihdr[4:12] = struct.pack(">II", width, height)
    raw[12:29] = ihdr
    raw[29:33] = struct.pack(">I", zlib.crc32(bytes(ihdr)) & 0xFFFFFFFF)
    path.write_bytes(bytes(raw))


def _score(images: Path, out: Path, **kw) -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return score_folder(images, out=out, **{**FAST, **kw})


def _err(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    return err


# ------------------------------------------------------------------------------ fit options
def test_fit_refuses_an_optimiser_over_another_models_parameters():
    toys = _helper("training/_training_toys.py")
    method, other, loader = toys.LinearCE(), toys.LinearCE(), toys.loader
    before = [p.detach().clone() for p in method.parameters()]
    opt = torch.optim.SGD(other.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="`optimizer` \\(SGD\\) holds none of the method's"):
        fit(method, loader(), FitOptions(optimizer=opt, progress=False))
    assert all(torch.equal(a, b) for a, b in zip(before, method.parameters()))


def test_fit_warns_when_the_optimiser_holds_only_some_parameters():
    toys = _helper("training/_training_toys.py")
    method, loader = toys.LinearCE(), toys.loader
    first = next(p for p in method.parameters() if p.requires_grad)
    opt = torch.optim.SGD([first], lr=0.1)
    with pytest.warns(UserWarning, match="holds 1 of the method's .* stay as they are"):
        fit(method, loader(), FitOptions(optimizer=opt, progress=False))


@pytest.mark.parametrize(
    ("bad", "error", "needle"),
    [
        ({"seed": 1.5}, ValueError, "`seed` must be an integer"),
        ({"seed": -1}, ValueError, "`seed`"),
        ({"resume": "no/such/ckpt.pt"}, FileNotFoundError, "`resume`"),
        ({"optimizer": "sgd", "optimizer_kwargs": {"momentm": 0.9}}, ValueError, "momentm"),
        ({"optimizer_kwargs": [("betas", (0.9, 0.99))]}, TypeError, "`optimizer_kwargs`"),
        ({"warmup_epochs": "1"}, TypeError, "`warmup_epochs`"),
        ({"clip_grad": "1"}, TypeError, "`clip_grad`"),
        ({"augment": "flip"}, TypeError, "`augment`"),
        ({"progress": "no"}, TypeError, "`progress`"),
    ],
)
def test_fit_options_check_every_field_when_built(bad, error, needle):
    with pytest.raises(error, match=needle):
        FitOptions(**bad)


def test_optimizer_kwargs_beside_an_optimiser_instance_are_refused():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="`optimizer_kwargs` are not applied"):
        FitOptions(optimizer=opt, optimizer_kwargs={"momentum": 0.9})


# --------------------------------------------------------------------- evaluator and splits
def test_evaluator_refuses_a_metric_both_included_and_excluded():
    with pytest.raises(ValueError, match="`include` and `exclude` both name r@1"):
        Evaluator(include=["r@1", "r_auroc"], exclude=["r@1"])
    with pytest.raises(ValueError, match="`exclude` drops lam_ausc"):
        Evaluator(reference="lam", exclude=["lam_ausc"])
    with pytest.raises(ValueError, match="select no metric"):
        Evaluator(include=[])
    with pytest.raises(ValueError, match="`tolerance` must be <= 1"):
        Evaluator(tolerance=5.0)


@pytest.mark.parametrize("n", [2.5, 0, -1])
def test_class_splits_refuse_a_count_that_is_not_a_positive_whole_number(n):
    with pytest.raises(ValueError, match="`n_splits` must be an integer >= 1"):
        class_splits(n)
    assert len(class_splits(2.0)) == 2  # a whole float is that number


def test_class_split_arguments_are_whole_numbers_everywhere():
    with pytest.raises(ValueError, match="`num_classes`"):
        class_splits(2, num_classes=10.5)
    with pytest.raises(ValueError, match=r"`val_classes\[0\]`"):
        class_splits(2, val_classes=[2.5])
    with pytest.raises(ValueError, match=r"`val_sets\[0\]\[1\]`"):
        crossfit_splits([[3, 4.5], [6, 8]])


# ------------------------------------------------------------------------- folder options
@pytest.mark.parametrize(
    ("bad", "error", "needle"),
    [
        ({"lr": -1e-3}, ValueError, "`lr` must be > 0"),
        ({"lr": float("nan")}, ValueError, "`lr`"),
        ({"device": "gpu"}, ValueError, "`device` 'gpu' is not a device"),
        ({"image_size": 0}, ValueError, "`image_size` must be an integer >= 8, got 0"),
        ({"image_size": -4}, ValueError, "`image_size` must be an integer >= 8, got -4"),
        ({"image_size": 32.5}, ValueError, "`image_size`"),
        ({"seed": -1}, ValueError, "`seed`"),
        ({"backbone": "resnet_typo"}, ValueError, "unknown `backbone` 'resnet_typo'"),
        ({"backbone": "small_convnet", "pretrained": True}, ValueError, "no packaged"),
        ({"strict": "yes"}, TypeError, "`strict`"),
        ({"max_pixels": 0}, ValueError, "`max_pixels`"),
    ],
)
def test_folder_options_check_every_field_when_built(bad, error, needle):
    with pytest.raises(error, match=needle):
        FolderOptions(**{**FAST, **bad})


def test_score_folder_refuses_bad_settings_before_encoding(tmp_path, monkeypatch):
    import bayesurl.folder.road as road

    encoded = []
    monkeypatch.setattr(road, "encode_folder", lambda *a, **k: encoded.append(1))
    images = noisy_squares(tmp_path / "imgs")
    for bad in ({"lr": -1e-3}, {"device": "gpu"}):
        with pytest.raises(ValueError, match=f"`{next(iter(bad))}`"):
            score_folder(images, out=tmp_path / "out", **{**FAST, **bad})
    assert encoded == []


def test_folder_cache_that_is_a_file_is_named(tmp_path):
    (tmp_path / "cache").write_text("x")
    with pytest.raises(ValueError, match="`cache` .* is a file"):
        FolderOptions(**FAST, cache=tmp_path / "cache")


@pytest.mark.parametrize("size", ["0", "-4", "7", "2.5"])
def test_folder_command_names_the_image_size_flag(size, tmp_path, capsys):
    images = noisy_squares(tmp_path / "imgs")
    argv = ["folder", str(images), "--out", str(tmp_path / "out"), "--random-weights",
            "--backbone", "small_convnet", f"--image-size={size}", "--no-progress"]  # fmt: skip
    code = None
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refuses "2.5" for an int flag, naming the flag
        code = exc.code
    assert code == 2
    err = _err(capsys)
    assert "--image-size" in err and "`size`" not in err and "`image_size`" not in err


# ------------------------------------------------------------------------ images on disk
def test_a_decompression_bomb_is_skipped_and_listed_not_decoded(tmp_path):
    images = noisy_squares(tmp_path / "imgs")
    _png_claiming(images / "c0" / "bomb.png", 30_000, 30_000)
    res = _score(images, tmp_path / "out")
    reasons = dict(res.skipped)
    assert list(reasons) == ["c0/bomb.png"]
    assert "30000 x 30000 px" in reasons["c0/bomb.png"] and "max_pixels" in reasons["c0/bomb.png"]
    rows = (tmp_path / "out" / "uncertainty.csv").read_text()
    assert "c0/bomb.png" in rows and "over the limit" in rows


def test_the_pixel_limit_is_settable(tmp_path):
    images = noisy_squares(tmp_path / "imgs", n=4)  # 16 x 16 px each
    Image.new("RGB", (40, 40), (90, 90, 90)).save(images / "c1" / "large.png")
    res = _score(images, tmp_path / "small", max_pixels=1599)
    assert [p for p, _ in res.skipped] == ["c1/large.png"]
    assert "40 x 40 px = 1,600 pixels, over the limit of 1,599" in res.skipped[0][1]
    assert _score(images, tmp_path / "ok", max_pixels=1600).skipped == []
    assert _score(images, tmp_path / "none", max_pixels=None).skipped == []


def test_truncated_unreadable_and_odd_images_are_listed_with_the_reason(tmp_path):
    images = noisy_squares(tmp_path / "imgs")
    good = (images / "c0" / "0.png").read_bytes()
    Image.new("RGB", (64, 64), (10, 200, 30)).save(images / "c0" / "cut.png")
    cut = (images / "c0" / "cut.png").read_bytes()
    (images / "c0" / "cut.png").write_bytes(cut[: len(cut) // 2])
    (images / "c1" / "header.png").write_bytes(good[:20])
    (images / "c1" / "text.jpg").write_text("not an image")
    Image.fromarray(np.random.default_rng(0).random((16, 16), dtype=np.float32)).save(
        images / "c2" / "float.tif"
    )
    res = _score(images, tmp_path / "out")
    reasons = dict(res.skipped)
    assert set(reasons) == {"c0/cut.png", "c1/header.png", "c1/text.jpg", "c2/float.tif"}
    assert "truncated" in reasons["c0/cut.png"].lower()
    assert "not an image" in reasons["c1/text.jpg"]
    assert "floating-point pixels (mode F)" in reasons["c2/float.tif"]
    assert all("BytesIO" not in r for r in reasons.values())


def test_sixteen_bit_and_transparent_images_keep_their_meaning(tmp_path):
    from bayesurl.data.folder import read_image

    a = (np.arange(16 * 16, dtype=np.uint16).reshape(16, 16) * 250).astype(np.uint16)
    Image.fromarray(a).save(tmp_path / "deep.png")
    rgb = np.asarray(read_image((tmp_path / "deep.png").read_bytes(), None))
    np.testing.assert_array_equal(rgb[..., 0], (a >> 8).astype(np.uint8))  # not clipped white
    clear = Image.new("RGBA", (8, 8), (0, 0, 0, 0))  # transparent black: shown as white
    clear.save(tmp_path / "clear.png")
    assert np.asarray(read_image((tmp_path / "clear.png").read_bytes(), None)).min() == 255


# -------------------------------------------------------------------- bayesurl report
def _folder_result(tmp_path: Path) -> tuple[Path, Path]:
    images = noisy_squares(tmp_path / "imgs", n=8)
    out = tmp_path / "out"
    assert main(["folder", str(images), "--out", str(out), "--backbone", "small_convnet",
                 "--random-weights", "--epochs", "1", "--batch-size", "8",
                 "--no-progress"]) == 0  # fmt: skip
    return images, out


def test_report_draws_a_changed_or_missing_image_as_such(tmp_path, capsys):
    from bayesurl.report import write_report

    model = _helper("report/_pictures.py").model

    images, out = _folder_result(tmp_path)
    capsys.readouterr()
    m = model((out / "report.html").read_text())
    shown = sorted(m["sources"].items())
    changed_key, changed = shown[0]
    missing_key, missing = shown[1]
    Image.new("RGB", (16, 16), (0, 0, 0)).save(images / changed)  # another picture, same name
    (images / missing).unlink()
    m = model(write_report(out)["path"].read_text())
    assert changed_key not in m["thumbs"] and missing_key not in m["thumbs"]
    assert "changed since the run" in m["why"][changed_key]
    assert "missing since the run" in m["why"][missing_key]
    assert len(m["thumbs"]) >= len(shown) - 2  # the others are still drawn


def test_folder_record_keeps_each_files_digest(tmp_path):
    import hashlib

    from bayesurl.runs.queries import read_queries, source_ids

    images, out = _folder_result(tmp_path)
    rec = read_queries(out / "queries.npz")
    want = [hashlib.sha1((images / p).read_bytes()).hexdigest() for p in rec.meta["paths"]]
    np.testing.assert_array_equal(rec.source, source_ids(want))


def test_report_refuses_a_results_file_of_another_layout(tmp_path, capsys):
    out = tmp_path / "other"
    out.mkdir()
    (out / "results.json").write_text(
        json.dumps({"summary": {"ce": {"acc": 0.9}}, "runs": [{"estimator": "ce", "acc": 0.9}]})
    )
    assert main(["report", str(out)]) == 2
    err = _err(capsys)
    assert "results.json" in err and "another layout" in err and "bayesurl.results/3" in err
    # runs that name no estimator: refused, naming the first such run
    (out / "results.json").write_text(
        json.dumps({"summary": {"ce": {"r@1": 0.9}}, "runs": [{"name": "ce", "r@1": 0.9}]})
    )
    assert main(["report", str(out)]) == 2
    err = _err(capsys)
    assert "results.json" in err and "runs[0] has no 'estimator'" in err


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("results.json", "bayesurl.results/7"), ("folder.json", "bayesurl.folder/2"),
     ("result.json", "bayesurl.result/3"), ("results.json", "lightning.metrics/1")],
)  # fmt: skip
def test_report_refuses_a_newer_or_foreign_format_naming_file_and_version(
    name, fmt, tmp_path, capsys
):
    out = tmp_path / "r"
    out.mkdir()
    (out / name).write_text(json.dumps({"format": fmt, "summary": {}, "runs": []}))
    assert main(["report", str(out)]) == 2
    err = _err(capsys)
    assert name in err and fmt in err
    assert ("newer bayesurl" in err) is fmt.startswith("bayesurl")


def test_every_result_file_carries_its_format(tmp_path):
    from bayesurl.files import check_format

    _, out = _folder_result(tmp_path)
    doc = json.loads((out / "folder.json").read_text())
    assert doc["format"] == "bayesurl.folder/1"
    assert check_format(doc, out / "folder.json", "bayesurl.folder/1") == 1


def test_report_names_a_truncated_query_record(tmp_path, capsys):
    _, out = _folder_result(tmp_path)
    capsys.readouterr()
    q = out / "queries.npz"
    q.write_bytes(q.read_bytes()[: q.stat().st_size // 2])
    assert main(["report", str(out)]) == 2
    err = _err(capsys)
    assert "queries.npz" in err and "truncated" in err and "BadZipFile" in err


def test_report_names_a_truncated_results_file(tmp_path, capsys):
    _, out = _folder_result(tmp_path)
    capsys.readouterr()
    f = out / "folder.json"
    f.write_bytes(f.read_bytes()[:40])
    assert main(["report", str(out)]) == 2
    err = _err(capsys)
    assert "folder.json" in err and "not a readable JSON file" in err


# ------------------------------------------------------------------------ storage URLs
def test_a_dialect_typo_with_a_stock_password_shows_the_typo():
    pytest.importorskip("optuna")
    from bayesurl.sweeps.storage import StorageError, SweepStorage

    with pytest.raises(StorageError) as info:
        SweepStorage("postgress://postgres:postgres@localhost:5432/bayesurl")
    text = str(info.value)
    assert "postgress" in text and "did you mean postgresql" in text
    assert "postgres:***@" in text and ":postgres@" not in text


def test_the_password_field_is_hidden_wherever_a_url_appears():
    from bayesurl.database import scrub

    url = "postgresql://ann:hunter2@db/x"
    msg = "could not connect to postgresql://ann:hunter2@db/x; dsn password=hunter2 host=db"
    shown = scrub(msg, url)
    assert "hunter2" not in shown and shown.count("***") == 2


def test_a_storage_of_a_newer_bayesurl_is_refused(tmp_path):
    pytest.importorskip("optuna")
    from bayesurl.sweeps.storage import StorageError, SweepStorage

    store = SweepStorage(out=tmp_path, sweep="s")
    assert store.storage.get_study_user_attrs(store._study_id)["format"] == "bayesurl.sweep/1"
    store.storage.set_study_user_attr(store._study_id, "format", "bayesurl.sweep/9")
    with pytest.raises(StorageError, match="newer bayesurl \\(format bayesurl.sweep/9\\)"):
        SweepStorage(out=tmp_path, sweep="s")


# ------------------------------------------------------------------------ --set overrides
@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("{width=0}", "`backbone.kwargs.width` must be an integer >= 1, got 0"),
        ("{width=2.5}", "`backbone.kwargs.width` must be an integer >= 1, got 2.5"),
        ("{widht=8}", "unknown `backbone.kwargs.widht`"),
        ("{dropout=1.5}", "`backbone.kwargs.dropout` must be < 1"),
    ],
)
def test_backbone_kwargs_are_checked_naming_the_key(value, needle):
    from bayesurl.runs.config import load_recipe

    with pytest.raises(ValueError, match=needle.replace("(", "\\(").replace(".", "\\.")):
        load_recipe("fashion_mnist/ce", [f"backbone.kwargs={value}"], preset="smoke")


def test_a_whole_float_in_a_recipe_is_that_number_and_a_fraction_is_refused():
    from bayesurl.runs.config import load_recipe

    assert load_recipe("fashion_mnist/ce", ["train.epochs=2.0"], preset="smoke").train.epochs == 2
    with pytest.raises(ValueError, match="`train.epochs` must be an integer, got 2.5"):
        load_recipe("fashion_mnist/ce", ["train.epochs=2.5"], preset="smoke")


def test_sweep_options_check_every_field_when_built(tmp_path):
    from bayesurl.sweeps.sweep import SweepOptions, run_sweep

    for bad, error, needle in (
        ({"seeds": [0, 1.5]}, ValueError, r"`seeds\[1\]`"),
        ({"splits": 2.5}, ValueError, "`splits`"),
        ({"overrides": "train.epochs=2"}, TypeError, "`overrides`"),
        ({"overrides": ["train.epochs"]}, ValueError, "section.key=value"),
        ({"tune": 2.5}, ValueError, "`tune`"),
        ({"poll": 0}, ValueError, "`poll`"),
        ({"device": "gpu"}, ValueError, "`device`"),
        ({"worker": "yes"}, TypeError, "`worker`"),
    ):
        with pytest.raises(error, match=needle):
            SweepOptions(**bad)
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="`out`"):
        SweepOptions(out=tmp_path / "f")
    # the recipe file and its preset: where the sweep reads the file, before anything runs
    for bad, needle in (({"preset": "quik"}, "unknown `preset` 'quik'"),
                        ({"dataset": "fashon_mnist"}, "fashon_mnist")):  # fmt: skip
        with pytest.raises(ValueError, match=needle):
            run_sweep("ce", SweepOptions(**bad), run_fn=lambda p: pytest.fail("ran"))


def test_benchmark_names_the_flag_of_a_bad_sweep_option(tmp_path, capsys):
    assert main(["benchmark", "--preset", "quik", "--out", str(tmp_path)]) == 2
    assert "`--preset` 'quik'" in _err(capsys)


# ------------------------------------------------------------- fresh cases, tried as a user
def test_seeds_with_an_empty_entry_or_a_repeat_are_refused(tmp_path, capsys):
    from bayesurl.commands.benchmark import parse_seeds

    assert parse_seeds("7,") == [7] and parse_seeds("0,2") == [0, 2]
    for bad, needle in (("0,,1", "empty entry"), ("0,0,1", "names a seed twice")):
        with pytest.raises(ValueError, match=needle):
            parse_seeds(bad)


def test_an_optimiser_class_instead_of_an_instance_is_named():
    with pytest.raises(ValueError, match="`optimizer` is the class Adam, not an optimiser"):
        FitOptions(optimizer=torch.optim.Adam)


def test_excluding_one_key_of_a_metric_is_refused_not_widened():
    Evaluator(exclude=["recall@k"])  # the whole metric: fine
    with pytest.raises(ValueError, match="'recall@1' is one key of the metric 'recall@k'"):
        Evaluator(exclude=["recall@1"])


def test_a_password_with_an_unencoded_at_is_refused_and_hidden_whole():
    pytest.importorskip("optuna")
    from bayesurl.sweeps.storage import StorageError, SweepStorage, redact_url

    url = "postgresql://ann:p@ss@127.0.0.1:1/db"
    assert redact_url(url) == "postgresql://ann:***@127.0.0.1:1/db"
    with pytest.raises(StorageError, match="more than one '@'.*%40") as info:
        SweepStorage(url)
    assert "ss@" not in str(info.value)


def test_report_given_the_results_file_points_at_its_folder(tmp_path, capsys):
    _, out = _folder_result(tmp_path)
    capsys.readouterr()
    assert main(["report", str(out / "folder.json")]) == 2
    assert "give the folder holding it" in _err(capsys)


def test_folder_command_names_dir_and_says_why_one_class_has_no_metrics(tmp_path, capsys):
    assert main(["folder", str(tmp_path / "none"), "--out", str(tmp_path / "o"),
                 "--random-weights", "--backbone", "small_convnet"]) == 2  # fmt: skip
    assert "`DIR`" in _err(capsys)
    one = tmp_path / "one"
    for i in range(4):
        (one / "a").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (16, 16), (40 * i, 90, 90)).save(one / "a" / f"{i}.png")
    res = _score(one, tmp_path / "out")
    assert res.metrics is None and "one class only" in res.info["describe"][0]


def test_an_unparsable_device_in_a_recipe_names_the_usual_devices():
    from bayesurl._checks import resolve_device

    with pytest.raises(ValueError, match="`device` 'gpu' is not a device; use cpu, cuda"):
        resolve_device("gpu")


def test_checking_a_recipes_backbone_draws_no_random_number():
    from bayesurl.runs.config import load_recipe

    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    load_recipe("fashion_mnist/ce", ["backbone.kwargs={width=64, num_features=256}"])
    torch.testing.assert_close(torch.rand(3), want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("estimator.fit.lr=-1", "`estimators.pvu.fit.lr` must be > 0"),
        ("estimator.fit.epochs=2.5", "`estimators.pvu.fit.epochs` must be an integer >= 1"),
        ("estimator.fit.batch_size=0", "`estimators.pvu.fit.batch_size`"),
    ],
)
def test_a_posthoc_fit_table_is_checked_with_the_recipe(override, needle):
    from bayesurl.runs.config import load_recipe
    from bayesurl.runs.estimators import build_estimator

    cfg = load_recipe("fashion_mnist/pvu", [override], preset="smoke")
    with pytest.raises(ValueError, match=needle.replace(".", "\\.")):
        build_estimator(cfg)  # before any base is trained


def test_a_posthoc_wrappers_bad_kwarg_is_named_by_its_recipe_key(tmp_path, capsys):
    argv = ["run", "fashion_mnist/pvu", "--preset", "smoke", "--no-progress",
            "--out", str(tmp_path), "--set", "estimator.kwargs.temperature=-1"]  # fmt: skip
    assert main(argv) == 2
    assert "`estimators.pvu.kwargs.temperature` must be a positive number" in _err(capsys)


def test_benchmark_names_the_set_override_a_refused_estimator_key_came_from(tmp_path, capsys):
    argv = ["benchmark", "--preset", "smoke", "--methods", "ce", "--no-progress",
            "--out", str(tmp_path), "--set", "estimator.kwargs.nope=1"]  # fmt: skip
    assert main(argv) == 2
    err = _err(capsys)
    assert "`estimators.ce.kwargs.nope`" in err
    assert "from `--set estimator.kwargs.nope=1`" in err


def test_set_override_naming_leaves_other_messages_alone():
    from bayesurl.commands import name_set_overrides

    msg = "unknown key `estimators.ce.kwargs.nope`; CE.__init__ takes no further options"
    assert name_set_overrides(msg, ["train.epochs=1"]) == msg
    assert name_set_overrides(msg, ["estimator.kwargs.other=1"]) == msg
    assert name_set_overrides(msg, None) == msg
    assert name_set_overrides(msg, ["estimator.kwargs.nope=2"]).endswith(
        "(from `--set estimator.kwargs.nope=2`, applied to every estimator)"
    )


def test_benchmark_names_methods_and_a_negative_seed_count_by_the_flags(tmp_path, capsys):
    from bayesurl.commands.benchmark import parse_seeds

    with pytest.raises(ValueError, match="seeds are non-negative integers"):
        parse_seeds("-1")
    argv = ["benchmark", "--preset", "smoke", "--methods", "ce,cee", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = _err(capsys)
    assert "'cee'" in err and "`--methods`" in err and "`estimators`" not in err
