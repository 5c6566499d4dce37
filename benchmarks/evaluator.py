"""Benchmark of the evaluator's exact kNN pass and its sampling-aware ECE.

Prints, in one run and against references measured in the same run:

1. time of exact R@1 + R-AUROC (bayesurl, chunked torch kNN) divided by
   - faiss ``IndexFlatIP`` search (k=2, self dropped) and
   - pytorch-metric-learning's ``AccuracyCalculator`` ``precision_at_1``;
2. peak memory of each (RSS sampled every 5 ms on CPU, ``torch.cuda.max_memory_allocated``
   on GPU);
3. for S draws (default 100), the time of the sampling-aware ECE (``--mode``, default shortlist)
   divided by one exact deterministic pass on the same points, and the agreement of the
   per-draw 1-NN labels with brute force (exact per-draw search).

Targets: exact pass <= 1.05x faiss; S=100 ECE <= 3x one pass at >= 99.5 % agreement.

The reference's BLAS: faiss-cpu wheels bundle an OpenBLAS that falls back to its slowest
kernel ("Prescott") on processors it does not know, which would make faiss look several
times slower than it is. The script prints every loaded BLAS with the kernel it chose
(threadpoolctl) and, unless ``--faiss-coretype none``, re-executes itself with
``OPENBLAS_CORETYPE`` pinned (``auto``: SkylakeX where the CPU has AVX-512, Haswell where
it has AVX2) before faiss is loaded. The pin applies to every OpenBLAS of the process,
numpy's too (the exact pass's tile products, :func:`bayesurl.search.core.tile_product`).
Times are medians of ``--repeats`` interleaved runs, wall and CPU (process) time: on a shared
machine the CPU time is the steadier measure; the load average is printed.

``--distributed W`` instead times the whole ``bayesurl evaluate X.npz`` command
(process start, reading, search, metrics) in one process and under ``torchrun
--nproc_per_node W`` with the same threads per process (``--threads``, default 1 here),
alternating ``--repeats`` times, and prints the W-rank / 1-rank time ratio (median) of the
whole command, after the imports and in CPU time, each rank's peak anonymous memory above its
post-import baseline against the bound of :func:`memory_bound` term by term (its shard as read
and normalised, the ring's chunk buffers, its ``budget / W`` similarity block, top-k and
temporaries; library code paged in is printed apart), and the largest metric difference.
``--phases`` adds rank 0's RSS at each phase boundary, ``--sweep-n 60000 120000`` repeats the
comparison for several N (start-up weighs less at larger N). Target: 2 ranks <= 0.6x at
N = 60k, D = 256, one thread per process; peak per rank <= 1/W of the embeddings plus the
chunk buffers.

Usage::

    python benchmarks/evaluator.py            # N=60k, D=512
    python benchmarks/evaluator.py --quick    # N=8k, D=128
    python benchmarks/evaluator.py --device cuda
    python benchmarks/evaluator.py --distributed 2 --n 60000 --d 256   # sharded evaluate
    python benchmarks/evaluator.py --distributed 2 --d 256 --sweep-n 60000 120000 --phases
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bayesurl.distributed import Shards
from bayesurl.evaluation import functional as Fm
from bayesurl.evaluation import low_precision, search_precision, search_stats
from bayesurl.search import DEFAULT_MEMORY_BUDGET, knn
from bayesurl.search.exact import search_shards


class PeakMemory:
    """Peak resident memory (CPU, sampled) or peak allocated CUDA memory during a block."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0
        self._stop = threading.Event()

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss() - self.base)
            time.sleep(0.005)

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            self.base = self._rss()
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, self._rss() - self.base)


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, int, Any]:
    """Wall time, peak memory and result of ``fn()``."""
    with PeakMemory(device) as mem:
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    return dt, mem.peak, out


def make_data(n: int, d: int, classes: int, seed: int, device: torch.device):
    """Clustered unit embeddings, labels and an uncertainty correlated with difficulty."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    centers = torch.randn(classes, d, generator=g)
    spread = 1.5 + 3.0 * torch.rand(n, 1, generator=g)  # R@1 about 0.85
    x = Fm.normalize(centers[y] + spread * torch.randn(n, d, generator=g))
    u = spread.squeeze(1) + 0.3 * torch.rand(n, generator=g)
    return x.to(device), y.to(device), u.to(device)


def fitting_points(draws: int, d: int, device: torch.device) -> int:
    """Largest N whose ``[draws, N, d]`` float32 draws take at most half the free memory."""
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
    else:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        free = int(info["MemAvailable"].split()[0]) * 1024
    return max(2, int(free // 2 // (4 * draws * d)))


def brute_force_neighbors(samples: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Exact 1-NN (self excluded, ties to the lowest index) of queries ``q`` in every draw."""
    out = torch.empty(samples.shape[0], q.numel(), dtype=torch.long, device=samples.device)
    r = torch.arange(q.numel(), device=samples.device)
    for t, z in enumerate(samples):
        zn = Fm.normalize(z)
        sims = zn[q] @ zn.T
        sims[r, q] = -torch.inf
        out[t] = sims.max(dim=1).indices
    return out


def exact_pass(x: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> tuple[float, float]:
    r1, correct = Fm.r_at_1(x, y)
    return float(r1), float(Fm.r_auroc(u, correct))


def faiss_pass(x: torch.Tensor, y: torch.Tensor) -> float:
    import faiss

    xn = x.cpu().numpy()
    index = faiss.IndexFlatIP(xn.shape[1])
    index.add(xn)
    _, idx = index.search(xn, 2)
    own = idx[:, 0] == np.arange(len(xn))
    nn = np.where(own, idx[:, 1], idx[:, 0])
    yy = y.cpu().numpy()
    return float((yy[nn] == yy).mean())


def pml_pass(x: torch.Tensor, y: torch.Tensor) -> float:
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    calc = AccuracyCalculator(include=("precision_at_1",), k=1, device=x.device)
    return calc.get_accuracy(x, y, x, y, ref_includes_query=True)["precision_at_1"]


def cpu_coretype() -> str | None:
    """An OpenBLAS kernel the processor supports (``OPENBLAS_CORETYPE``), from its flags."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(
                (line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []
            )
    except OSError:
        return None
    if "avx512f" in flags:
        return "SkylakeX"
    return "Haswell" if "avx2" in flags else None


def pin_openblas(coretype: str) -> None:
    """Re-execute this script with ``OPENBLAS_CORETYPE`` set, before any OpenBLAS reads it
    (numpy's is loaded already, faiss's not yet); a no-op when it is set or ``none``."""
    if coretype == "none" or "OPENBLAS_CORETYPE" in os.environ:
        return
    kernel = cpu_coretype() if coretype == "auto" else coretype
    if kernel is None:
        return
    os.environ["OPENBLAS_CORETYPE"] = kernel
    os.execv(sys.executable, [sys.executable, *sys.argv])


def blas_report() -> list[str]:
    """Every loaded BLAS: library, version, kernel (threadpoolctl), threads."""
    from threadpoolctl import threadpool_info

    return [
        f"{os.path.basename(i['filepath'])} {i.get('version')} kernel={i.get('architecture')} "
        f"threads={i.get('num_threads')}"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    ]


def product_rates(d: int, repeats: int = 5) -> tuple[float, float]:
    """GFLOP/s of one ``[4096, d] @ [d, 1024]`` float32 tile through torch (MKL) and through
    numpy's BLAS (:func:`bayesurl.search.core.tile_product`), CPU time, median."""
    from bayesurl.search.core import blas_threads, tile_product

    a, b = torch.randn(4096, d), torch.randn(1024, d)
    out = torch.empty(4096, 1024)
    flops = 2 * 4096 * 1024 * d
    rates = []
    for fn in (lambda: torch.mm(a, b.T, out=out), lambda: tile_product(a, b.T, out)):
        ts = []
        with blas_threads():
            for _ in range(repeats):
                c0 = time.process_time()
                fn()
                ts.append(time.process_time() - c0)
        rates.append(flops / float(np.median(ts)) / 1e9)
    return rates[0], rates[1]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N=8000, D=128, ECE N=4000")
    p.add_argument("--n", type=int, default=60_000)
    p.add_argument("--d", type=int, default=512)
    p.add_argument("--draws", type=int, default=100, help="posterior draws S of the ECE")
    p.add_argument(
        "--ece-n",
        type=int,
        default=None,
        help="points of the ECE run (default: N when the [S, N, D] float32 draws fit in half "
        "the available memory, else the largest N that does)",
    )
    p.add_argument("--noise", type=float, default=0.25, help="per-draw noise / signal norm")
    p.add_argument("--shortlist", type=int, default=None, help="fixed L (default: adaptive)")
    p.add_argument("--mode", default="shortlist", choices=("shortlist", "block", "exact"))
    p.add_argument("--block", type=int, default=32, help="queries per block (block mode)")
    p.add_argument(
        "--tolerance",
        type=float,
        default=3e-3,
        help="miss-rate target of the adaptive shortlist (library default 1e-3; 3e-3 keeps "
        "the agreement above the 99.5 %% target with headroom)",
    )
    p.add_argument(
        "--agree-queries",
        type=int,
        default=2000,
        help="random queries whose 1-NN is checked by brute force in every draw",
    )
    p.add_argument(
        "--no-shared", action="store_true", help="skip the ECE run on the evaluator's shared kNN"
    )
    p.add_argument(
        "--skip-pml",
        action="store_true",
        help="stop after the exact pass / faiss comparison (no PML pass, no ECE part)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="alternating repetitions of the exact pass and faiss; medians are compared",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--faiss-coretype",
        default="auto",
        help="OPENBLAS_CORETYPE pinned for faiss's bundled OpenBLAS (and numpy's) by re-executing "
        "the script: auto (SkylakeX with AVX-512, Haswell with AVX2), a kernel name, or none",
    )
    p.add_argument("--threads", type=int, default=None, help="default 2 (1 with --distributed)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--feat-n", type=int, default=20_000, help="with --precision: N of the 1,280-d search"
    )
    p.add_argument(
        "--distributed",
        type=int,
        default=None,
        metavar="W",
        help="time `bayesurl evaluate` under torchrun with W ranks against 1 process",
    )
    p.add_argument(
        "--ece-draws",
        type=int,
        default=0,
        help="with --distributed: S posterior draws in the npz (the ECE is timed too)",
    )
    p.add_argument(
        "--sweep-n",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="with --distributed: run it for each N in turn (e.g. 60000 120000: start-up "
        "weighs less at larger N)",
    )
    p.add_argument(
        "--precision",
        action="store_true",
        help="compare the bfloat16 candidate pass, the float32 path and faiss at 1 and 2 threads "
        "(neighbours checked identical), the 1,280-d feature search and a sampled-ECE run "
        "with the exact per-draw fallback, before / after",
    )
    p.add_argument(
        "--phases",
        action="store_true",
        help="with --distributed: also print rank 0's RSS at the evaluation's phase boundaries",
    )
    a = p.parse_args(argv)
    if argv is None:
        pin_openblas(a.faiss_coretype)
    if a.quick:
        a.n, a.d = 8000, 128
    if a.precision:
        return precision_main(a)
    if a.distributed is not None:
        for n in a.sweep_n or [a.n]:
            a.n = n
            distributed_main(a)
        return None
    a.threads = 2 if a.threads is None else a.threads
    device = torch.device(a.device)
    torch.set_num_threads(a.threads)
    try:
        import faiss

        faiss.omp_set_num_threads(a.threads)
        have_faiss = True
    except ImportError:
        have_faiss = False
    load = os.getloadavg()
    print(
        f"device={device} threads={a.threads} N={a.n} D={a.d} torch={torch.__version__} "
        f"cpus={os.cpu_count()} load={load[0]:.2f},{load[1]:.2f},{load[2]:.2f} "
        f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}"
    )
    for line in blas_report():
        print(f"  BLAS {line}")
    if device.type == "cpu":
        r_torch, r_numpy = product_rates(a.d)
        print(
            f"  one [4096, {a.d}] @ [{a.d}, 1024] tile: torch.mm {r_torch:.0f} GFLOP/s, numpy's "
            f"BLAS (the search's) {r_numpy:.0f} GFLOP/s (CPU time)"
        )

    x, y, u = make_data(a.n, a.d, max(a.n // 30, 2), a.seed, device)
    knn(x[:256], 1)  # warm-up (BLAS threads, allocator)
    if have_faiss:
        faiss_pass(x[:256], y[:256])
    # alternate the two, a.repeats times, and compare medians: the machine drifts by 5-10 %
    ours: list[tuple[float, int, tuple[float, float]]] = []
    theirs: list[tuple[float, int, float]] = []
    cpu_ours: list[float] = []
    cpu_theirs: list[float] = []
    for _ in range(a.repeats):
        c0 = time.process_time()
        ours.append(timed(lambda: exact_pass(x, y, u), device))
        cpu_ours.append(time.process_time() - c0)
        if have_faiss:
            c0 = time.process_time()
            theirs.append(timed(lambda: faiss_pass(x, y), torch.device("cpu")))
            cpu_theirs.append(time.process_time() - c0)
    t_ours = float(np.median([o[0] for o in ours]))
    m_ours, (r1, rauroc) = max(o[1] for o in ours), ours[0][2]
    print(
        f"\n[1] exact R@1 + R-AUROC   {t_ours:8.2f} s  peak {m_ours / 2**20:8.0f} MiB"
        f"  R@1={r1:.4f} R-AUROC={rauroc:.4f}  (median of {a.repeats})"
    )
    if have_faiss:
        t_f, m_f, r1_f = float(np.median([f[0] for f in theirs])), theirs[0][1], theirs[0][2]
        print(
            f"    faiss IndexFlatIP      {t_f:8.2f} s  peak {m_f / 2**20:8.0f} MiB  R@1={r1_f:.4f}"
        )
        each = ", ".join(f"{o[0] / f[0]:.3f}" for o, f in zip(ours, theirs))
        print(f"    ratio bayesurl / faiss = {t_ours / t_f:.3f}   (target <= 1.05; each: {each})")
        c_o, c_f = float(np.median(cpu_ours)), float(np.median(cpu_theirs))
        each = ", ".join(f"{o / f:.3f}" for o, f in zip(cpu_ours, cpu_theirs))
        print(
            f"    CPU time: bayesurl {c_o:.2f} s, faiss {c_f:.2f} s, ratio {c_o / c_f:.3f}"
            f"   (each: {each})"
        )
        load = os.getloadavg()
        print(f"    load average after: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}")
    if a.skip_pml:
        return
    t_p, m_p, r1_p = timed(lambda: pml_pass(x, y), device)
    print(f"    PML AccuracyCalculator {t_p:8.2f} s  peak {m_p / 2**20:8.0f} MiB  P@1={r1_p:.4f}")
    print(f"    ratio bayesurl / PML   = {t_ours / t_p:.3f}")
    del x, y, u

    # ---------------------------------------------------------------- sampling-aware ECE
    n_e = a.ece_n or min(a.n, fitting_points(a.draws, a.d, device))
    x, y, _ = make_data(n_e, a.d, max(n_e // 30, 2), a.seed + 1, device)
    g = torch.Generator(device=device).manual_seed(a.seed)
    samples = torch.empty(a.draws, n_e, a.d, device=device)
    for t in range(a.draws):  # draws around each embedding, relative noise `--noise`
        eps = torch.randn(n_e, a.d, generator=g, device=device) / a.d**0.5
        samples[t] = x + a.noise * eps
    mean = Fm.mean_from_samples(samples)
    u = Fm.uncertainty_from_samples(samples)
    t_pass, _, _ = timed(lambda: exact_pass(mean, y, u), device)
    info: dict[str, float] = {}
    t_ece, m_ece, res = timed(
        lambda: Fm.retrieval_ece(
            samples,
            y,
            mode=a.mode,
            block=a.block,
            shortlist=a.shortlist,
            tolerance=a.tolerance,
            info=info,
        ),
        device,
    )
    miss = info.get("miss_rate")
    print(f"\n[2] S={a.draws} draws, N={n_e}, D={a.d}, noise={a.noise}, mode={a.mode}")
    print(
        f"    shortlist L={int(info.get('shortlist', n_e - 1))}"
        + ("" if miss is None else f" (adaptive, pilot miss-rate estimate {miss:.1e})")
        + (
            f", margin {info['margin']:.3g}: {info['kept_per_query']:.1f} candidates per query"
            if "kept_per_query" in info
            else ""
        )
    )
    print(f"    one exact pass         {t_pass:8.2f} s")
    print(
        f"    sampling-aware ECE     {t_ece:8.2f} s  peak {m_ece / 2**20:8.0f} MiB"
        f"  ECE={float(res.ece):.4f}"
    )
    print(f"    ratio ECE / one pass   = {t_ece / t_pass:.3f}   (target <= 3)")
    q = torch.randperm(n_e, generator=torch.Generator().manual_seed(a.seed))[: a.agree_queries]
    t_bf, _, exact = timed(lambda: brute_force_neighbors(samples, q.to(device)), device)
    short = res.neighbors[:, q.to(device)]
    agree_lab = float((y[short] == y[exact]).double().mean())
    agree_idx = float((short == exact).double().mean())
    print(
        f"    brute force, {q.numel()} queries x {a.draws} draws {t_bf:8.2f} s"
        f"  (= {t_bf * n_e / q.numel() / t_pass:.0f} exact passes for all queries)"
    )
    print(
        f"    agreement of per-draw 1-NN labels with brute force = {100 * agree_lab:.3f} %"
        f"  (indices {100 * agree_idx:.3f} %, target >= 99.5 %)"
    )
    if a.no_shared:
        print(f"    mean confidence {float(res.confidence.mean()):.3f}")
        return
    # inside `evaluate()` the R@1 search returns the L candidates too (one kNN serves both)
    t_nn, _, (_, cand) = timed(lambda: knn(mean, int(info["shortlist"])), device)
    t_shared, _, _ = timed(
        lambda: Fm.retrieval_ece(
            samples, y, mode=a.mode, shortlist=int(info["shortlist"]), candidates=cand,
            margin=info.get("margin"),
        ),
        device,
    )  # fmt: skip
    print(
        f"    ECE given the evaluator's shared kNN {t_shared:8.2f} s  "
        f"(ratio {t_shared / t_pass:.3f}; the top-{int(info['shortlist'])} kNN itself "
        f"{t_nn / t_pass:.2f} passes)"
    )
    print(f"    mean confidence {float(res.confidence.mean()):.3f}")


def _ids_pass(x: torch.Tensor, y: torch.Tensor, u: torch.Tensor) -> tuple[float, float, Any]:
    """The evaluator's exact R@1 + R-AUROC from one ids-only search (its ``_search``)."""
    sh = Shards.local(x.shape[0])
    nb = search_shards(x, 1, sh, DEFAULT_MEMORY_BUDGET, None, exact_values=False)[1][:, 0]
    correct = y[nb] == y
    return float(correct.double().mean()), float(Fm.r_auroc(u, correct)), nb


def _faiss_ids(x: torch.Tensor, y: torch.Tensor) -> tuple[float, Any]:
    import faiss

    xn = x.cpu().numpy()
    index = faiss.IndexFlatIP(xn.shape[1])
    index.add(xn)
    _, idx = index.search(xn, 2)
    own = idx[:, 0] == np.arange(len(xn))
    nn = torch.from_numpy(np.where(own, idx[:, 1], idx[:, 0])).long()
    return float((y[nn] == y).double().mean()), nn


def _alternate(
    runs: dict[str, Callable[[], Any]], repeats: int
) -> dict[str, tuple[list[float], list[float], Any]]:
    """Wall and CPU times of every run, ``repeats`` rounds, the order rotated each round."""
    out: dict[str, tuple[list[float], list[float], Any]] = {n: ([], [], None) for n in runs}
    names = list(runs)
    for rep in range(repeats):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            c0, t0 = time.process_time(), time.perf_counter()
            res = runs[name]()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            out[name][0].append(wall)
            out[name][1].append(cpu)
            if out[name][2] is None:
                out[name] = (out[name][0], out[name][1], res)
    return out


def _med(v: list[float]) -> float:
    return float(np.median(v))


def precision_main(a: argparse.Namespace) -> None:
    """``--precision``: the bfloat16 candidate pass against the float32 path and faiss."""
    try:
        import faiss
    except ImportError:
        faiss = None
    precision, reason = search_precision("cpu")
    load = os.getloadavg()
    print(
        f"N={a.n} D={a.d} repeats={a.repeats} (alternating, order rotated) "
        f"torch={torch.__version__}"
        f" cpus={os.cpu_count()} load={load[0]:.2f},{load[1]:.2f},{load[2]:.2f} "
        f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}\n"
        f"candidate pass chosen: {precision} ({reason}); torch CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}"
    )
    for line in blas_report():
        print(f"  BLAS {line}")
    r_torch, r_numpy = product_rates(a.d)
    xb, yb = torch.randn(4096, a.d).bfloat16(), torch.randn(a.d, 1024).bfloat16()
    c0 = time.process_time()
    for _ in range(5):
        torch.mm(xb, yb)
    r_bf16 = 5 * 2 * 4096 * 1024 * a.d / (time.process_time() - c0) / 1e9
    print(
        f"  one [4096, {a.d}] @ [{a.d}, 1024] tile: float32 torch.mm {r_torch:.0f}, numpy's BLAS "
        f"{r_numpy:.0f}, bfloat16 torch.mm {r_bf16:.0f} GFLOP/s (CPU time)"
    )
    x, y, u = make_data(a.n, a.d, max(a.n // 30, 2), a.seed, torch.device("cpu"))
    threads_list = [1, 2] if a.threads is None else [a.threads]
    cpu_at: dict[str, dict[int, float]] = {}
    for threads in threads_list:
        torch.set_num_threads(threads)
        runs: dict[str, Callable[[], Any]] = {}
        for name, flag in (("bfloat16", True), ("float32", False)):
            runs[name] = lambda flag=flag: _with_precision(flag, lambda: _ids_pass(x, y, u))
        if faiss is not None:
            faiss.omp_set_num_threads(threads)
            runs["faiss"] = lambda: _faiss_ids(x, y)
        _ids_pass(x[:512], y[:512], u[:512])
        search_stats(reset=True)
        res = _alternate(runs, a.repeats)
        stats = search_stats(reset=True)
        print(f"\n[threads={threads}] exact R@1 + R-AUROC, N={a.n}, D={a.d}")
        for name, (walls, cpus, _) in res.items():
            cpu_at.setdefault(name, {})[threads] = _med(cpus)
            each = ", ".join(f"{w:.1f}/{c:.1f}" for w, c in zip(walls, cpus))
            print(
                f"  {name:9s} wall {_med(walls):7.2f} s  CPU {_med(cpus):7.2f} s  "
                f"(each wall/CPU: {each})"
            )
        nb16, nb32 = res["bfloat16"][2][2], res["float32"][2][2]
        r16, r32 = res["bfloat16"][2][:2], res["float32"][2][:2]
        print(
            f"  R@1 / R-AUROC bfloat16 {r16[0]:.6f} / {r16[1]:.6f}, float32 {r32[0]:.6f} / "
            f"{r32[1]:.6f}; neighbours identical: {bool(torch.equal(nb16, nb32))}"
        )
        print(
            f"  candidate pass: {stats['certified']} rows certified, {stats['fallback']} fell "
            f"back, {stats['candidates'] / max(stats['lowp_queries'], 1):.2f} candidates per row"
        )
        if faiss is not None:
            nbf = res["faiss"][2][1]
            print(
                f"  neighbours identical to faiss: {bool(torch.equal(nb16, nbf))} "
                f"({int((nb16 != nbf).sum())} differ)"
            )
            wf, cf = _med(res["faiss"][0]), _med(res["faiss"][1])
            for name in ("bfloat16", "float32"):
                w, c = _med(res[name][0]), _med(res[name][1])
                print(f"  {name} / faiss: wall {w / wf:.3f}, CPU {c / cf:.3f}")
        w16, w32 = _med(res["bfloat16"][0]), _med(res["float32"][0])
        c16, c32 = _med(res["bfloat16"][1]), _med(res["float32"][1])
        print(f"  bfloat16 / float32: wall {w16 / w32:.3f}, CPU {c16 / c32:.3f}")
    if len(threads_list) == 2:
        print(
            "\nCPU time at 2 threads / 1 thread: "
            + ", ".join(f"{n} {v[2] / v[1]:.3f}" for n, v in cpu_at.items())
        )
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}")
    # -------------------------------------------------- the 1,280-d feature search
    torch.set_num_threads(threads_list[-1])
    n_f = a.feat_n
    xf, yf, uf = make_data(n_f, 1280, max(n_f // 30, 2), a.seed + 2, torch.device("cpu"))
    runs = {
        name: (lambda flag=flag: _with_precision(flag, lambda: _ids_pass(xf, yf, uf)))
        for name, flag in (("bfloat16", True), ("float32", False))
    }
    res = _alternate(runs, a.repeats)
    print(f"\n[features] exact R@1 + R-AUROC, N={n_f}, D=1280, threads={threads_list[-1]}")
    for name, (walls, cpus, _) in res.items():
        print(f"  {name:9s} wall {_med(walls):7.2f} s  CPU {_med(cpus):7.2f} s")
    print(
        f"  bfloat16 / float32: wall {_med(res['bfloat16'][0]) / _med(res['float32'][0]):.3f}, "
        f"CPU {_med(res['bfloat16'][1]) / _med(res['float32'][1]):.3f}; neighbours identical: "
        f"{bool(torch.equal(res['bfloat16'][2][2], res['float32'][2][2]))}"
    )
    # -------------------------------------------------- sampled ECE (HET-XL's shapes)
    n_e, d_e, s_e = a.ece_n or 35_000, 64, 10
    xe, ye, _ = make_data(n_e, d_e, max(n_e // 30, 2), a.seed + 3, torch.device("cpu"))
    g = torch.Generator().manual_seed(a.seed)
    samples = xe + a.noise * torch.randn(s_e, n_e, d_e, generator=g) / d_e**0.5
    infos: dict[str, dict[str, float]] = {}

    def ece(flag: bool) -> Any:
        info: dict[str, float] = {}
        out = _with_precision(flag, lambda: Fm.retrieval_ece(samples, ye, info=info))
        infos[str(flag)] = info
        return out

    runs = {"bfloat16": lambda: ece(True), "float32": lambda: ece(False)}
    res = _alternate(runs, a.repeats)
    info = infos["True"]
    print(
        f"\n[sampled ECE] S={s_e} draws, N={n_e}, D={d_e} (HET-XL's shapes in the pretrained "
        f"protocol), noise {a.noise}, threads={threads_list[-1]}: shortlist miss-rate "
        f"{info.get('miss_rate', float('nan')):.3g}, exact per-draw fallback "
        f"{bool(info.get('fallback_exact'))}"
    )
    for name, (walls, cpus, _) in res.items():
        print(f"  {name:9s} wall {_med(walls):7.2f} s  CPU {_med(cpus):7.2f} s")
    e16, e32 = res["bfloat16"][2], res["float32"][2]
    print(
        f"  bfloat16 / float32: wall {_med(res['bfloat16'][0]) / _med(res['float32'][0]):.3f}, "
        f"CPU {_med(res['bfloat16'][1]) / _med(res['float32'][1]):.3f}; ECE {float(e16.ece):.6f} "
        f"vs {float(e32.ece):.6f}, per-draw neighbours identical: "
        f"{bool(torch.equal(e16.neighbors, e32.neighbors))}"
    )
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (shared machine)")


def _with_precision(flag: bool, fn: Callable[[], Any]) -> Any:
    with low_precision(flag):
        return fn()


#: neighbours of the one search of ``bayesurl evaluate`` with its default ``--ks 1 5 10``
K_SEARCH = 10


def blas_workspace(rows: int, cols: int, d: int) -> int:
    """Bytes the BLAS keeps for itself in one ``[rows, d] @ [d, cols]`` float32 product
    (MKL's packing buffers), measured in this process: RssAnon after the product minus before,
    with the output's pages already touched. Call it before any other matrix product."""

    def anon() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon"):
                    return int(line.split()[1]) * 1024
        return 0

    a, b = torch.randn(rows, d), torch.randn(d, cols)
    out = torch.zeros(rows, cols)
    before = anon()
    torch.mm(a, b, out=out)
    return max(0, anon() - before)


def block_shape(n: int, d: int, world: int) -> tuple[int, int, int]:
    """A rank's rows ``n_r`` and the ``[rows, n_c]`` similarity block of ``bayesurl evaluate``
    on a float32 npz under ``world`` ranks: one process searches the whole gallery, a rank the
    other ranks' ring chunks of ``RING_CHUNK_BYTES`` (its own shard whole: a block of the same
    size), within the rank's share of ``DEFAULT_MEMORY_BUDGET``."""
    from bayesurl.distributed import RING_CHUNK_BYTES, Shards
    from bayesurl.search.core import DEFAULT_MEMORY_BUDGET, chunk_rows, rank_budget

    n_r = -(-n // world)
    n_c = n if world == 1 else min(max(1, RING_CHUNK_BYTES // (d * 4)), n_r)
    budget = rank_budget(DEFAULT_MEMORY_BUDGET, Shards((1,) * world))
    return n_r, min(chunk_rows(n_c, torch.float32, budget), n_r), n_c


def memory_bound(n: int, d: int, world: int, k: int = K_SEARCH, blas: int = 0) -> dict[str, int]:
    """Bytes a rank of ``bayesurl evaluate`` (float32 npz, W ranks) holds at its peak, the
    exact search's inner loop, term by term (every term but the BLAS's own
    workspace shrinks with W):

    - its shard of the embeddings (normalised in place: ``evaluate(copy=False)``);
    - the ring's two receive buffers of at most ``RING_CHUNK_BYTES`` (W > 1);
    - the similarity block ``[B, n_c]`` of one gallery chunk of ``n_c`` rows, within the
      rank's share ``DEFAULT_MEMORY_BUDGET / W`` (two buffers counted, one used; the second
      pass's window block is allocated after it is freed and is no larger);
    - the BLAS's packing workspace (measured, :func:`blas_workspace`);
    - the running top-(k+1) (float32 similarities + int64 ids) and the labels (int64) and
      uncertainties (float32) of its queries;
    - temporaries: the finite check's block, one query block's top-k merge and the second
      pass's per-candidate arrays (float64 values, ids, masks: about 34 bytes each).

    Not counted: memory glibc keeps after freeing temporaries (printed as the remainder) and
    library code paged in on first use (file-backed, printed apart).
    """
    from bayesurl._checks import FINITE_BLOCK
    from bayesurl.distributed import RING_CHUNK_BYTES

    n_r, rows, n_c = block_shape(n, d, world)
    shard = n_r * d * 4
    terms = {"shard": shard}
    if world > 1:
        terms["ring buffers"] = 2 * min(RING_CHUNK_BYTES, n_c * d * 4)
    terms["similarity block"] = rows * n_c * 4
    if blas:
        terms["BLAS workspace"] = blas
    terms["top-k, labels, u"] = n_r * ((k + 1) * 12 + 12)
    # short-lived: the finite check's block (abs copy + two masks), one query block's
    # top-(k+2), re-sort and merge with the running top-(k+1) (about 100 bytes per row and
    # k), and the second pass's float64 values, ids and masks per candidate
    terms["temporaries"] = FINITE_BLOCK * 6 + rows * (k + 1) * 100 + n_r * (k + 1) * 34
    return terms


def distributed_main(a: argparse.Namespace) -> None:
    """``bayesurl evaluate`` on one process vs ``torchrun --nproc_per_node W``."""
    import json
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    w, threads = a.distributed, a.threads or 1
    if w < 2:
        raise SystemExit("--distributed needs W >= 2")
    load = os.getloadavg()
    print(
        f"bayesurl evaluate: 1 process vs {w} ranks (gloo), {threads} thread(s) per process, "
        f"N={a.n} D={a.d} S={a.ece_draws} torch={torch.__version__} cpus={os.cpu_count()} "
        f"load={load[0]:.2f},{load[1]:.2f},{load[2]:.2f}"
    )
    torch.set_num_threads(threads)
    # the BLAS workspace, measured here on a rank's block shape (allocated once per process
    # and reused, so one measurement; the same size for the 1-process block)
    _, rows, n_c = block_shape(a.n, a.d, w)
    blas = blas_workspace(rows, n_c, a.d)
    print(
        f"  BLAS workspace of one [{rows}, {a.d}] @ [{a.d}, {n_c}] product: "
        f"{blas / 2**20:.1f} MiB (measured in this process)"
    )
    root = Path(tempfile.mkdtemp(prefix="bayesurl_dist_bench_"))
    x, y, u = make_data(a.n, a.d, max(a.n // 30, 2), a.seed, torch.device("cpu"))
    arrays = {"embeddings": x.numpy(), "labels": y.numpy(), "uncertainties": u.numpy()}
    if a.ece_draws:
        g = torch.Generator().manual_seed(a.seed)
        eps = torch.randn(a.ece_draws, a.n, a.d, generator=g) / a.d**0.5
        arrays["samples"] = (x + a.noise * eps).numpy()
        del arrays["uncertainties"]  # 1/kappa_hat from the draws
    npz = root / "x.npz"
    np.savez(npz, **arrays)
    del x, y, u, arrays
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env.pop("WORLD_SIZE", None)
    wrapper = str(Path(__file__).with_name("_rss_cli.py"))
    extra = ["--ece-mode", "shortlist"] if a.ece_draws else []
    launchers = {
        "one": [],
        "torchrun": ["-m", "torch.distributed.run", "--nproc_per_node", str(w)],
        "fork": [],
    }

    def command(how: str, out: Path, instrumented: bool) -> list[str]:
        cli = [wrapper] if instrumented else ["-m", "bayesurl"]
        args = ["evaluate", str(npz), "--json", str(out), *extra]
        if how == "fork":
            args += ["--nproc-per-node", str(w)]
        return [sys.executable, *launchers[how], *cli, *args]

    def timed_run(how: str, tag: str) -> tuple[float, dict[str, Any]]:
        """The plain command (no memory sampling), wall time from start to exit."""
        out = root / f"{tag}.json"
        t0 = time.perf_counter()
        subprocess.run(command(how, out, False), env=env, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - t0, json.loads(out.read_text())

    def measured_run(how: str) -> list[dict[str, Any]]:
        """The command under ``_rss_cli.py``: per-rank peak memory, time and CPU after the
        imports (the sampling thread costs CPU, so these runs are not the timed ones)."""
        rss = root / f"rss_{how}"
        rss.mkdir(exist_ok=True)
        phases = {"BAYESURL_RSS_PHASES": "1"} if a.phases and how == "fork" else {}
        subprocess.run(
            command(how, root / f"m_{how}.json", True),
            env={**env, "BAYESURL_RSS_DIR": str(rss), **phases},
            check=True,
            stdout=subprocess.DEVNULL,
        )
        ranks = 1 if how == "one" else w
        return [json.loads((rss / f"rank{r}.json").read_text()) for r in range(ranks)]

    times: dict[str, list[float]] = {h: [] for h in launchers}
    results: dict[str, dict[str, Any]] = {}
    for i in range(a.repeats):  # alternate, rotating the order: the machine drifts
        order = list(launchers)[i % 3 :] + list(launchers)[: i % 3]
        for how in order:
            dt, res = timed_run(how, f"{how}{i}")
            times[how].append(dt)
            results.setdefault(how, res)
    med = {h: float(np.median(v)) for h, v in times.items()}
    print("  whole command, plain `bayesurl evaluate` (no memory sampling), median of repeats:")
    labels = {
        "one": "1 process",
        "torchrun": f"torchrun --nproc_per_node {w}",
        "fork": f"--nproc-per-node {w} (forked)",
    }
    for how in launchers:
        each = ", ".join(f"{t:.2f}" for t in times[how])
        print(f"    {labels[how]:<30} {med[how]:8.2f} s   (each: {each})")
    for how in ("fork", "torchrun"):
        print(
            f"  ratio {labels[how]} / 1 process = {med[how] / med['one']:.3f}   "
            f"(target <= 0.6 for W = 2)"
        )
    mem = {how: measured_run(how) for how in ("one", "fork", "torchrun")}
    i1, c1 = mem["one"][0]["seconds"], mem["one"][0]["cpu"]
    for how in ("fork", "torchrun"):
        iw = max(r["seconds"] for r in mem[how])
        cw = max(r["cpu"] for r in mem[how])
        print(
            f"  instrumented run, after the imports: 1 process {i1:.2f} s ({c1:.2f} s CPU), "
            f"slowest of {w} ranks ({how}) {iw:.2f} s (busiest {cw:.2f} s CPU): ratio "
            f"{iw / i1:.3f} (CPU {cw / c1:.3f})"
        )
    emb = a.n * a.d * 4
    print(f"  embeddings N x D float32 {emb / 2**20:.1f} MiB")
    print(
        "  peak memory above the post-import baseline (RssAnon: the process's own data; the "
        "file-backed part is library code paged in on first use, shared, independent of N):"
    )
    rows_mem = [("1 process", 1, mem["one"][0])]
    rows_mem += [(f"{w} ranks (fork), rank {r}", w, m) for r, m in enumerate(mem["fork"])]
    rows_mem += [(f"{w} ranks (torchrun), rank {r}", w, m) for r, m in enumerate(mem["torchrun"])]
    for label, ranks, m in rows_mem:
        terms = memory_bound(a.n, a.d, ranks, blas=blas)
        bound = sum(terms.values())
        anon = m["anon_peak"] - m["anon_base"]
        print(
            f"  {label}: anon {anon / 2**20:6.1f} MiB <= bound {bound / 2**20:6.1f} MiB? "
            f"{'yes' if anon <= bound else 'NO'} (remainder {(anon - bound) / 2**20:+.1f}); "
            f"file-backed +{(m['file_peak'] - m['file_base']) / 2**20:.1f} MiB; "
            f"total RSS {(m['peak'] - m['base']) / 2**20:6.1f} MiB "
            f"(baseline {m['base'] / 2**20:.0f} MiB)"
        )
    for ranks in (1, w):
        terms = memory_bound(a.n, a.d, ranks, blas=blas)
        print(
            f"  bound, {ranks} rank(s): "
            + " + ".join(f"{name} {v / 2**20:.1f}" for name, v in terms.items())
            + f" = {sum(terms.values()) / 2**20:.1f} MiB"
        )
    phases = mem["fork"][0].get("phases")
    if phases:
        print("  rank 0 phases (RSS / anon / file-backed MiB above the baseline):")
        for name, *v in phases:
            print(f"    {name:<18}" + " ".join(f"{x:7.1f}" for x in v))
    ref = results["one"]
    for how in ("fork", "torchrun"):
        got = results[how]
        diffs = [
            abs(float(ref[k]) - float(got[k]))
            for k in ref
            if isinstance(ref[k], (int, float)) and isinstance(got.get(k), (int, float))
        ]
        same = all(ref[k] == got.get(k) for k in ref if k != "notes")
        print(f"  {labels[how]}: largest metric difference {max(diffs):.3g} (identical: {same})")
    print(f"  R@1 {ref['r@1']:.4f} R-AUROC {ref['r_auroc']:.4f} ECE {ref['ece']}")


if __name__ == "__main__":
    main()
