"""vMF sampler cost with and without the implicit kappa gradient (Figurnov et al. 2018).

For each (D, N, S) the same ``sample_vmf`` forward + backward is timed twice, alternating:

- reference: ``kappa`` does not require a gradient (only ``mu`` does), so no quadrature runs;
- implicit: ``kappa`` requires a gradient, so every drawn cosine gets ``dw/dkappa`` by a
  24-node Gauss-Legendre rule (``vmf_cosine_grad_kappa``).

It prints the minimum wall time of each over ``--reps`` alternating runs and their ratio, and
the relative Monte-Carlo bias of d/dkappa E[mu^T z] against the exact A_D'(kappa) as a check.

Usage::

    python benchmarks/vmf_sampler.py [--reps 15] [--threads 1] [--dtype float32]
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from tqdm import tqdm

from bayesurl.distributions.vmf import sample_vmf, vmf_mean_resultant_length


def _time(d: int, n: int, s: int, kappa_grad: bool, dtype: torch.dtype, seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    mu = torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=dtype), dim=-1)
    mu.requires_grad_()
    kap = (torch.rand(n, generator=g, dtype=dtype) * 100 + 1).requires_grad_(kappa_grad)
    t0 = time.perf_counter()
    z = sample_vmf(mu, kap, s, generator=g)
    z.sum().backward()
    return time.perf_counter() - t0


def _bias(d: int, k: float) -> tuple[float, float]:
    """(relative error, relative standard error) of the MC gradient of E[mu^T z]."""
    rows, s = 200, 1000
    kap = torch.full((rows,), k, dtype=torch.float64, requires_grad=True)
    mu = torch.zeros(rows, d, dtype=torch.float64)
    mu[:, 0] = 1.0
    z = sample_vmf(mu, kap, s, generator=torch.Generator().manual_seed(0))
    z[..., 0].mean(0).sum().backward()
    a = float(vmf_mean_resultant_length(torch.tensor(k, dtype=torch.float64), d))
    exact = 1.0 - a * a - (d - 1) * a / k
    mean = float(kap.grad.mean())
    se = float(kap.grad.std()) / math.sqrt(rows)
    return (mean - exact) / exact, se / exact


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    cases = [(d, n, 16) for d in (2, 10, 128, 512) for n in (256, 1024)]
    print(f"{'D':>5} {'N':>5} {'S':>3} {'reference ms':>13} {'implicit ms':>12} {'ratio':>6}")
    for d, n, s in tqdm(cases, disable=args.no_progress, leave=False):
        ref, imp = [], []
        for r in range(args.reps):
            ref.append(_time(d, n, s, False, dtype, r))
            imp.append(_time(d, n, s, True, dtype, r))
        a, b = min(ref), min(imp)
        tqdm.write(f"{d:5d} {n:5d} {s:3d} {a * 1e3:13.2f} {b * 1e3:12.2f} {b / a:6.2f}")
    print("\nMC check, d/dkappa E[mu^T z] over 200k draws (relative error +- relative SE):")
    for d, k in ((2, 5.0), (2, 20.0), (10, 5.0), (10, 20.0)):
        err, se = _bias(d, k)
        print(f"  D={d:3d} kappa={k:5.1f}: {err:+.4f} +- {se:.4f}")


if __name__ == "__main__":
    main()
