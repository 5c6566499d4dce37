"""Data, predictors and the per-rank worker of the sharded :func:`bayesurl.runs.predict.score`
tests (end to end): one process per rank, gloo on CPU.

The images have 4 pixels with values 1..3, so duplicates (exact ties of the embeddings and of
the uncertainties) sit on both sides of every shard border.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from bayesurl.data import ImageTensorDataset
from bayesurl.distributed import cleanup, init_from_env
from bayesurl.methods.base import Method
from bayesurl.runs.predict import epoch_evaluator, score
from bayesurl.types import Output

#: (batch_size, world size): uneven blocks of batches, and ranks with no rows of a set
CASES = {"W2-bs4": (4, 2), "W3-bs8": (8, 3), "W3-bs16": (16, 3)}


class Items(Dataset):
    """A map-style data set that is not in memory as a tensor (read through a DataLoader)."""

    def __init__(self, images: Tensor, targets: Tensor) -> None:
        self.images, self.targets = images, targets

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        return self.images[i], int(self.targets[i])


def sets() -> SimpleNamespace:
    g = torch.Generator().manual_seed(0)

    def images(n: int) -> Tensor:
        return torch.randint(1, 4, (n, 1, 2, 2), generator=g, dtype=torch.uint8)

    test = images(23)
    test[12:] = test[:11]  # duplicates across the shard borders
    return SimpleNamespace(
        test=ImageTensorDataset(test, torch.randint(0, 4, (23,), generator=g)),
        id_test=Items(images(10), torch.zeros(10, dtype=torch.long)),
        ood=ImageTensorDataset(images(7) // 2 + 2, torch.zeros(7, dtype=torch.long)),
    )


def fn(x: Tensor, n: int) -> Output:
    """Deterministic embedding and u; ``n`` Gaussian draws around the embedding.

    Each pixel value (1, 2, 3) sets one of two coordinates to +1 or -1, so every embedding has
    4 entries +-1: after normalisation every cosine is an exact multiple of 1/4 and equal
    similarities are exactly equal in any summation order (the tie rule is tested, not the
    rounding of a matrix product, which differs between chunk layouts).
    """
    v = x.flatten(1).long()
    emb = torch.zeros(v.shape[0], 8, dtype=torch.float64)
    col = 2 * torch.arange(4) + (v == 3).long()
    emb.scatter_(1, col, torch.where(v == 2, -1.0, 1.0).double())
    samples = emb + 0.7 * torch.randn(n, *emb.shape, dtype=emb.dtype) if n > 0 else None
    return Output(embedding=emb, uncertainty=v.sum(1).double(), samples=samples)


def score_case(name: str, **kw) -> dict:
    batch_size, _ = CASES[name]
    return score(
        fn, sets(), None, n_samples=6, batch_size=batch_size, seed=3, return_outputs=True, **kw
    )


class Features(nn.Module):
    """uint8 images -> float64 features of the toy linear method."""

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(1).double()


class BatchNormLinear(Method):
    """A linear classifier behind a BatchNorm layer: under DDP each rank's running statistics
    come from its own last batch (the parameters agree, the buffers do not)."""

    supervised = True

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(4, dtype=torch.float64)
        self.linear = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, x: Tensor, n_samples: int = 0) -> Output:
        logits = self.linear(self.norm(x))
        p = logits.softmax(-1)
        return Output(
            embedding=torch.nn.functional.normalize(logits, dim=-1),
            uncertainty=-(p * p.log()).sum(-1),
        )

    def training_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.linear(self.norm(x)), y)


def train_loader() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 4, generator=g, dtype=torch.float64) * torch.arange(1.0, 5.0).double()
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=8)


def fit_evaluator() -> object:
    return epoch_evaluator(sets(), transform=Features(), n_samples=0, batch_size=4)


def worker(rank: int, world: int, port: int, out: str, names: list[str]) -> None:
    from bayesurl.training import fit

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    init_from_env(device="cpu")
    try:
        results = {name: score_case(name) for name in names}
        saved = {}
        for name, res in results.items():
            outputs = res.pop("outputs")
            res.pop("eval_time")
            saved[name] = {
                # plain JSON values: torch.load(weights_only=True) refuses the result's classes
                "metrics": json.loads(json.dumps(dict(res))),
                "test": (outputs["test"][0].embedding, outputs["test"][0].samples),
                "u_id": outputs["id_test"][0].uncertainty,
            }
        fitted = {}
        if world == 2:  # fit's evaluation hook under DDP: sharded, every rank records it
            torch.manual_seed(0)
            method = BatchNormLinear()
            r = fit(
                method,
                train_loader(),
                epochs=1,
                lr=0.1,
                eval_fn=fit_evaluator(),
                seed=0,
                progress=False,
            )
            fitted = {
                "eval": json.loads(json.dumps(dict(r.history[-1]["eval"]))),
                "state": method.state_dict(),
            }
        torch.save({"results": saved, "fit": fitted}, Path(out) / f"rank{rank}.pt")
    finally:
        cleanup()
