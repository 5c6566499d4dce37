"""resume and load compare the method, its options and the run's plan."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import bayesurl.methods as methods
from bayesurl.training import fit, load_method_from_checkpoint


def _make(name, **kw):
    return methods.create(
        name,
        backbone="small_convnet",
        embed_dim=8,
        num_classes=3,
        backbone_kwargs={"width": 4, "num_features": 8},
        **kw,
    )


def _loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 1, 28, 28, generator=g)
    return DataLoader(TensorDataset(x, torch.arange(24) % 3), batch_size=12)


def _fit(method, tmp, **kw):
    args = dict(epochs=1, optimizer="adamw", lr=1e-3, seed=0, progress=False)
    return fit(method, _loader(), checkpoint_dir=tmp, **{**args, **kw})


def test_resume_refuses_another_method_with_the_same_layout(tmp_path):
    torch.manual_seed(0)
    _fit(_make("hib"), tmp_path)
    other = _make("mcinfonce")
    # the layouts agree (that is what made the silent resume possible) ...
    saved = torch.load(tmp_path / "last.pt", weights_only=True)["model"]
    assert saved.keys() == other.state_dict().keys()
    # ... but the method does not
    with pytest.raises(ValueError, match="written by method 'hib', not 'mcinfonce'"):
        _fit(other, tmp_path / "b", resume=tmp_path / "last.pt")


def test_resume_refuses_other_options_and_another_plan(tmp_path):
    torch.manual_seed(0)
    _fit(_make("ce"), tmp_path, epochs=2, keep_epoch_checkpoints=True)
    ckpt = tmp_path / "epoch_1.pt"
    with pytest.raises(ValueError, match="constructor options differ.*embed_dim"):
        fit(
            methods.create(
                "ce",
                backbone="small_convnet",
                embed_dim=4,
                num_classes=3,
                backbone_kwargs={"width": 4, "num_features": 8},
            ),
            _loader(),
            epochs=2,
            optimizer="adamw",
            lr=1e-3,
            resume=ckpt,
            progress=False,
        )
    with pytest.raises(ValueError, match="epochs: saved 2, now 5"):
        _fit(_make("ce"), tmp_path / "b", epochs=5, resume=ckpt)
    with pytest.raises(ValueError, match="lr: saved 0.001, now 0.01"):
        _fit(_make("ce"), tmp_path / "b", epochs=2, lr=1e-2, resume=ckpt)
    # the same plan resumes
    res = _fit(_make("ce"), tmp_path / "b", epochs=2, resume=ckpt)
    assert res.epochs == 2


def test_tampered_checkpoint_kwargs_are_named(tmp_path):
    torch.manual_seed(0)
    _fit(_make("ce"), tmp_path)
    ck = torch.load(tmp_path / "last.pt", weights_only=True)
    ck["method"]["kwargs"]["not_an_option"] = 3
    torch.save(ck, tmp_path / "tampered.pt")
    with pytest.raises(ValueError, match=r"tampered.pt.*no option\(s\) \['not_an_option'\]"):
        load_method_from_checkpoint(tmp_path / "tampered.pt")
    ck["method"]["kwargs"] = ["not", "a", "dict"]
    torch.save(ck, tmp_path / "tampered2.pt")
    with pytest.raises(ValueError, match="tampered2.pt"):
        load_method_from_checkpoint(tmp_path / "tampered2.pt")


def test_fit_names_lr_not_min_lr():
    with pytest.raises(ValueError, match="`lr` must be >= 0"):
        fit(_make("ce"), _loader(), lr=-1, progress=False)
    with pytest.raises(ValueError, match="`weight_decay`"):
        fit(_make("ce"), _loader(), weight_decay=float("nan"), progress=False)


def test_create_names_unknown_options():
    # `bayesurl train --method-arg typo=1` ended in a TypeError traceback
    with pytest.raises(
        ValueError, match=r"unknown option\(s\) \['typo'\] for method 'hib'.*n_samples"
    ):
        _make("hib", typo=1)
