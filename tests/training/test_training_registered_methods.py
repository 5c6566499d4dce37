"""The loop drives the registered methods: bit-identical resume with BatchNorm and two views."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import bayesurl.data as data
import bayesurl.methods as methods
from bayesurl.training import fit, load_method_from_checkpoint

#: the registry as shipped (a method missing from it fails here, it is not skipped)
REGISTERED = methods.available()


def _images(n: int = 32, classes: int = 3):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
    return x, torch.arange(n) % classes


def _make(name: str):
    assert name in methods.available(), name
    return methods.create(
        name,
        backbone="small_convnet",
        embed_dim=8,
        num_classes=3,
        backbone_kwargs={"width": 4, "num_features": 8},
    )


def _fit(method, tmp, resume=None, crash_at=None):
    x, y = _images()
    ld = DataLoader(
        TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    aug = data.default_augmentation(1) if method.two_view else data.default_transform(1)
    if crash_at is not None:

        def crash(epoch):
            if epoch == crash_at:
                raise KeyboardInterrupt

        method.on_epoch_start = crash
    return fit(
        method,
        ld,
        epochs=3,
        optimizer="adamw",
        lr=1e-3,
        warmup_epochs=1,
        seed=0,
        augment=aug,
        checkpoint_dir=tmp,
        resume=resume,
        progress=False,
    )


@pytest.mark.parametrize("name", ["ce", "infonce"])
def test_registered_method_resumes_bit_identically(tmp_path, name):
    torch.manual_seed(0)
    straight = _make(name)
    _fit(straight, tmp_path / "a")
    torch.manual_seed(0)
    crashed = _make(name)
    with pytest.raises(KeyboardInterrupt):
        _fit(crashed, tmp_path / "b", crash_at=2)
    torch.manual_seed(3)
    resumed = _make(name)
    res = _fit(resumed, tmp_path / "b", resume=tmp_path / "b" / "last.pt")
    assert res.epochs == 3
    sa, sb = straight.state_dict(), resumed.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:  # parameters and BatchNorm running statistics
        assert torch.equal(sa[k], sb[k]), k


def test_registry_lists_the_methods():
    want = {"ce", "infonce", "mcinfonce", "elk", "nivmf", "hib", "tau", "losspred", "sngp"}
    assert want <= set(REGISTERED) and len(REGISTERED) >= 12, REGISTERED


@pytest.mark.parametrize("name", REGISTERED)
def test_every_registered_method_trains_checkpoints_and_rebuilds(tmp_path, name):
    """One epoch through fit, then load_method_from_checkpoint gives the same embeddings."""
    torch.manual_seed(0)
    method = _make(name)
    x, y = _images(16)
    ld = DataLoader(TensorDataset(x, y), batch_size=8)
    aug = data.default_augmentation(1) if method.two_view else data.default_transform(1)
    res = fit(
        method,
        ld,
        epochs=1,
        optimizer="adamw",
        lr=1e-3,
        augment=aug,
        seed=0,
        checkpoint_dir=tmp_path,
        progress=False,
    )
    assert res.global_step == 2 and all(torch.isfinite(torch.tensor(res.losses)))
    rebuilt = load_method_from_checkpoint(tmp_path / "last.pt")
    assert type(rebuilt) is type(method)
    probe = data.default_transform(1)(x[:4])
    method.eval()
    with torch.no_grad():
        torch.manual_seed(1)
        expected = method(probe).embedding
        torch.manual_seed(1)
        got = rebuilt(probe).embedding
    assert torch.equal(expected, got)
