"""Faults and bad input: cases that could pass silently, leak another library's error or
print another library's warning (the per-module ones sit beside their
modules: tests/evaluation/test_evaluate_robust.py, tests/posthoc/test_wrap_robust.py,
tests/distributions/test_vmf_robust.py, tests/test_files.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from unittest import mock

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import bayesurl.methods as methods
from bayesurl.cli import main
from bayesurl.sweeps.results import SweepResults
from bayesurl.training import fit


def _method():
    return methods.create(
        "ce",
        backbone="small_convnet",
        embed_dim=8,
        num_classes=3,
        backbone_kwargs={"width": 4, "num_features": 8},
    )


def _loader():
    x = torch.randn(12, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, torch.arange(12) % 3), batch_size=6)


@pytest.mark.parametrize("device", ["bogus", "cuda:x", "gpu0"])
def test_fit_names_an_unparsable_device(device):
    with pytest.raises(ValueError, match=rf"`device` '{device}' is not a device"):
        fit(_method(), _loader(), progress=False, device=device)


def test_fit_names_cuda_on_a_machine_without_a_driver():
    with (
        mock.patch("torch.cuda.is_available", return_value=False),
        pytest.raises(ValueError, match="`device` 'cuda': CUDA is not available here"),
    ):
        fit(_method(), _loader(), progress=False, device="cuda")


def test_fit_names_a_checkpoint_folder_that_is_a_file_before_training(tmp_path):
    (tmp_path / "ckpt").write_text("not a folder")
    method = _method()
    before = [p.detach().clone() for p in method.parameters()]
    with pytest.raises(ValueError, match="`checkpoint_dir` .* is a file; give a folder"):
        fit(method, _loader(), progress=False, checkpoint_dir=tmp_path / "ckpt")
    assert all(torch.equal(a, b) for a, b in zip(before, method.parameters()))  # no step ran


def test_resume_with_other_epochs_is_refused_and_says_what_to_do(tmp_path):
    fit(_method(), _loader(), epochs=1, seed=0, progress=False, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match="epochs: saved 1, now 3.*load_method_from_checkpoint"):
        fit(_method(), _loader(), epochs=3, seed=0, progress=False, resume=tmp_path / "last.pt")


@pytest.mark.parametrize("shape", ["column", "one_hot"])
def test_lam_fit_refuses_two_dimensional_labels_naming_them(shape):
    pytest.importorskip("pytorch_metric_learning")
    from bayesurl.laplace import MetricLaplace

    torch.manual_seed(0)
    la = MetricLaplace(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    y = torch.arange(30) % 3
    y2 = y[:, None] if shape == "column" else nn.functional.one_hot(y, 3)
    with pytest.raises(ValueError, match=r"`labels` must be 1-D class labels \[N\]"):
        la.fit([(torch.randn(30, 4), y2)], progress=False)  # was PML's bare assert


def test_unknown_method_arg_names_that_the_method_takes_none(tmp_path, capsys):
    code = main(
        ["train", "--method", "ce", "--method-arg", "bogus=1", "--out", str(tmp_path / "o")]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "unknown key `estimators.ce.kwargs.bogus`" in err
    assert "valid: \n" not in err and "takes no further options" in err


@pytest.mark.parametrize(
    ("doc", "what"),
    [
        ({"settings": {}}, "no 'runs' entry"),
        ({"runs": [], "preset": "quick"}, "no 'settings' entry"),
        ({"settings": {}, "runs": [{"seed": 0}]}, r"runs\[0\] has no 'estimator'"),
        ({"settings": {}, "runs": [{"estimator": "ce"}]}, r"runs\[0\] has no integer 'seed'"),
    ],
)
def test_merge_of_a_results_file_missing_its_keys_names_them(tmp_path, capsys, doc, what):
    (tmp_path / "results.json").write_text(json.dumps(doc))
    code = main(["benchmark", "--merge", str(tmp_path), "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert code == 2 and "is not a bayesurl benchmark result" in err
    assert __import__("re").search(what, err), err
    assert "error: estimator" not in err


def test_train_help_keeps_the_example_lines_apart(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    assert "mcinfonce \\\n" in out
    assert not [line for line in out.splitlines() if "      --set" in line.strip()]


def test_benchmark_table_points_at_the_docs_not_a_file_the_package_lacks():
    run = {"method": "ce", "seed": 0, "r@1": 0.8, "r_auroc": 0.6, "ece": None, "error": None}
    other = dict(run, method="elk", ece=0.05)  # an ECE measured: the column is shown
    table = SweepResults(runs=[run, other], settings={"preset": "quick"}).table()
    assert "ECE n/a" in table  # the pointer appears where an ECE is missing
    assert ".md" not in table and "Concepts > Metrics" in table


_QUIET = textwrap.dedent(
    """
    import warnings
    warnings.simplefilter("always")
    import torch
    from torch import nn
    from bayesurl.posthoc import wrap
    g = torch.Generator().manual_seed(0)
    w = wrap(nn.Linear(3, 6), "laplace", classifier=nn.Linear(6, 4))
    w.fit([(torch.randn(32, 3, generator=g), torch.arange(32) % 4)], progress=False)
    w(torch.randn(4, 3))
    """
)


def test_laplace_torch_calls_print_no_foreign_warning():
    """torch.jit.script (asdl at import), BackPACK's full backward hook and laplace-torch's
    link_approx reminder must not print in the middle of `make run`'s table."""
    pytest.importorskip("laplace")
    run = subprocess.run(
        [sys.executable, "-W", "always", "-c", _QUIET], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    for text in ("torch.jit.script", "Full backward hook", "link_approx"):
        assert text not in run.stderr, run.stderr
