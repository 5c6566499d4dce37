"""``bayesurl evaluate --checkpoint``: a trained checkpoint evaluated zero-shot.

Reference: the same metrics computed from the in-memory trained method (the checkpoint round
trip must give identical numbers), and R@1 recomputed by a brute-force loop.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bayesurl.cli import main
from bayesurl.data import (
    as_tensors,
    default_transform,
)
from bayesurl.runs.predict import embed, epoch_evaluator
from bayesurl.runs.runner import evaluate_checkpoint

CAPS = {"max_test": 60, "max_ood": 30}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from _tiny_checkpoint import train_tiny_mcinfonce

    out = tmp_path_factory.mktemp("ckpt")
    method, data = train_tiny_mcinfonce(out, max_train=60, **CAPS)
    (out / "train.json").write_text(json.dumps({"dataset": "default"}))
    return method.eval(), data, out / "last.pt"


def test_round_trip_matches_in_memory_method(trained):
    method, data, ckpt = trained
    expected = epoch_evaluator(data, n_samples=4, seed=3)(method, 0)
    got = evaluate_checkpoint(ckpt, n_samples=4, seed=3, **CAPS)
    assert got["method"] == "mcinfonce" and got["dataset"] == data.name
    for key in ("r@1", "r_auroc", "ausc", "ece", "ood_auroc", "map@5"):
        assert got[key] == expected[key], key
    assert got["ece"] is not None  # a vMF method: samples, so ECE is defined
    # independent R@1: brute-force nearest neighbour by cosine, self excluded by index
    x, y = as_tensors(data.test, default_transform(1))
    e = embed(method, x).embedding.double().numpy()
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    sims = e @ e.T
    np.fill_diagonal(sims, -np.inf)
    r1 = np.mean(y.numpy()[sims.argmax(axis=1)] == y.numpy())
    assert got["r@1"] == pytest.approx(r1, abs=1e-12)
    # independent uncertainty metrics: scikit-learn on u from the method's own forward pass
    from sklearn.metrics import average_precision_score, roc_auc_score

    with torch.no_grad():
        u = method(x).uncertainty.double().numpy()
        u_id = method(as_tensors(data.id_test, default_transform(1))[0]).uncertainty
        u_ood = method(as_tensors(data.ood, default_transform(1))[0]).uncertainty
    correct = y.numpy()[sims.argmax(axis=1)] == y.numpy()
    # R-AUROC: u ranks the wrong queries above the right ones (docs/concepts/metrics.rst)
    assert got["r_auroc"] == pytest.approx(roc_auc_score(~correct, u), abs=1e-9)
    scores = torch.cat([u_id, u_ood]).double().numpy()
    is_ood = np.r_[np.zeros(len(u_id)), np.ones(len(u_ood))]  # OOD = positive class
    assert got["ood_auroc"] == pytest.approx(roc_auc_score(is_ood, scores), abs=1e-9)
    assert got["ood_auprc"] == pytest.approx(average_precision_score(is_ood, scores), abs=1e-9)


def test_cli_checkpoint_prints_and_writes_json(trained, tmp_path, capsys):
    _, _, ckpt = trained
    js = tmp_path / "m.json"
    argv = ["evaluate", "--checkpoint", str(ckpt), "--max-test", "60", "--max-ood", "30"]
    rc = main([*argv, "--n-samples", "4", "--json", str(js)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "mcinfonce" in text and "r_auroc" in text and "ood_auroc" in text
    res = json.loads(js.read_text())
    assert res["checkpoint"] == str(ckpt) and res["n_samples"] == 4
    # the printed/written numbers are evaluate_checkpoint's with the command's defaults (seed 0),
    # itself checked against a brute-force R@1 and scikit-learn above
    ref = evaluate_checkpoint(ckpt, n_samples=4, seed=0, **CAPS)
    for key in ("r@1", "r_auroc", "ausc", "ause", "ece", "ood_auroc", "ood_auprc", "map@5"):
        assert res[key] == pytest.approx(ref[key], rel=1e-12), key
    assert res["ece"] is not None
    row = next(line for line in text.splitlines() if line.split()[:1] == ["r@1"])
    assert float(row.split()[1]) == pytest.approx(ref["r@1"], abs=5e-4)


def test_corrupted_checkpoint_names_the_path(trained, tmp_path, capsys):
    _, _, ckpt = trained
    bad = tmp_path / "broken.pt"
    bad.write_bytes(ckpt.read_bytes()[:200])
    assert main(["evaluate", "--checkpoint", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "error" in err
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint")
    assert main(["evaluate", "--checkpoint", str(junk)]) == 2
    assert str(junk) in capsys.readouterr().err
    with pytest.raises(ValueError, match="broken.pt"):
        evaluate_checkpoint(bad)


def test_missing_checkpoint_and_bad_arguments(trained, tmp_path, capsys):
    _, _, ckpt = trained
    missing = tmp_path / "nope.pt"
    assert main(["evaluate", "--checkpoint", str(missing)]) == 2
    assert "nope.pt" in capsys.readouterr().err
    assert main(["evaluate", "--checkpoint", str(ckpt), "--dataset", "imagenet"]) == 2
    assert "fashion_mnist" in capsys.readouterr().err  # lists the valid names
    assert main(["evaluate", "x.npz", "--checkpoint", str(ckpt)]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["evaluate"]) == 2
    assert "--checkpoint" in capsys.readouterr().err


def test_npz_path_still_works(tmp_path, capsys):
    g = torch.Generator().manual_seed(0)
    path = tmp_path / "a.npz"
    np.savez(
        path,
        embeddings=torch.randn(30, 4, generator=g).numpy(),
        labels=(torch.arange(30) % 3).numpy(),
        uncertainties=torch.rand(30, generator=g).numpy(),
    )
    assert main(["evaluate", str(path)]) == 0
    assert "r_auroc" in capsys.readouterr().out


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_text_file_is_no_checkpoint_and_no_npz_in_one_line(tmp_path, capsys):
    """A text file given as a checkpoint or as INPUT.npz: one line naming the file and what
    was expected, never a bare number from the unpickler nor advice to load it unsafely."""
    text = tmp_path / "notes.txt"
    text.write_text("hello world\n")
    assert main(["evaluate", "--checkpoint", str(text)]) == 2
    err = _one_line_error(capsys)
    assert str(text) in err and "is not a checkpoint" in err
    assert not err.rstrip().endswith(": 101")
    for name in ("notes.txt", "notes.npz"):
        path = tmp_path / name
        path.write_text("hello world\n")
        assert main(["evaluate", str(path)]) == 2
        err = _one_line_error(capsys)
        assert name in err and "not an .npz archive" in err and "named arrays" in err
        assert "pickle" not in err and "unsafe" not in err
    single = tmp_path / "one.npz"
    with open(single, "wb") as fh:
        np.save(fh, np.zeros(3))
    assert main(["evaluate", str(single)]) == 2
    assert "a single .npy array" in _one_line_error(capsys)


def test_checkpoint_of_foreign_objects_is_refused_without_unsafe_advice(tmp_path, capsys):
    import fractions

    path = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}, "x": fractions.Fraction(1, 3)}, path)
    assert main(["evaluate", "--checkpoint", str(path)]) == 2
    err = _one_line_error(capsys)
    assert str(path) in err and "fractions.Fraction" in err
    for advice in ("weights_only", "trust", "allowlist", "safe_globals", "pickle"):
        assert advice not in err, err
    # the other weights-only loads say the same: backbone weights and post-hoc checkpoints
    from bayesurl.backbones import load_backbone_weights
    from bayesurl.posthoc.base import load as load_posthoc

    for call in (
        lambda: load_backbone_weights(torch.nn.Linear(2, 2), path),
        lambda: load_posthoc(path, torch.nn.Linear(2, 2)),
    ):
        with pytest.raises(ValueError) as info:
            call()
        msg = str(info.value)
        assert "foreign.pt" in msg and "fractions.Fraction" in msg and "trust" not in msg
