"""Data and the per-rank worker of the sharded-evaluation tests (one process per rank).

The embeddings and draws are 4-sparse vectors with entries +-1, so after normalisation every
entry is +-0.5 and every cosine is an exact multiple of 1/4: exact ties are everywhere, and
duplicates sit on both sides of every shard border.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

import bayesurl.distributed as D
from bayesurl.distributed import cleanup, init_from_env
from bayesurl.evaluation import evaluate, knn_sharded


def sparse_signs(n: int, d: int, g: torch.Generator) -> torch.Tensor:
    x = torch.zeros(n, d, dtype=torch.float64)
    for i in range(n):
        signs = torch.randint(0, 2, (4,), generator=g).double() * 2 - 1
        x[i, torch.randperm(d, generator=g)[:4]] = signs
    return x


def data(n: int = 41, d: int = 6, s: int = 12, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = sparse_signs(n, d, g)
    for i in range(0, n - 1, 5):  # duplicates (exact ties) across every shard border
        x[n - 1 - i] = x[i]
    y = torch.randint(0, 4, (n,), generator=g)
    y[7] = 99  # a singleton class
    # draws: the point itself, or (with prob. 0.4) another exact sparse-sign vector
    pool = sparse_signs(13, d, g)
    pick = torch.randint(0, 13, (s, n), generator=g)
    move = torch.rand(s, n, generator=g) < 0.4
    samples = torch.where(move[..., None], pool[pick], x.expand(s, n, d))
    u = torch.randint(0, 5, (n,), generator=g).double()  # tied uncertainties
    ood = torch.rand(9, generator=g, dtype=torch.float64) * 4
    ref = torch.rand(n, generator=g, dtype=torch.float64)
    # a held-out in-distribution set (as many rows as the OOD set, sharded the same way) and
    # the crop test's images (the same on every rank)
    id_x = sparse_signs(9, d, g)
    id_y = torch.randint(0, 4, (9,), generator=g)
    id_u = torch.randint(0, 5, (9,), generator=g).double()
    images = torch.rand(7, 1, 8, 8, generator=g, dtype=torch.float64)
    return {"x": x, "y": y, "samples": samples, "u": u, "ood": ood, "ref": ref, "id_x": id_x,
            "id_y": id_y, "id_u": id_u, "images": images}  # fmt: skip


def image_spread(images: torch.Tensor) -> torch.Tensor:
    """A stand-in model's ``u``: minus the pixel spread (a crop spreads less)."""
    return -images.flatten(1).std(dim=1)


CASES = {
    "point": dict(uncertainties=True, ks=(1, 3, 5)),
    "shortlist": dict(samples=True, ks=(1, 2), tolerance=0.3),  # adaptive shortlist
    "fixed": dict(samples=True, shortlist=4),  # fixed L (the shared top-L search)
    "exact": dict(samples=True, ece_mode="exact", embeddings=False),
    # the draws' mean is the point embedding: one top-L search serves R@k and the ECE
    "shared": dict(samples=True, embeddings=False, ks=(1, 2), tolerance=0.3),
    # the in-distribution set (OOD against it, the mixed R-AUROC) and the crop test
    "id_set": dict(uncertainties=True, id_set=True),
}


def run_case(name: str, d: dict[str, torch.Tensor], rows: slice, ood_rows: slice, **kw):
    opts = dict(CASES[name])
    kwargs = {}
    if opts.pop("uncertainties", False):
        kwargs["uncertainties"] = d["u"][rows]
    if opts.pop("samples", False):
        kwargs["samples"] = d["samples"][:, rows]
    if opts.pop("id_set", False):
        kwargs.update(
            id_embeddings=d["id_x"][ood_rows], id_labels=d["id_y"][ood_rows],
            id_uncertainties=d["id_u"][ood_rows], predict_uncertainty=image_spread,
            crop_images=d["images"],
        )  # fmt: skip
    emb = None if opts.pop("embeddings", True) is False else d["x"][rows]
    return evaluate(
        emb,
        d["y"][rows],
        ood_uncertainties=d["ood"][ood_rows],
        reference_uncertainties=d["ref"][rows],
        return_curves=True,
        **opts,
        **kwargs,
        **kw,
    )


def plain(res) -> dict:
    """A result as plain data (torch.load with weights_only=True): its intervals as lists, its
    caveats (the notes of bayesurl.evaluation.notes) as their text."""
    return {
        **res,
        "intervals": {k: list(v) for k, v in res["intervals"].items()},
        "caveats": [n.text for n in res.caveats],
    }


def worker(
    rank: int, sizes: list[int], ood_sizes: list[int], ring_rows: int, port: int, out: str
) -> None:
    torch.set_num_threads(1)
    # pass the shards in chunks of `ring_rows` float64 rows (chunk merges inside a shard)
    D.RING_CHUNK_BYTES = ring_rows * 6 * 8
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(len(sizes)),
        LOCAL_RANK=str(rank),
    )
    init_from_env(device="cpu")
    try:
        d = data(n=sum(sizes))
        lo = sum(sizes[:rank])
        rows = slice(lo, lo + sizes[rank])
        o = sum(ood_sizes[:rank])
        ood_rows = slice(o, o + ood_sizes[rank])
        results = {
            name: plain(run_case(name, d, rows, ood_rows, distributed=True)) for name in CASES
        }
        nbs = {k: knn_sharded(d["x"][rows], k, chunk_size=3)[1] for k in (1, 4)}
        # bad input on the last rank only: every rank raises (none waits in a collective)
        bad = d["x"][rows].clone()
        if rank == len(sizes) - 1:
            bad[0, 0] = float("nan")
        try:
            evaluate(bad, d["y"][rows], distributed=True)
            error = ""
        except ValueError as exc:
            error = str(exc)
        torch.save({"results": results, "knn": nbs, "error": error}, Path(out) / f"rank{rank}.pt")
    finally:
        cleanup()


def cli_worker(rank: int, world: int, argv: list[str], port: int) -> None:
    """``bayesurl evaluate ...`` as one torchrun rank (environment as torchrun sets it)."""
    from bayesurl.cli import main

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    assert main(argv) == 0
