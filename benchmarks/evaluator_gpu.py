"""The evaluator's exact 1-NN pass on a GPU: float32, TF32 and the bfloat16 candidate pass,
against a bare ``torch.mm`` + ``topk`` in the same run.

For each N (clustered unit embeddings, D = 512 by default) it times, median of ``--repeats``
after a warm-up (CUDA events via ``torch.cuda.synchronize``):

- ``bare fp32`` / ``bare tf32`` / ``bare bf16``: ``[B, N]`` blocks of ``torch.mm`` (TF32 off /
  on, bfloat16 inputs), self set to ``-inf``, ``topk(1)``; no tie rule, no certificate;
- ``evaluator fp32``: :func:`bayesurl.search.exact.search_shards` ids only, as ``evaluate``
  calls it, float32 products (TF32 off), bound-checked and re-ranked in float64;
- ``evaluator tf32``: the same with ``torch.set_float32_matmul_precision("high")`` (the bound
  widens to TF32's roundoff);
- ``evaluator bf16``: the bfloat16 candidate pass (:func:`bayesurl.search.low_precision`),
  unfused;
- ``evaluator fused``: the fused product-and-select (:mod:`bayesurl.search.fused`), where
  its kernel works (``benchmarks/gpu_check.py`` times it against the GEMM).

and checks that every evaluator variant returns the float32 evaluator's neighbours exactly,
and how often the bare passes agree with them. Without CUDA it runs a small CPU smoke test.

Usage::

    python benchmarks/evaluator_gpu.py                 # N = 60k and 200k on cuda
    python benchmarks/evaluator_gpu.py --n 60000 --d 512
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

from bayesurl.distributed import Shards
from bayesurl.search import (
    DEFAULT_MEMORY_BUDGET,
    fused_search,
    low_precision,
    normalize,
    search_precision,
    search_stats,
)
from bayesurl.search.exact import search_shards
from bayesurl.search.fused import fused_available


def make_data(n: int, d: int, seed: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, max(n // 30, 2), (n,), generator=g)
    centers = torch.randn(max(n // 30, 2), d, generator=g)
    spread = 1.5 + 3.0 * torch.rand(n, 1, generator=g)
    return normalize(centers[y] + spread * torch.randn(n, d, generator=g)).to(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(
    label: str, fn: Callable[[], Any], device: torch.device, repeats: int
) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()  # warm-up
    sync(device)
    print(f"    {label}: warm-up {time.perf_counter() - t0:.2f} s", flush=True)
    ts = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[len(ts) // 2], out


def bare(x: torch.Tensor, dtype: torch.dtype, rows: int = 8192) -> torch.Tensor:
    """``torch.mm`` + ``topk(1)`` in ``[rows, N]`` blocks, self excluded."""
    xs = x.to(dtype)
    out = torch.empty(x.shape[0], dtype=torch.long, device=x.device)
    for r0 in range(0, x.shape[0], rows):
        r1 = min(r0 + rows, x.shape[0])
        sims = torch.mm(xs[r0:r1], xs.T)
        sims[
            torch.arange(r1 - r0, device=x.device), torch.arange(r0, r1, device=x.device)
        ] = -torch.inf
        out[r0:r1] = sims.topk(1, dim=1).indices[:, 0]
    return out


def evaluator(x: torch.Tensor) -> torch.Tensor:
    sh = Shards.local(x.shape[0])
    xc = x.clone()  # the search normalises in place; keep x
    return search_shards(xc, 1, sh, DEFAULT_MEMORY_BUDGET, None, inplace=True, exact_values=False)[
        1
    ][:, 0]


def one_size(
    x: torch.Tensor, device: torch.device, repeats: int, tf32_evaluator: bool = False
) -> None:
    """Every variant on the unit rows ``x``, timed and compared."""
    n, d = x.shape
    print(f"\nN={n}, D={d}")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    results: dict[str, tuple[float, torch.Tensor]] = {}
    results["bare fp32"] = timed("bare fp32", lambda: bare(x, torch.float32), device, repeats)
    results["bare bf16"] = timed("bare bf16", lambda: bare(x, torch.bfloat16), device, repeats)
    with low_precision(False):
        results["evaluator fp32"] = timed("evaluator fp32", lambda: evaluator(x), device, repeats)
    search_stats(reset=True)
    with low_precision(True), fused_search(False):
        results["evaluator bf16"] = timed("evaluator bf16", lambda: evaluator(x), device, repeats)
    stats = search_stats(reset=True)
    if fused_available(device)[0]:
        with fused_search(True):
            results["evaluator fused"] = timed(
                "evaluator fused", lambda: evaluator(x), device, repeats
            )
    torch.set_float32_matmul_precision("high")  # TF32 where the GPU has it
    results["bare tf32"] = timed("bare tf32", lambda: bare(x, torch.float32), device, repeats)
    if tf32_evaluator:
        with low_precision(False):
            results["evaluator tf32"] = timed(
                "evaluator tf32", lambda: evaluator(x), device, repeats
            )
    else:
        u = 2.0**-11
        slack = 1.1 * (d + 4) * u / (1 - (d + 4) * u)
        print(
            f"  evaluator tf32: skipped; the float32 path's bound under TF32 is {slack:.2f} at "
            f"D={d}, so its float64 window search takes nearly all N^2 pairs "
            "(--tf32-evaluator runs it anyway)"
        )
    torch.set_float32_matmul_precision("highest")
    ref = results["evaluator fp32"][1]
    t_bare = results["bare fp32"][0]
    for key, (t, ids) in results.items():
        same = float((ids == ref).double().mean())
        print(
            f"  {key:15s} {t * 1e3:9.1f} ms  ({t / t_bare:6.2f}x bare fp32)  "
            f"neighbours equal to evaluator fp32: {100 * same:.4f} %"
        )
    for key in [k for k in ("evaluator bf16", "evaluator fused", "evaluator tf32") if k in results]:
        same = torch.equal(results[key][1], ref)
        print(f"  {key} neighbours identical to evaluator fp32: {same}")
    runs = repeats + 1
    print(
        f"  bf16 candidate pass per run: {stats['certified'] // runs} certified, "
        f"{stats['fallback'] // runs} fell back, "
        f"{stats['candidates'] / max(stats['lowp_queries'], 1):.2f} candidates per row"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--n", type=int, nargs="+", default=None)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tf32-evaluator", action="store_true", help="also time the fp32 path on TF32")
    a = p.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    sizes = a.n or ([60_000, 200_000] if cuda else [3000])
    name = torch.cuda.get_device_name() if cuda else "no CUDA: CPU smoke test"
    print(f"device={device} ({name}) torch={torch.__version__} D={a.d}")
    print(f"candidate pass on this device: {search_precision(device)}")
    for n in sizes:
        one_size(make_data(n, a.d, 0, device), device, a.repeats, a.tf32_evaluator)
        if cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
