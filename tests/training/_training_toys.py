"""Test-only methods and data for the training-loop tests (not registered globally)."""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from bayesurl.methods.base import Method
from bayesurl.types import Output


class LinearCE(Method):
    """A linear softmax classifier on raw features: CE with mean reduction, no batch coupling."""

    supervised = True

    def __init__(self, in_dim: int = 6, num_classes: int = 3, dtype: str = "float64") -> None:
        super().__init__()
        self.linear = nn.Linear(in_dim, num_classes, dtype=getattr(torch, dtype))
        self.init_kwargs = {"in_dim": in_dim, "num_classes": num_classes, "dtype": dtype}

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        logits = self.linear(x)
        p = logits.softmax(-1)
        return Output(
            embedding=F.normalize(logits, dim=-1),
            uncertainty=-(p * p.clamp_min(1e-30).log()).sum(-1),
            logits=logits,
        )

    def training_loss(self, batch):
        x, y = batch
        return F.cross_entropy(self.linear(x), y)


class NoisyMLP(Method):
    """A small MLP whose loss draws from torch, numpy and Python RNGs (dropout + noise)."""

    def __init__(self, in_dim: int = 6, num_classes: int = 3) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, 16, dtype=torch.float64),
            nn.Tanh(),
            nn.Dropout(0.2),
            nn.Linear(16, num_classes, dtype=torch.float64),
        )
        self.epochs_started: list[int] = []
        self.epochs_ended: list[int] = []

    #: raise in ``on_epoch_start`` of this epoch (simulates a job killed mid-run)
    crash_at_epoch: int | None = None

    def on_epoch_start(self, epoch: int) -> None:
        if epoch == self.crash_at_epoch:
            raise KeyboardInterrupt(f"simulated crash at epoch {epoch}")
        self.epochs_started.append(epoch)

    def on_epoch_end(self, epoch: int) -> None:
        self.epochs_ended.append(epoch)

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        logits = self.net(x)
        return Output(embedding=logits, uncertainty=logits.logsumexp(-1), logits=logits)

    def training_loss(self, batch):
        x, y = batch
        scale = 1.0 + 0.01 * random.random() + 0.01 * float(np.random.rand())  # noqa: NPY002
        return scale * F.cross_entropy(self.net(x), y)


class TwoViewToy(Method):
    """Self-supervised toy: cosine InfoNCE between the two views of a linear encoder."""

    two_view = True
    supervised = False

    def __init__(self, in_dim: int = 6, dim: int = 4) -> None:
        super().__init__()
        self.enc = nn.Linear(in_dim, dim, dtype=torch.float64)
        self.seen_pairs = 0

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        e = F.normalize(self.enc(x), dim=-1)
        return Output(embedding=e, uncertainty=torch.zeros(len(x), dtype=e.dtype))

    def training_loss(self, batch):
        (x1, x2), _ = batch
        assert x1.shape == x2.shape
        self.seen_pairs += 1
        z1, z2 = F.normalize(self.enc(x1), dim=-1), F.normalize(self.enc(x2), dim=-1)
        logits = 10.0 * z1 @ z2.T
        return F.cross_entropy(logits, torch.arange(len(x1)))


class NaNAfter(LinearCE):
    """Returns a NaN loss from the ``bad_step``-th call on."""

    def __init__(self, bad_step: int = 3) -> None:
        super().__init__()
        self.bad_step, self.calls = bad_step, 0

    def training_loss(self, batch):
        self.calls += 1
        loss = super().training_loss(batch)
        return loss * float("nan") if self.calls >= self.bad_step else loss


def blobs(n: int = 64, in_dim: int = 6, num_classes: int = 3, seed: int = 0):
    """Gaussian class blobs (float64 features, int64 labels)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % num_classes
    centers = 3.0 * torch.randn(num_classes, in_dim, generator=g, dtype=torch.float64)
    x = centers[y] + torch.randn(n, in_dim, generator=g, dtype=torch.float64)
    return x, y


def loader(n: int = 64, batch_size: int = 8, shuffle: bool = False, **kw) -> DataLoader:
    x, y = blobs(n)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=shuffle, **kw)
