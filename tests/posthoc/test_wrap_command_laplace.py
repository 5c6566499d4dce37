"""`bayesurl wrap --method laplace` success path: the saved wrapper reloads around the trained
method, keeps its embedding bit for bit, and its u(x) is the closed-form last-layer Laplace u of
a wrapper fitted in-process on the same images in the same order (LAM section 3)."""

from __future__ import annotations

import pytest
import torch

from bayesurl import training
from bayesurl.cli import main
from bayesurl.data import default_transform, default_zero_shot, make_loader
from bayesurl.methods.infonce import InfoNCE
from bayesurl.posthoc import MethodEncoder, load, wrap

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

KWARGS = {
    "backbone": "small_convnet",
    "embed_dim": 4,
    "backbone_kwargs": {"width": 4, "num_features": 8},
}


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(0)
    method = InfoNCE(**KWARGS)
    path = tmp_path / "last.pt"
    training.save_checkpoint(
        {
            "format": training.CHECKPOINT_FORMAT,
            "version": training.CHECKPOINT_VERSION,
            "method": {"name": "infonce", "kwargs": KWARGS},
            "model": method.state_dict(),
            "epoch": 1,
            "global_step": 1,
        },
        path,
    )
    return path


def test_wrap_command_laplace_fits_saves_and_reloads(checkpoint, tmp_path, capsys):
    out = tmp_path / "laplace.pt"
    argv = ["wrap", str(checkpoint), "--method", "laplace", "--subset", "64"]
    argv += ["--batch-size", "32", "--margin", "0.5", "--out", str(out), "--no-progress"]
    argv += ["--dataset", "digits"]
    assert main(argv) == 0
    assert '"method": "laplace"' in capsys.readouterr().out
    trained = training.load_method_from_checkpoint(checkpoint)
    wrapped = load(out, trained)
    assert wrapped.config()["last_layer"] == "method.net.proj"
    # the same fit in-process: the command's data (digits, 64 images, seed 0) in its order
    data = default_zero_shot(None, force_digits=True, max_train=64, val_fraction=0.0, seed=0)
    loader = make_loader(data.train.with_transform(default_transform()), 32, shuffle=True, seed=0)
    torch.manual_seed(0)
    ref = wrap(
        MethodEncoder(training.load_method_from_checkpoint(checkpoint)),
        "laplace",
        last_layer="method.net.proj",
        margin=0.5,
    )
    ref.fit(loader, progress=False)
    assert ref.la.n_pairs > 0 and bool((ref.la.hessian != 0).any())
    torch.testing.assert_close(wrapped.la.hessian, ref.la.hessian)
    x = torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        emb, u = wrapped(x)
        assert torch.equal(emb, trained(x).embedding)
        torch.testing.assert_close(u, ref(x).uncertainty)
    assert u.shape == (5,) and bool(torch.isfinite(u).all()) and bool((u > 0).all())
    s = wrapped.sample(x, 3, generator=torch.Generator().manual_seed(0))
    assert s.shape == (3, 5, 4)
