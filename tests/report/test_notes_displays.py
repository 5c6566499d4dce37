"""Every display shows the same notes (bayesurl.evaluation.notes): the ``run``, ``benchmark`` and
``folder`` tables, the HTML report and the README beside ``uncertainty.csv``; a crafted case
triggers each, a run that learned shows none."""

import json
import re

import numpy as np
import pytest
import torch

import bayesurl.folder.road as folder_road
from bayesurl.cli import main
from bayesurl.report import load_source, notes_lines

# a CE run that learns (R@1 about 0.5 over 5 classes, CE loss about 0.4 of ln 5 = 1.61)
LEARNS = ["train.epochs=12", "train.lr=0.01", "data.max_train=600"]
# the same with a learning rate too small to move the weights: an untrained model
UNTRAINED = ["train.lr=1e-9"]


def _sets(overrides):
    return [a for o in overrides for a in ("--set", o)]


def _model(page):
    text = page.read_text()
    m = re.search(r'<script type="application/json" id="model">(.*?)</script>', text, re.S)
    return json.loads(m.group(1))


def _run(tmp_path, capsys, name, overrides):
    out = tmp_path / name
    rc = main(["run", "fashion_mnist/ce", "--preset", "smoke", "--out", str(out),
               "--no-progress", *_sets(overrides)])  # fmt: skip
    assert rc == 0
    return out, capsys.readouterr().out


def test_run_notes_untrained_model_and_none_for_a_model_that_learned(tmp_path, capsys):
    out, printed = _run(tmp_path, capsys, "untrained", UNTRAINED)
    assert "note: model at chance: the last training loss" in printed
    assert "note: u is nearly constant" in printed  # a uniform softmax: entropy ~ ln 5
    est = _model(out / "report.html")["estimators"][0]
    assert any("model at chance" in n for n in est["notes"])
    assert est["notes"] == [line[len("note: ") :] for line in notes_lines(load_source(out))]
    assert 'class: "warn"' in (out / "report.html").read_text()
    # u on the cards: enough digits that two queries 1 % of the u range apart read differently
    u = np.array([v[0] for v in est["q"].values()])
    assert len({f"{x:.{est['u_digits']}g}" for x in u}) == len(set(u.tolist()))

    out, printed = _run(tmp_path, capsys, "learns", LEARNS)
    # a model that learned: no note on the model or on u's spread; its AUROCs get a note exactly
    # where their 95 % interval (result.json) holds 0.5 or lies below it -- on 150 queries an
    # R-AUROC of 0.55 is still within the noise, and the run says so
    m = json.loads((out / "result.json").read_text())["metrics"]
    want = []
    for key, title in (("r_auroc", "R-AUROC"), ("ood_auroc", "OOD AUROC")):
        lo, hi = m[f"{key}_low"], m[f"{key}_high"]
        if hi < 0.5:
            want.append(f"note: u is inverted: {title}")
        elif lo <= 0.5:
            want.append(f"note: u is at chance: {title}")
    got = [line for line in printed.splitlines() if line.startswith("note:")]
    assert len(got) == len(want) and all(g.startswith(w) for g, w in zip(got, want)), got
    assert [n[: len(w) - 6] for n, w in zip(m["caveats"], want)] == [w[6:] for w in want]
    est = _model(out / "report.html")["estimators"][0]
    assert est["notes"] == [line[len("note: ") :] for line in got]


def test_benchmark_table_prints_the_notes(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = main(["benchmark", "--preset", "smoke", "--estimators", "ce,pvu", "--out", str(out),
               "--no-progress", *_sets(UNTRAINED)])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    # the post-hoc row wraps the same untrained CE base: it says so too
    # (several estimators: one line each, the notes in brief, then what the brief words mean)
    lines = printed.splitlines()
    for name in ("ce", "pvu"):
        (line,) = [ln for ln in lines if ln.startswith(f"note: {name} (seed 0): ")]
        assert "model at chance (loss" in line
    model = _model(out / "report.html")
    assert all(any("model at chance" in n for n in e["notes"]) for e in model["estimators"])
    assert all(len(e["briefs"]) == len(e["notes"]) for e in model["estimators"])


def _folder(root, n=8, noise=30, grey=False):
    g = torch.Generator().manual_seed(0)
    from PIL import Image

    colours = [(128, 128, 128)] * 3 if grey else [(220, 30, 30), (30, 200, 30), (30, 30, 220)]
    for c, rgb in enumerate(colours):
        for i in range(n):
            px = torch.tensor(rgb).view(1, 1, 3) + noise * torch.randn(16, 16, 3, generator=g)
            path = root / f"c{c}" / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(px.clamp(0, 255).to(torch.uint8).numpy()).save(path)
    return root


def _folder_cli(images, out):
    return main(["folder", str(images), "--out", str(out), "--backbone", "small_convnet",
                 "--random-weights", "--epochs", "1", "--batch-size", "8",
                 "--no-progress"])  # fmt: skip


def test_folder_readme_and_table_note_a_constant_u(tmp_path, capsys, monkeypatch):
    images = _folder(tmp_path / "imgs")
    predict = folder_road.predict

    def constant(fn, feats, transform, **kw):  # the Laplace road's u: 0.3 % spread
        pred, y = predict(fn, feats, transform, **kw)
        u = pred.uncertainty
        spread = torch.linspace(0.0, 4e-5, u.numel(), dtype=u.dtype)
        pred.uncertainty = 0.013622 + spread[torch.randperm(u.numel())]
        return pred, y

    monkeypatch.setattr(folder_road, "predict", constant)
    out = tmp_path / "out"
    assert _folder_cli(images, out) == 0
    printed = capsys.readouterr().out
    assert "note: u is nearly constant" in printed
    readme = (out / "README.md").read_text()
    assert "u is nearly constant" in readme and "Higher u = less certain" in readme
    rows = (out / "uncertainty.csv").read_text().splitlines()[1:]
    us = [r.split(",")[2] for r in rows]
    assert len(set(us)) == len(us)  # every image's u reads differently in the CSV
    notes = _model(out / "report.html")["estimators"][0]["notes"]
    assert any("nearly constant" in n for n in notes)


def test_folder_readme_notes_an_inverted_u(tmp_path, capsys, monkeypatch):
    """u crafted from the retrievals: every wrong one gets a *lower* u than every right one,
    so R-AUROC is 0 and the note must say u is inverted."""
    images = _folder(tmp_path / "imgs", n=12, noise=60, grey=True)  # classes look alike
    predict = folder_road.predict
    labels = torch.arange(3).repeat_interleave(12)

    def inverted(fn, feats, transform, **kw):
        pred, y = predict(fn, feats, transform, **kw)
        e = torch.nn.functional.normalize(pred.embedding.double(), dim=1)
        sim = e @ e.T
        sim.fill_diagonal_(-2)
        hit = labels[sim.argmax(1)] == labels
        if hit.all() or not hit.any():  # the premise: both right and wrong retrievals
            pytest.skip("the tiny folder gives no wrong (or no right) retrieval")
        pred.uncertainty = torch.where(hit, 2.0, 1.0) + 0.1 * torch.rand(hit.numel())
        return pred, y

    monkeypatch.setattr(folder_road, "predict", inverted)
    out = tmp_path / "out"
    assert _folder_cli(images, out) == 0
    assert "note: u is inverted: R-AUROC" in capsys.readouterr().out
    assert "u is inverted" in (out / "README.md").read_text()
