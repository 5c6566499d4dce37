"""`bayesurl evaluate INPUT.npz [--json OUT.json]`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bayesurl.cli import main
from bayesurl.evaluation import REQUIRED_KEYS, evaluate


def write(path, **arrays) -> str:
    np.savez(path, **arrays)
    return str(path)


@pytest.fixture
def arrays():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 60)
    x = rng.normal(size=(4, 5))[y] + rng.normal(size=(60, 5))
    return {"embeddings": x.astype(np.float32), "labels": y}


def brute_force_r1(x: np.ndarray, y: np.ndarray) -> float:
    """R@1 by a loop: cosine nearest other point (ties to the lowest index), same label."""
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    hits = 0
    for i in range(len(y)):
        best, arg = -np.inf, -1
        for j in range(len(y)):
            if j != i and float(xn[i] @ xn[j]) > best:
                best, arg = float(xn[i] @ xn[j]), j
        hits += int(y[arg] == y[i])
    return hits / len(y)


def reference(arrays) -> dict:
    """evaluate() on the same arrays, with the command's defaults (ks 1 5 10, adaptive
    shortlist)."""
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in arrays.items()}
    return evaluate(
        t.pop("embeddings"),
        t.pop("labels"),
        **t,
        ks=(1, 5, 10),
        ece_mode="shortlist",
        shortlist=None,
    )


def check_against_reference(res: dict, arrays) -> None:
    ref = reference(arrays)
    assert set(REQUIRED_KEYS) <= set(res)
    for k in REQUIRED_KEYS:
        if ref[k] is None:
            assert res[k] is None, k
        else:
            assert res[k] == pytest.approx(ref[k], rel=1e-6, abs=1e-12), k
    assert res["r@1"] == pytest.approx(brute_force_r1(arrays["embeddings"], arrays["labels"]))


def test_table_and_json_nulls(tmp_path, arrays, capsys) -> None:
    out = tmp_path / "m.json"
    assert main(["evaluate", write(tmp_path / "a.npz", **arrays), "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    check_against_reference(res, arrays)
    assert res["ece"] is None and res["r_auroc"] is None and isinstance(res["r@1"], float)
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.split()[:1] == ["r@1"])
    assert float(row.split()[1]) == pytest.approx(res["r@1"], abs=5e-4)  # printed rounded


def test_all_arrays(tmp_path, arrays) -> None:
    rng = np.random.default_rng(1)
    arrays["samples"] = arrays["embeddings"][None] + 0.2 * rng.normal(size=(6, 60, 5))
    arrays["uncertainties"] = rng.random(60)
    arrays["ood_uncertainties"] = rng.random(9)
    out = tmp_path / "m.json"
    assert main(["evaluate", write(tmp_path / "a.npz", **arrays), "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert all(res[k] is not None for k in REQUIRED_KEYS)
    check_against_reference(res, arrays)


@pytest.mark.parametrize(
    ("change", "name", "problem"),
    [
        ({"embeddings": np.full((60, 5), np.nan)}, "embeddings", "non-finite"),
        ({"embeddings": np.zeros(60)}, "embeddings", "2-D"),
        ({"labels": np.zeros(59)}, "labels", "length"),
        ({"embeddings": np.zeros((1, 5)), "labels": np.zeros(1)}, "embeddings", "at least 2"),
        ({"uncertainties": np.zeros(3)}, "uncertainties", "length"),
        ({"samples": np.zeros((2, 60, 4))}, "samples", "dimension"),
        ({"ood_uncertainties": np.array([np.inf])}, "ood_uncertainties", "non-finite"),
    ],
)
def test_bad_input_exits_nonzero_naming_array(tmp_path, arrays, capsys, change, name, problem):
    arrays.update(change)
    assert main(["evaluate", write(tmp_path / "bad.npz", **arrays)]) != 0
    err = capsys.readouterr().err
    assert f"`{name}`" in err and problem in err


def test_missing_array_and_file(tmp_path, arrays, capsys) -> None:
    assert main(["evaluate", write(tmp_path / "x.npz", embeddings=arrays["embeddings"])]) != 0
    assert "labels" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "nope.npz")]) != 0
    assert "nope.npz" in capsys.readouterr().err
    (tmp_path / "junk.npz").write_text("not a zip")
    assert main(["evaluate", str(tmp_path / "junk.npz")]) != 0
    assert "junk.npz" in capsys.readouterr().err


def _informative(n: int = 1000, seed: int = 0) -> dict:
    """R@1 about 0.8 with a u that rises on the hard queries (their noise), and OOD inputs
    noisier still: R-AUROC and OOD AUROC well above 0.5."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    noise = rng.uniform(0.3, 1.6, n)
    x = rng.normal(size=(10, 16))[y] + noise[:, None] * rng.normal(size=(n, 16))
    return {
        "embeddings": x.astype(np.float32),
        "labels": y,
        "uncertainties": noise,
        "ood_uncertainties": rng.uniform(1.2, 2.0, 300),
    }


@pytest.mark.parametrize(
    "how, kinds",
    [
        ("as is", set()),
        ("negated", {"inverted_r_auroc", "inverted_ood_auroc"}),
        ("random", {"chance_r_auroc", "chance_ood_auroc"}),
    ],
)
def test_evaluate_prints_the_intervals_and_the_chance_and_inverted_notes(
    tmp_path, capsys, how, kinds
) -> None:
    a = _informative()
    if how == "negated":
        a["uncertainties"], a["ood_uncertainties"] = -a["uncertainties"], -a["ood_uncertainties"]
    elif how == "random":
        rng = np.random.default_rng(7)
        a["uncertainties"] = rng.random(a["uncertainties"].size)
        a["ood_uncertainties"] = rng.random(a["ood_uncertainties"].size)
    out = tmp_path / "m.json"
    assert main(["evaluate", write(tmp_path / "a.npz", **a), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    res = json.loads(out.read_text())
    # each AUROC beside its interval in the table and in the JSON
    row = next(line for line in printed.splitlines() if line.split()[:1] == ["r_auroc"])
    assert f"[{res['r_auroc_low']:.4f}, {res['r_auroc_high']:.4f}]" in row and "delong" in row
    assert res["r_auroc_n"] == 1000 and res["ood_auroc_n"] == 1300
    words = {"inverted_r_auroc": "u is inverted: R-AUROC",
             "chance_r_auroc": "u is at chance: R-AUROC",
             "inverted_ood_auroc": "u is inverted: OOD AUROC",
             "chance_ood_auroc": "u is at chance: OOD AUROC"}  # fmt: skip
    for kind, text in words.items():
        assert (f"note: {text}" in printed) == (kind in kinds), (how, kind)
        assert any(text in c for c in res["caveats"]) == (kind in kinds)
    if how == "negated":
        assert res["r_auroc_high"] < 0.5 and res["ood_auroc_high"] < 0.5
    if how == "random":
        assert res["r_auroc_low"] <= 0.5 <= res["r_auroc_high"]
