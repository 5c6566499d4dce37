"""One tiny trained checkpoint for the tests that evaluate ``--checkpoint`` (shared helper)."""

from __future__ import annotations

from pathlib import Path

import torch

from bayesurl.data import ZeroShotData, default_augmentation, default_zero_shot, make_loader
from bayesurl.methods import create
from bayesurl.methods.base import Method
from bayesurl.training import fit

KWARGS = {
    "backbone": "small_convnet",
    "embed_dim": 8,
    "num_classes": 5,
    "backbone_kwargs": {"width": 4, "num_features": 16},
}


class _Keep(torch.nn.Module):
    """Identity transform: the sets are tensors already."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def train_tiny_mcinfonce(
    out: Path, *, max_train: int, max_test: int, max_ood: int
) -> tuple[Method, ZeroShotData]:
    """One epoch of MCInfoNCE (a 16-feature SmallConvNet, seed 0) on the embedded default
    data; ``out / "last.pt"`` is its checkpoint. Returns the method and the data."""
    data = default_zero_shot(
        max_train=max_train, val_fraction=0.0, seed=0, max_test=max_test, max_ood=max_ood
    )
    torch.manual_seed(0)
    method = create("mcinfonce", **KWARGS)
    loader = make_loader(data.train.with_transform(_Keep()), 20, shuffle=True, drop_last=True)
    fit(
        method, loader, epochs=1, optimizer="adamw", augment=default_augmentation(1),
        checkpoint_dir=out, method_kwargs={**method.hparams, **KWARGS}, progress=False, seed=0,
    )  # fmt: skip
    return method, data
