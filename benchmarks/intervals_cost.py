"""Cost of the per-run intervals: one exact evaluation with ``intervals=True`` against the same
call with ``intervals=False``, in the same process, alternated, at 1 and 2 threads.

The default call of a run's scoring (``evaluate(x, y, uncertainties=u,
ood_uncertainties=v)``: R@1, recall@1/5/10, R-AUROC, AUSC / AUSE, mAP@1/5/10, OOD AUROC /
AUPRC) on N clustered unit embeddings of dimension D (R@1 about 0.85) and M OOD inputs. The
intervals add Wilson (R@1, recall@k), DeLong (R-AUROC, OOD AUROC) and 1,000 Poisson-bootstrap
replicates (AUSC / AUSE, mAP@k), Boyd's logit interval (OOD AUPRC). Prints the wall and CPU
(process) time of each pass, the medians of ``repeats`` alternations and their ratios (target:
at most 1.10), the CPU and the load of the shared machine (``uptime``) before and after.

On a shared machine the passes' own times vary by more than the intervals cost, so the script
also measures that cost alone: the same call with the neighbours of the first pass given
(``neighbors=``: no search), ``--extra`` alternations of intervals on and off, the median
difference. ``(off + difference) / off`` is the ratio without the search's noise.

    PYTHONPATH=. python benchmarks/intervals_cost.py --n 60000 --d 512 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from _machine import cpu_name, uptime


def make_data(n: int, d: int, m: int, classes: int, seed: int):
    """Clustered unit embeddings, labels, a u correlated with difficulty, OOD u."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    centers = torch.randn(classes, d, generator=g)
    spread = 1.5 + 3.0 * torch.rand(n, 1, generator=g)
    x = torch.nn.functional.normalize(centers[y] + spread * torch.randn(n, d, generator=g), dim=1)
    u = spread.squeeze(1) + 0.3 * torch.rand(n, generator=g)
    v = 3.5 + torch.rand(m, generator=g)
    return x, y, u, v


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=60_000)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--ood", type=int, default=10_000, help="OOD inputs")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--extra", type=int, default=7, help="alternations without the search")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    from bayesurl.evaluation import evaluate

    print(f"# benchmarks/intervals_cost.py, {time.strftime('%Y-%m-%d')}")
    print(f"# CPU {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}")
    print(f"# N={a.n} D={a.d} OOD={a.ood} repeats={a.repeats}, intervals: 1000 replicates")
    print(f"# before: {uptime()}")
    x, y, u, v = make_data(a.n, a.d, a.ood, max(a.n // 30, 2), a.seed)
    summary = []
    for threads in a.threads:
        torch.set_num_threads(threads)
        times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for rep in range(a.repeats):
            for on in (False, True) if rep % 2 == 0 else (True, False):
                t0, c0 = time.perf_counter(), time.process_time()
                res = evaluate(x, y, uncertainties=u, ood_uncertainties=v, intervals=on)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                times[on].append((wall, cpu))
                print(
                    f"threads={threads} rep={rep} intervals={'on ' if on else 'off'} "
                    f"wall {wall:7.2f} s  CPU {cpu:7.2f} s  R@1 {res['r@1']:.4f} "
                    f"R-AUROC {res['r_auroc']:.4f}  intervals {len(res['intervals'])}",
                    flush=True,
                )
        w_on, w_off = (float(np.median([t[0] for t in times[k]])) for k in (True, False))
        c_on, c_off = (float(np.median([t[1] for t in times[k]])) for k in (True, False))
        # the intervals' cost alone: the same call without the search, alternated
        nb = evaluate(x, y, uncertainties=u, intervals=False, return_neighbors=True)["neighbors"]
        extra: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for rep in range(a.extra):
            for on in (False, True) if rep % 2 == 0 else (True, False):
                t0, c0 = time.perf_counter(), time.process_time()
                evaluate(x, y, uncertainties=u, ood_uncertainties=v, intervals=on, neighbors=nb)
                extra[on].append((time.perf_counter() - t0, time.process_time() - c0))
        dw = float(np.median([a_[0] - b_[0] for a_, b_ in zip(extra[True], extra[False])]))
        dc = float(np.median([a_[1] - b_[1] for a_, b_ in zip(extra[True], extra[False])]))
        lines = [
            f"threads={threads}: median wall on {w_on:.2f} s / off {w_off:.2f} s = "
            f"{w_on / w_off:.3f};  CPU {c_on:.2f} / {c_off:.2f} = {c_on / c_off:.3f}  "
            f"(target <= 1.10)",
            f"threads={threads}: the intervals alone (no search, {a.extra} alternations): wall "
            f"+{dw:.2f} s, CPU +{dc:.2f} s;  (off + that) / off: wall "
            f"{(w_off + dw) / w_off:.3f}, CPU {(c_off + dc) / c_off:.3f}",
        ]
        summary += lines
        for line in lines:
            print(line, flush=True)
    print(f"# after: {uptime()}")
    for line in summary:
        print(line)


if __name__ == "__main__":
    main()
