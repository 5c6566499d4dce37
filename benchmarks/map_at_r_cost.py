"""Cost of MAP@R / R-precision: one exact evaluation with ``map@r`` selected against the same
call without it, in the same process, alternated, at 1 and 2 threads.

The default call of a run's scoring (``evaluate(x, y, uncertainties=u)``: R@1, recall@k,
R-AUROC, AUSC / AUSE, AURC / AUGRC, mAP@k, with their intervals) on N clustered unit
embeddings of dimension D, once as it is and once with ``include=[..., "map@r"]``. MAP@R ranks
each query's ``R`` nearest items (``R``: the other items of its class) in its own chunked pass
(:func:`bayesurl.evaluation.functional.precision_at_r`): one more matrix product over all
pairs and a top-``R`` selection per query, so its cost grows with the class size. Two class
layouts: ``--classes`` (default N / 30: R about 29, the size of the URL / CUB-like test
sets) and ``--big-classes`` (default 10: R about N / 10, FashionMNIST-like, the worst case).

Prints the wall and CPU (process) time of each pass, the medians and their ratios (target: at
most 1.3), the MAP@R pass alone (``precision_at_r``), the CPU and the load of the shared
machine (``uptime``) before and after.

    PYTHONPATH=. python benchmarks/map_at_r_cost.py --n 60000 --d 512 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
from _machine import cpu_flags, cpu_name, uptime


def make_data(n: int, d: int, classes: int, seed: int):
    """Clustered unit embeddings, labels and a u correlated with difficulty."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    centers = torch.randn(classes, d, generator=g)
    spread = 1.5 + 3.0 * torch.rand(n, 1, generator=g)
    x = torch.nn.functional.normalize(centers[y] + spread * torch.randn(n, d, generator=g), dim=1)
    u = spread.squeeze(1) + 0.3 * torch.rand(n, generator=g)
    return x, y, u


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=60_000)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--classes", type=int, default=None, help="default N / 30; 0: skip")
    p.add_argument("--big-classes", type=int, default=10, help="0: skip this layout")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    from bayesurl.evaluation import evaluate, functional
    from bayesurl.evaluation.table import select_metrics

    default = [m.name for m in select_metrics(None, (), {"ks": (1,), "map_ks": (5,)})]
    small = [] if a.classes == 0 else [a.classes or max(a.n // 30, 2)]
    layouts = small + ([a.big_classes] if a.big_classes else [])
    print(f"# benchmarks/map_at_r_cost.py, {time.strftime('%Y-%m-%d')}")
    print(f"# CPU {cpu_name()}, {os.cpu_count()} cores, flags: {cpu_flags()}")
    print(f"# torch {torch.__version__}; N={a.n} D={a.d} repeats={a.repeats}; classes {layouts}")
    print(f"# off: the default metrics {default}; on: the same and map@r")
    print(f"# before: {uptime()}")
    summary = []
    for classes in layouts:
        x, y, u = make_data(a.n, a.d, classes, a.seed)
        r = torch.unique(y, return_counts=True)[1] - 1
        for threads in a.threads:
            torch.set_num_threads(threads)
            times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            for rep in range(a.repeats):
                for on in (False, True) if rep % 2 == 0 else (True, False):
                    include = [*default, "map@r"] if on else default
                    t0, c0 = time.perf_counter(), time.process_time()
                    res = evaluate(x, y, uncertainties=u, include=include)
                    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                    times[on].append((wall, cpu))
                    extra = f"MAP@R {res['map@r']:.4f}" if on else ""
                    print(
                        f"classes={classes} threads={threads} rep={rep} map@r="
                        f"{'on ' if on else 'off'} wall {wall:7.2f} s  CPU {cpu:7.2f} s  "
                        f"R@1 {res['r@1']:.4f} {extra}",
                        flush=True,
                    )
            t0, c0 = time.perf_counter(), time.process_time()
            functional.precision_at_r(x, y)
            alone_w, alone_c = time.perf_counter() - t0, time.process_time() - c0
            w_on, w_off = (float(np.median([t[0] for t in times[k]])) for k in (True, False))
            c_on, c_off = (float(np.median([t[1] for t in times[k]])) for k in (True, False))
            line = (
                f"classes={classes} (R {int(r.min())}..{int(r.max())}) threads={threads}: "
                f"median wall on {w_on:.2f} s / off {w_off:.2f} s = {w_on / w_off:.3f}; "
                f"CPU {c_on:.2f} / {c_off:.2f} = {c_on / c_off:.3f} (target <= 1.3); "
                f"the MAP@R pass alone: wall {alone_w:.2f} s, CPU {alone_c:.2f} s"
            )
            summary.append(line)
            print(line, flush=True)
    print(f"# after: {uptime()}")
    for line in summary:
        print(line)


if __name__ == "__main__":
    main()
