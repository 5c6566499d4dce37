"""`bayesurl wrap`: fit a post-hoc method on a training checkpoint, save, reload."""

from __future__ import annotations

import pytest
import torch

import bayesurl.laplace  # noqa: F401  (the laplace wrapper needs it; a broken import fails here)
import bayesurl.training as training
from bayesurl.cli import main
from bayesurl.methods.tau import TaU
from bayesurl.posthoc import load

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    kwargs = {
        "backbone": "small_convnet",
        "embed_dim": 4,
        "backbone_kwargs": {"width": 4, "num_features": 8},
    }
    method = TaU(**kwargs)
    path = tmp_path_factory.mktemp("run") / "last.pt"
    training.save_checkpoint(
        {
            "format": training.CHECKPOINT_FORMAT,
            "version": training.CHECKPOINT_VERSION,
            "method": {"name": "tau", "kwargs": kwargs},
            "model": method.state_dict(),
            "epoch": 1,
            "global_step": 1,
        },
        path,
    )
    return path


@pytest.mark.parametrize("method", ["pvu", "tau", "mahalanobis", "gmm", "knn"])
def test_wrap_command_fits_saves_and_reloads(checkpoint, tmp_path, method, capsys):
    out = tmp_path / f"{method}.pt"
    argv = [
        "wrap",
        str(checkpoint),
        "--method",
        method,
        "--subset",
        "64",
        "--epochs",
        "1",
        "--batch-size",
        "32",
        "--out",
        str(out),
        "--no-progress",
        "--dataset",
        "digits",  # bundled with scikit-learn, small: keeps the test fast
    ]
    assert main(argv) == 0
    assert f'"method": "{method}"' in capsys.readouterr().out
    trained = training.load_method_from_checkpoint(checkpoint)
    wrapped = load(out, trained)  # a Method is wrapped as its embedding encoder
    x = torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        emb, u = wrapped(x)
        assert torch.equal(emb, trained(x).embedding)
    assert u.shape == (5,) and bool(torch.isfinite(u).all())


def test_wrap_command_errors(checkpoint, tmp_path, capsys):
    out = str(tmp_path / "x.pt")
    assert main(["wrap", str(checkpoint), "--method", "sngp", "--out", out]) == 2
    assert "unknown `--method`" in capsys.readouterr().err
    assert main(["wrap", str(tmp_path / "none.pt"), "--out", out]) == 2
    # TaU's projection also emits the temperature logit: it is not the embedding layer
    argv = [
        "wrap",
        str(checkpoint),
        "--method",
        "laplace",
        "--subset",
        "64",
        "--out",
        out,
        "--no-progress",
        "--dataset",
        "digits",  # bundled with scikit-learn, small: keeps the test fast
    ]
    assert main(argv) == 2
    assert "not the output of its last nn.Linear" in capsys.readouterr().err
