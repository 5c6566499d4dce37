"""Where is the MCInfoNCE loss minimal when the encoder knows the true mean directions?

Diagnostic for the controlled experiment (MCI section 5.1, appendix B). With the
generator's own ``mu(x)`` and ``kappa_hat(x) = c * kappa(x)``, Theorem 4.4 says the loss is
minimal at ``c = 1`` (in the limit of many negatives). This script evaluates the loss for a grid
of ``c`` on the same batches and MC samples (common random numbers) under each combination of

- the positive rejection rule (``eq53``: the paper's appendix B.2 / authors' code; ``vmf``:
  acceptance proportional to the vMF density of eq. 3),
- the denominator (``code``: ``e^pos + mean_m e^neg``; ``eq7``: ``(e^pos + sum_m e^neg) / M``),
- the number of negatives M,

prints the argmin per row and writes a JSON.

Usage::

    python examples/controlled/oracle_landscape.py --dim 2 \
        --out results/controlled/oracle_landscape_d2.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bayesurl.experiments.controlled import VMFGenerator
from bayesurl.losses.mcinfonce import mcinfonce_loss

SCALES = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 4.0)


def landscape(
    dim: int,
    acceptance: str,
    divide_positive: bool,
    n_negatives: int,
    *,
    n_batches: int = 8,
    batch_size: int = 512,
    n_samples: int = 64,
    seed: int = 0,
) -> dict[float, float]:
    """Mean MCInfoNCE loss at ``kappa_hat = c kappa`` for every ``c`` in :data:`SCALES`."""
    gen = VMFGenerator(dim, generator=torch.Generator().manual_seed(seed), acceptance=acceptance)
    g = torch.Generator().manual_seed(seed + 1)
    batches = [gen.sample_triplets(batch_size, n_negatives, generator=g) for _ in range(n_batches)]
    out = {}
    with torch.no_grad():
        params = [(gen(x), gen(xp), gen(xn)) for x, xp, xn in batches]
        for c in SCALES:
            total = 0.0
            for i, ((mu_a, k_a), (mu_p, k_p), (mu_n, k_n)) in enumerate(params):
                total += float(
                    mcinfonce_loss(
                        mu_a,
                        c * k_a,
                        mu_p,
                        c * k_p,
                        mu_n,
                        c * k_n,
                        n_samples=n_samples,
                        kappa_pos_scale=gen.kappa_pos,
                        divide_positive=divide_positive,
                        denominator="positive",  # the MCI form, as the controlled experiment
                        generator=torch.Generator().manual_seed(100 + i),
                    )  # fmt: skip
                )
            out[c] = total / len(params)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dim", type=int, default=2)
    p.add_argument("--negatives", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--samples", type=int, default=64, help="MC samples per posterior")
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    rows = []
    print(f"D={a.dim}, S={a.samples}, {a.batches} x {a.batch_size} anchors; loss at c * kappa")
    print("acceptance denominator    M  " + " ".join(f"{c:>7}" for c in SCALES) + "  argmin")
    for acceptance in ("eq53", "vmf"):
        for divide in (False, True):
            for m in a.negatives:
                if divide and m == 1:
                    continue  # identical to the code's denominator
                t0 = time.perf_counter()
                res = landscape(
                    a.dim, acceptance, divide, m, n_batches=a.batches, batch_size=a.batch_size,
                    n_samples=a.samples,
                )  # fmt: skip
                best = min(res, key=res.get)
                name = "eq7" if divide else "code"
                print(
                    f"{acceptance:>10} {name:>11} {m:>4}  "
                    + " ".join(f"{v:7.4f}" for v in res.values())
                    + f"  {best}  ({time.perf_counter() - t0:.0f}s)",
                    flush=True,
                )
                rows.append(
                    {"acceptance": acceptance, "denominator": name, "negatives": m,
                     "loss": {str(c): v for c, v in res.items()}, "argmin": best}
                )  # fmt: skip
    result = {"dim": a.dim, "samples": a.samples, "batches": a.batches,
              "batch_size": a.batch_size, "rows": rows}  # fmt: skip
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1))
        print(f"wrote {a.out}")
    return result


if __name__ == "__main__":
    main()
