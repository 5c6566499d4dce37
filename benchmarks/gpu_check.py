"""The GPU road end to end, in one command: every road a user takes, on CUDA, against the CPU
run of the same seed, and the exact pass's time against the bf16 GEMM's.

Each road goes through the library's own entry points (``bayesurl.cli.main``, the commands a
user types; ``torchrun -m bayesurl`` for the sharded one), in this process, so that its peak
GPU memory can be read:

==========================  ==============================================================
road                        what runs
==========================  ==============================================================
exact pass N=...            ``evaluate(..., include=["r@1", "r_auroc"])`` on clustered unit
                            rows (D = 512): the fused pass (automatic on CUDA), the unfused
                            bf16 candidate pass, the float32 path (N = 200k only), a bare
                            ``torch.mm`` + ``topk`` and the bf16 GEMM alone; the kernel's
                            block configurations at the first N
benchmark pretrained_quick  ``bayesurl benchmark --preset pretrained_quick`` (every estimator)
train amp=bf16 / amp=off    ``bayesurl benchmark --preset smoke`` of the twelve methods and
                            LAM post-hoc / online, ``--set train.amp=bf16`` / ``off``
train checkpoint            ``bayesurl train --method ce`` (the checkpoint ``wrap`` reads)
wrap NAME                   ``bayesurl wrap`` with every wrapper registered in
                            ``bayesurl.posthoc`` when the check runs
folder                      ``bayesurl folder`` on 200 labelled images (scikit-learn digits)
report                      ``bayesurl report`` of the benchmark's folder
sampled ECE S=100           ``bayesurl evaluate`` of draws ``[S, N, D]`` (the ECE's road)
torchrun 2 ranks            ``torchrun --nproc_per_node 2 -m bayesurl evaluate``: NCCL with two
                            GPUs, gloo when both ranks share one (NCCL refuses that)
==========================  ==============================================================

Columns of the table: ``status`` (ran / failed: its one-line reason / skipped), wall time,
peak GPU memory (``torch.cuda.max_memory_allocated``, reset before each road; ``-`` on CPU
and for separate processes), and the agreement with the CPU run of the same seed, which a
second process (``--reference-worker``) computes at the same time on the CPU cores:

- roads that evaluate the same inputs (exact pass, sampled ECE, torchrun): the neighbours
  equal (exact pass: those of a random sample of 2,000 queries, searched on the CPU) and
  every metric within ``EVAL_TOL`` = 1e-9;
- roads that train: a GPU run and a CPU run of one seed are not the same bits (other kernels,
  TF32 convolutions, bf16 autocast), they differ like two seeds; they agree when R@1 and
  R-AUROC lie within ``3 sqrt(0.5 / n)`` of the CPU run's (n test queries; three standard
  errors of a difference of two proportions): a check that the road computes the same thing,
  not of the bits;
- ``wrap``: the u of the GPU-fitted wrapper and of the CPU-fitted one (the same checkpoint) on
  the same images, Spearman correlation >= 0.9 (laplace, fitted in closed form: >= 0.999);
- ``folder``: the share of equal nearest neighbours (>= 0.98) and the trained tolerance.

Usage on a GPU machine (about 6 minutes on one H200; docs/concepts/metrics.rst, "The exact
search on a GPU", says how to carry what that machine lacks)::

    python benchmarks/gpu_check.py                        # writes results/benchmarks/gpu_check.txt
    python benchmarks/gpu_check.py --device cpu --dry-run # small sizes: gpu_check_dry_run.txt

``--dry-run`` shrinks every size (the test suite runs it, so the script cannot rot); with
``--device cpu`` both sides run on the CPU. ``--only`` selects roads by name prefix.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: metric keys compared between the GPU run and the CPU run
METRICS = ("r@1", "r_auroc", "ausc", "ece", "ood_auroc")
#: roads that evaluate the same inputs: every metric within this of the CPU run
EVAL_TOL = 1e-9
#: the registry methods and the LAM fits of the training roads (bayesurl/runs/recipes)
TRAINED = (
    "ce", "infonce", "mcinfonce", "elk", "nivmf", "hib", "hetxl", "sngp", "losspred",
    "ensemble", "mcdropout", "tau", "lam_posthoc", "lam_online",
)  # fmt: skip
#: H200 / H100 SXM dense bf16 rate by the datasheet (FLOP/s); the measured rate is printed too
DATASHEET_BF16 = {"H200": 989e12, "H100": 989e12}


@dataclass
class Sizes:
    """Every size of the check; ``--dry-run`` shrinks them."""

    exact_n: tuple[int, ...] = (200_000, 1_000_000)
    exact_d: int = 512
    fp32_max_n: int = 200_000  # the float32 path's time above this is minutes
    sample_queries: int = 2000
    repeats: int = 3
    bench_preset: str = "pretrained_quick"
    bench_methods: str | None = None
    train_preset: str = "smoke"
    train_sets: tuple[str, ...] = ()
    train_methods: tuple[str, ...] = TRAINED
    folder_args: tuple[str, ...] = ()
    ckpt_subset: int = 1000
    wrap_subset: int = 1000
    folder_images: int = 200
    ece_n: int = 5000
    ece_d: int = 64
    ece_s: int = 100
    torchrun_n: int = 50_000
    torchrun_d: int = 128
    fused_configs: tuple[tuple[int, ...], ...] = (
        (8, 128, 128, 64, 8, 3),
        (8, 128, 256, 64, 8, 3),
        (4, 128, 128, 64, 8, 3),
        (8, 64, 128, 64, 4, 3),
    )


DRY = Sizes(
    exact_n=(200, 300),
    exact_d=128,
    fp32_max_n=200,
    sample_queries=100,
    repeats=0,
    bench_preset="pretrained_smoke",
    bench_methods="ce,pvu",
    train_sets=(
        "data.max_train=40",
        "data.max_test=40",
        "data.max_ood=16",
        "train.batch_size=20",
        "eval.samples=2",
    ),  # fmt: skip
    # a registry method, one that samples, a LAM fit: the road, not every method again
    train_methods=("ce", "mcdropout", "lam_online"),
    folder_args=("--image-size", "64"),
    ckpt_subset=60,
    wrap_subset=60,
    folder_images=40,
    ece_n=300,
    ece_d=16,
    ece_s=6,
    torchrun_n=400,
    torchrun_d=16,
    fused_configs=((8, 64, 256, 128, 4, 1),),
)


@dataclass
class Row:
    """One line of the table."""

    road: str
    status: str = "ran"
    reason: str = ""
    wall: float | None = None
    peak_mib: float | None = None
    agreement: str = ""
    agrees: bool | None = None
    note: str = ""
    data: dict[str, Any] = field(default_factory=dict)


class Check:
    """Runs the roads in order, each guarded, and collects the rows."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.sizes = DRY if args.dry_run else Sizes()
        self.work = Path(args.work)
        self.rows: list[Row] = []
        self.t0 = time.perf_counter()
        self.ref_dir = self.work / "reference"
        self.partial: Path | None = None

    # ------------------------------------------------------------------ helpers
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def log_path(self, name: str) -> Path:
        p = self.work / "logs" / (name.replace(" ", "_").replace("/", "_") + ".log")
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def road(self, name: str, fn: Callable[[Row], None]) -> Row:
        """Run ``fn(row)`` as one road: wall time, peak GPU memory, failures kept."""
        row = Row(name)
        if self.args.only and not any(name.startswith(o) for o in self.args.only):
            return row
        if self.elapsed() > self.args.budget_s:
            row.status, row.reason = "skipped", f"time budget ({self.args.budget_s:.0f} s) spent"
            self.rows.append(row)
            return row
        print(f"[{self.elapsed():6.1f} s] {name} ...", flush=True)
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        t = time.perf_counter()
        try:
            fn(row)
        except Exception as exc:  # the check goes on past a failing road
            row.status, row.reason = "failed", _one_line(exc)
            with open(self.log_path(name), "a") as fh:
                traceback.print_exc(file=fh)
        if self.cuda:
            torch.cuda.synchronize(self.device)
            row.peak_mib = torch.cuda.max_memory_allocated(self.device) / 2**20
        row.wall = time.perf_counter() - t
        self.rows.append(row)
        print(f"           {row.status} {row.reason}".rstrip(), flush=True)
        if self.partial is not None:  # a killed run still leaves the roads done so far
            self.partial.write_text(table(self) + "\n# (partial: the check was still running)\n")
        return row

    def cli(self, name: str, argv: list[str]) -> None:
        """``bayesurl ARGV`` in this process, its output to the road's log; raises on a
        non-zero status with the command's last error line."""
        from bayesurl.cli import main

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else 2
        text = buf.getvalue()
        with open(self.log_path(name), "a") as fh:
            fh.write(f"$ bayesurl {' '.join(argv)}\n{text}\n(exit {rc})\n")
        if rc:
            errors = [ln for ln in text.splitlines() if "error" in ln.lower() or "FAILED" in ln]
            raise RuntimeError(
                f"exit {rc}: {errors[-1].strip() if errors else text.strip()[-200:]}"
            )

    def dev(self) -> str:
        return str(self.device)

    def reference(self, key: str, wait: float) -> dict[str, Any] | None:
        """The CPU run ``key`` of the reference worker (waits up to ``wait`` s for it)."""
        p = self.ref_dir / f"{key}.json"
        end = time.perf_counter() + wait
        while not p.exists() and time.perf_counter() < end:
            time.sleep(0.5)
        return json.loads(p.read_text()) if p.exists() else None


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def _trained_tol(n: int) -> float:
    return 3 * math.sqrt(0.5 / max(n, 1))


def _compare_metrics(
    got: dict[str, Any], ref: dict[str, Any], tol: float, keys: tuple[str, ...] = METRICS
) -> tuple[bool, str]:
    """Whether every metric both runs have lies within ``tol``; the largest |difference|."""
    worst, worst_key, ok = 0.0, "", True
    for k in keys:
        a, b = got.get(k), ref.get(k)
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            continue
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            continue
        d = abs(float(a) - float(b))
        if d > worst or not worst_key:
            worst, worst_key = d, k
        ok &= d <= tol
    if not worst_key:
        return False, "no metric to compare"
    return ok, f"max |d| {worst:.2g} ({worst_key}), tol {tol:.2g}"


# ---------------------------------------------------------------------- shared inputs


def clustered(n: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unit rows in clusters of about 30 (benchmarks/evaluator_gpu.py), labels, u (CPU)."""
    from evaluator_gpu import make_data

    x = make_data(n, d, seed, torch.device("cpu"))
    g = torch.Generator().manual_seed(seed + 1)
    y = torch.randint(0, max(n // 300, 2), (n,), generator=g)
    u = torch.rand(n, generator=g)
    return x, y, u


def sample_queries(n: int, count: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(7))[: min(count, n)]


def write_inputs(work: Path, sizes: Sizes) -> None:
    """The files both sides read: the ECE draws, the torchrun embeddings, the image folder."""
    g = torch.Generator().manual_seed(3)
    n, d, s = sizes.ece_n, sizes.ece_d, sizes.ece_s
    centers = torch.randn(20, d, generator=g)
    y = torch.randint(0, 20, (n,), generator=g)
    mean = centers[y] + 1.5 * torch.randn(n, d, generator=g)
    spread = 0.2 + torch.rand(n, 1, generator=g)
    draws = mean[None] + spread[None] * torch.randn(s, n, d, generator=g)
    np.savez(
        work / "ece.npz",
        embeddings=mean.numpy(),
        labels=y.numpy(),
        uncertainties=spread[:, 0].numpy(),
        samples=draws.numpy(),
    )
    n, d = sizes.torchrun_n, sizes.torchrun_d
    x, y, u = clustered(n, d, 5)
    np.savez(work / "eval.npz", embeddings=x.numpy(), labels=y.numpy(), uncertainties=u.numpy())
    folder_images(work / "images", sizes.folder_images)


def folder_images(root: Path, count: int) -> None:
    """``count`` scikit-learn digits as 32 x 32 PNGs in one sub-folder per class."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for i in range(count):
        img = (digits.images[i] * (255 / 16)).astype(np.uint8)
        cls = root / str(int(digits.target[i]))
        cls.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).resize((32, 32), Image.NEAREST).convert("RGB").save(cls / f"{i}.png")


def weights_present() -> bool:
    """Whether the packaged EfficientNet-Lite0 weights can be read here."""
    try:
        from bayesurl.backbones import packaged_weights_path

        return Path(packaged_weights_path("efficientnet_lite0")).is_file()
    except Exception:
        return False


def data_args(args: argparse.Namespace) -> list[str]:
    return ["--set", f"data.root={args.data_root}"] if args.data_root else []


def bench_argv(args: argparse.Namespace, sizes: Sizes, device: str, out: Path) -> list[str]:
    argv = ["benchmark", "--preset", sizes.bench_preset, "--device", device, "--no-progress"]
    argv += ["--out", str(out), "--set", f"backbone.cache={Path(args.work) / 'features'}"]
    if sizes.bench_methods:
        argv += ["--methods", sizes.bench_methods]
    if not weights_present():
        argv += ["--set", "backbone.pretrained=false"]
    return argv + data_args(args) + [a for s in sizes.train_sets for a in ("--set", s)]


def train_argv(args: argparse.Namespace, sizes: Sizes, device: str, amp: str, out: Path):
    argv = ["benchmark", "--preset", sizes.train_preset, "--device", device, "--no-progress"]
    methods = ",".join(sizes.train_methods)
    argv += ["--methods", methods, "--out", str(out), "--set", f"train.amp={amp}"]
    return argv + data_args(args) + [a for s in sizes.train_sets for a in ("--set", s)]


def wrap_argv(args, sizes: Sizes, name: str, ckpt: Path, device: str, out: Path) -> list[str]:
    argv = ["wrap", str(ckpt), "--method", name, "--device", device, "--out", str(out)]
    argv += ["--subset", str(sizes.wrap_subset), "--epochs", "1", "--no-progress"]
    return argv + (["--root", args.data_root] if args.data_root else [])


def folder_argv(work: Path, sizes: Sizes, device: str, out: Path) -> list[str]:
    argv = ["folder", str(work / "images"), "--out", str(out), "--device", device]
    argv += ["--epochs", "1", "--no-progress", "--seed", "0", *sizes.folder_args]
    if not weights_present():
        argv += ["--random-weights"]
    return argv


def cli_runs(check: Check, name: str, argv: list[str], folder: Path) -> None:
    """A ``benchmark`` command: a failing estimator is recorded in ``results.json`` (exit 1)
    and reported in its row; no ``results.json`` at all fails the road."""
    try:
        check.cli(name, argv)
    except RuntimeError:
        if not (folder / "results.json").exists():
            raise


def bench_runs(folder: Path) -> dict[str, dict[str, Any]]:
    from bayesurl.sweeps import read_results

    runs = read_results(folder, detail=False)["runs"]
    return {r["estimator"]: r for r in runs}


def wrapper_u(path: Path, ckpt: Path, images: torch.Tensor) -> torch.Tensor:
    """u of a saved wrapper on ``images``, on the CPU."""
    import bayesurl.posthoc as P
    from bayesurl.training import load_method_from_checkpoint

    method = load_method_from_checkpoint(str(ckpt), map_location="cpu")
    wrapped = P.load(str(path), method).eval()
    with torch.no_grad():
        return wrapped(images).uncertainty.double().flatten()


def probe_images(n: int, root: str | None) -> torch.Tensor:
    """Fixed 28 x 28 inputs for comparing two wrappers' u."""
    from bayesurl.data import default_zero_shot

    data = default_zero_shot(root, seed=0)
    return torch.stack([data.test[i][0] for i in range(n)]).float()


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a.numpy(), b.numpy()).statistic)


# ---------------------------------------------------------------------- the CPU side


def reference_worker(args: argparse.Namespace) -> int:
    """The CPU runs of every road, each written to ``WORK/reference/<key>.json`` when done."""
    sizes = DRY if args.dry_run else Sizes()
    work = Path(args.work)
    out = work / "reference"
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(max(1, args.reference_threads))
    check = Check(args)
    check.device, check.cuda = torch.device("cpu"), False

    def save(key: str, payload: dict[str, Any]) -> None:
        tmp = out / f".{key}.tmp"
        tmp.write_text(json.dumps(payload))
        tmp.replace(out / f"{key}.json")

    def guarded(key: str, fn: Callable[[], dict[str, Any]]) -> None:
        try:
            save(key, fn())
        except Exception as exc:
            save(key, {"error": _one_line(exc)})
            with open(check.log_path("reference_" + key), "a") as fh:
                traceback.print_exc(file=fh)

    def exact() -> dict[str, Any]:
        from bayesurl.distributed import Shards
        from bayesurl.search import normalize
        from bayesurl.search.exact import search

        res = {}
        for n in sizes.exact_n:
            x, _, _ = clustered(n, sizes.exact_d, 0)
            q = sample_queries(n, sizes.sample_queries)
            xn = normalize(x)
            sh = Shards.local(n)
            ids = search(xn[q], lambda xn=xn: [(0, xn)], 1, 2**28, None, q, sh, False)[1][:, 0]
            res[str(n)] = ids.tolist()
        return res

    def bench() -> dict[str, Any]:
        folder = work / "bench_cpu"
        cli_runs(check, "reference_bench", bench_argv(args, sizes, "cpu", folder), folder)
        return bench_runs(folder)

    def train() -> dict[str, Any]:
        folder = work / "train_cpu"
        cli_runs(check, "reference_train", train_argv(args, sizes, "cpu", "off", folder), folder)
        return bench_runs(folder)

    def folder_run() -> dict[str, Any]:
        folder = work / "folder_cpu"
        check.cli("reference_folder", folder_argv(work, sizes, "cpu", folder))
        return {"json": json.loads((folder / "folder.json").read_text())}

    def evaluate(npz: str) -> Callable[[], dict[str, Any]]:
        def fn() -> dict[str, Any]:
            js = work / f"{npz}_cpu.json"
            check.cli("reference_" + npz, ["evaluate", str(work / f"{npz}.npz"), "--json", str(js)])
            return json.loads(js.read_text())

        return fn

    for key, road, fn in (
        ("exact", "exact pass", exact),
        ("ece", "sampled ECE", evaluate("ece")),
        ("eval", "torchrun", evaluate("eval")),
        ("train", "train amp", train),
        ("folder", "folder", folder_run),
        ("bench", "benchmark", bench),
    ):
        if not args.only or any(road.startswith(o) or o.startswith(road) for o in args.only):
            guarded(key, fn)
    # the wrappers: fitted here on the GPU road's checkpoint, once it exists
    ckpt = work / "ckpt" / "last.pt"
    end = time.perf_counter() + args.budget_s
    while not (work / "ckpt.done").exists() and time.perf_counter() < end:
        time.sleep(1.0)
    if ckpt.exists():
        from bayesurl.posthoc.base import wrapper_names

        for name in wrapper_names():

            def fit(name: str = name) -> dict[str, Any]:
                path = work / "wrap" / f"{name}_cpu.pt"
                path.parent.mkdir(parents=True, exist_ok=True)
                check.cli(f"reference_wrap_{name}", wrap_argv(args, sizes, name, ckpt, "cpu", path))
                return {"path": str(path)}

            guarded(f"wrap_{name}", fit)
    (out / "done").write_text("done")
    return 0


# ---------------------------------------------------------------------- the roads


def exact_pass(check: Check) -> None:
    """The exact search at each N: fused / unfused / float32 / bare / GEMM, timed and compared."""
    from evaluator_gpu import bare

    from bayesurl.evaluation import evaluate, fused_search, low_precision, search_stats
    from bayesurl.search.fused import FusedConfig, fused_available, fused_topk

    sizes, dev = check.sizes, check.device
    ok, reason = fused_available(dev)
    rate = _gemm_rate(dev)

    def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
        _sync(dev)
        t = time.perf_counter()
        out = fn()
        _sync(dev)
        ts = [time.perf_counter() - t] if not repeats else []  # no repeat: the first call
        for _ in range(repeats):
            _sync(dev)
            t = time.perf_counter()
            out = fn()
            _sync(dev)
            ts.append(time.perf_counter() - t)
        return sorted(ts)[len(ts) // 2], out

    for n in sizes.exact_n:

        def one(row: Row, n: int = n) -> None:
            x, y, u = clustered(n, sizes.exact_d, 0)
            x, y, u = x.to(dev), y.to(dev), u.to(dev)
            # above the float32 path's size one timed call each (compiled at the first N)
            reps = sizes.repeats if n <= sizes.fp32_max_n else 0

            def ev() -> dict[str, Any]:
                return evaluate(
                    x, y, uncertainties=u, include=["r@1", "r_auroc"], return_neighbors=True
                )

            res: dict[str, tuple[float, Any]] = {}
            search_stats(reset=True)
            with fused_search(True if ok else False):
                res["fused"] = timed(ev, reps)
            stats = search_stats(reset=True)
            with fused_search(False):
                res["unfused bf16"] = timed(ev, reps)
            if n <= sizes.fp32_max_n:
                with low_precision(False):
                    res["float32"] = timed(ev, reps)
            res["bare mm+topk"] = timed(lambda: bare(x, torch.bfloat16), reps)
            res["bf16 GEMM"] = timed(lambda: _gemm_only(x), reps)
            ref_ids = res["unfused bf16"][1]["neighbors"][:, 0]
            same = {
                k: torch.equal(v[1]["neighbors"][:, 0], ref_ids)
                for k, v in res.items()
                if isinstance(v[1], dict)
            }
            flops = 2.0 * n * n * sizes.exact_d
            t_gemm = res["bf16 GEMM"][0]
            times = ", ".join(f"{k} {v[0]:.3g} s" for k, v in res.items())
            runs = reps + 1
            row.note = (
                f"{times}; fused = {res['fused'][0] / t_gemm:.2f}x bf16 GEMM, "
                f"{res['fused'][0] / (flops / rate):.2f}x its FLOP limit at {rate / 1e12:.0f} "
                f"TFLOP/s measured; fused certified "
                f"{stats['fused_certified'] / max(stats['fused_queries'], 1):.4f} of rows "
                f"({stats['fused_queries'] // runs} per run); neighbours equal: "
                + ", ".join(f"{k} {v}" for k, v in same.items())
                + ("" if ok else f"; fused not used: {reason}")
            )
            row.data = {
                "n": n,
                "times": {k: v[0] for k, v in res.items()},
                "flop_limit_s": flops / rate,
                "same": same,
                "metrics": {k: res["fused"][1][k] for k in ("r@1", "r_auroc")},
            }
            q = sample_queries(n, sizes.sample_queries)
            row.data["sample"] = q
            row.data["ids"] = res["fused"][1]["neighbors"][q.to(dev), 0].cpu()
            if not all(same.values()):
                row.agrees = False
            if check.cuda:
                torch.cuda.empty_cache()
            if n == sizes.exact_n[0] and ok:
                row.note += "; kernel configs: " + _configs(x, sizes, FusedConfig, fused_topk)

        check.road(f"exact pass N={n}", one)


def _configs(x: torch.Tensor, sizes: Sizes, cfg_cls: Any, fused_topk: Any) -> str:
    """Time the kernel alone (one pass over the gallery) for each block configuration."""
    xb = x.to(torch.bfloat16)
    own = torch.arange(x.shape[0], device=x.device)
    parts = []
    for c in sizes.fused_configs:
        cfg = cfg_cls(*c)
        v = torch.full((x.shape[0], cfg.keep), -math.inf, device=x.device)
        i = torch.full((x.shape[0], cfg.keep), -1, dtype=torch.long, device=x.device)
        try:
            fused_topk(xb, xb, v.clone(), i.clone(), own=own, config=cfg)  # compile
            _sync(x.device)
            t = time.perf_counter()
            fused_topk(xb, xb, v, i, own=own, config=cfg)
            _sync(x.device)
            parts.append(f"{c} {time.perf_counter() - t:.3g} s")
        except Exception as exc:
            parts.append(f"{c} failed: {_one_line(exc)[:80]}")
    return "; ".join(parts)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _gemm_only(x: torch.Tensor, rows: int = 8192) -> None:
    """The bf16 products of the exact pass, written to a reused block, nothing selected."""
    xs = x.to(torch.bfloat16)
    buf = torch.empty(min(rows, x.shape[0]), x.shape[0], dtype=torch.bfloat16, device=x.device)
    for r0 in range(0, x.shape[0], rows):
        r1 = min(r0 + rows, x.shape[0])
        torch.mm(xs[r0:r1], xs.T, out=buf[: r1 - r0])


def _gemm_rate(dev: torch.device) -> float:
    """Measured dense bf16 rate (FLOP/s) of one square product, after a warm-up."""
    s = 8192 if dev.type == "cuda" else 512
    a = torch.randn(s, s, device=dev).to(torch.bfloat16)
    for _ in range(2):
        torch.mm(a, a)
    _sync(dev)
    reps = 10 if dev.type == "cuda" else 2
    t = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, a)
    _sync(dev)
    return 2.0 * s**3 * reps / (time.perf_counter() - t)


def run_roads(check: Check) -> None:
    args, sizes, work, dev = check.args, check.sizes, check.work, check.dev()
    exact_pass(check)

    def bench(row: Row) -> None:
        folder = work / "bench_dev"
        cli_runs(check, "benchmark", bench_argv(args, sizes, dev, folder), folder)
        row.data["runs"] = bench_runs(folder)
        bad = [k for k, r in row.data["runs"].items() if r.get("error")]
        if bad:
            row.status, row.reason = "failed", f"failed estimators: {', '.join(bad)}"
        if not weights_present():
            row.note = "random weights: the packaged EfficientNet-Lite0 weights are not here"

    check.road(f"benchmark {sizes.bench_preset}", bench)
    for amp in ("bf16", "off"):

        def train(row: Row, amp: str = amp) -> None:
            folder = work / f"train_{amp}"
            cli_runs(check, f"train_{amp}", train_argv(args, sizes, dev, amp, folder), folder)
            row.data["runs"] = bench_runs(folder)
            bad = [k for k, r in row.data["runs"].items() if r.get("error")]
            if bad:
                row.status, row.reason = "failed", f"failed: {', '.join(bad)}"

        check.road(f"train amp={amp}", train)

    def ckpt(row: Row) -> None:
        argv = ["train", "--method", "ce", "--dataset", "default", "--epochs", "1"]
        argv += ["--subset", str(sizes.ckpt_subset), "--device", dev, "--out", str(work / "ckpt")]
        argv += ["--no-progress"] + (["--root", args.data_root] if args.data_root else [])
        try:
            check.cli("train_checkpoint", argv)
        finally:
            (work / "ckpt.done").write_text("done")

    check.road("train checkpoint", ckpt)
    from bayesurl.posthoc.base import wrapper_names

    for name in wrapper_names():

        def wrap(row: Row, name: str = name) -> None:
            path = work / "wrap" / f"{name}_dev.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            check.cli(
                f"wrap_{name}", wrap_argv(args, sizes, name, work / "ckpt" / "last.pt", dev, path)
            )
            row.data["path"] = str(path)

        check.road(f"wrap {name}", wrap)

    def folder(row: Row) -> None:
        out = work / "folder_dev"
        check.cli("folder", folder_argv(work, sizes, dev, out))
        row.data["json"] = json.loads((out / "folder.json").read_text())
        if not weights_present():
            row.note = "random weights: the packaged EfficientNet-Lite0 weights are not here"

    check.road(f"folder {sizes.folder_images} images", folder)

    def report(row: Row) -> None:
        out = work / "report.html"
        check.cli("report", ["report", str(work / "bench_dev"), "--out", str(out)])
        row.note = f"{out.stat().st_size / 2**20:.2f} MiB page"

    check.road("report", report)

    def ece(row: Row) -> None:
        js = work / "ece_dev.json"
        check.cli("ece", ["evaluate", str(work / "ece.npz"), "--device", dev, "--json", str(js)])
        row.data["metrics"] = json.loads(js.read_text())

    check.road(f"sampled ECE S={sizes.ece_s}", ece)

    def torchrun(row: Row) -> None:
        js = work / "eval_torchrun.json"
        gpus = torch.cuda.device_count() if check.cuda else 0
        backend = "nccl" if gpus >= 2 else "gloo"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc_per_node", "2", "-m", "bayesurl", "evaluate", str(work / "eval.npz")]
        cmd += ["--device", "cuda" if check.cuda else "cpu", "--json", str(js)]
        path = [str(REPO), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
        env.setdefault("OMP_NUM_THREADS", "2")
        with open(check.log_path("torchrun"), "w") as fh:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=300)
        if proc.returncode:
            tail = check.log_path("torchrun").read_text().strip().splitlines()
            errs = [ln for ln in tail if "rror" in ln]
            raise RuntimeError(f"exit {proc.returncode}: {(errs or tail or [''])[-1][:200]}")
        row.data["metrics"] = json.loads(js.read_text())
        where = f"{gpus} GPUs" if check.cuda else "CPU"
        row.note = f"backend {backend} ({where}; NCCL needs one GPU per rank)"

    check.road("torchrun 2 ranks", torchrun)


# ---------------------------------------------------------------------- agreement


def agree(check: Check) -> None:
    """Fill the agreement column from the CPU runs (waiting for the worker if needed)."""
    wait = max(10.0, check.args.budget_s + 60 - check.elapsed())
    done = check.ref_dir / "done"
    end = time.perf_counter() + wait
    while not done.exists() and time.perf_counter() < end:
        time.sleep(1.0)
    images = None
    for row in check.rows:
        if row.status != "ran":
            row.agreement = row.agreement or "-"
            continue
        try:
            _agree_row(check, row, images)
        except Exception as exc:
            row.agreement, row.agrees = f"comparison failed: {_one_line(exc)[:120]}", False


def _agree_row(check: Check, row: Row, images: Any) -> None:
    name = row.road

    def ref(key: str) -> dict[str, Any] | None:
        r = check.reference(key, wait=0)
        if r is None:
            row.agreement, row.agrees = "CPU run not finished", None
        elif "error" in r and len(r) == 1:
            row.agreement, row.agrees = f"CPU run failed: {r['error'][:100]}", None
            return None
        return r

    if name.startswith("exact pass"):
        r = ref("exact")
        if r is None:
            return
        cpu = torch.tensor(r[str(row.data["n"])])
        same = torch.equal(cpu, row.data["ids"])
        eq = float((cpu == row.data["ids"]).double().mean())
        row.agrees = same and row.agrees is not False
        row.agreement = f"neighbours of {len(cpu)} sampled queries equal: {eq:.4f}"
    elif name.startswith(("benchmark", "train amp")):
        r = ref("bench" if name.startswith("benchmark") else "train")
        if r is None:
            return
        parts, ok_all = [], True
        for est, run in sorted(row.data["runs"].items()):
            cpu = r.get(est)
            if run.get("error") or cpu is None or cpu.get("error"):
                ok_all = False
                parts.append(f"{est}: n/a")
                continue
            tol = _trained_tol(int(run.get("n") or 0))
            ok, text = _compare_metrics(run, cpu, tol, ("r@1", "r_auroc"))
            ok_all &= ok
            if not ok:
                parts.append(f"{est}: {text}")
        worst = max(
            (
                abs(float(run[k]) - float(r[e][k]))
                for e, run in row.data["runs"].items()
                if e in r and not run.get("error") and not r[e].get("error")
                for k in ("r@1", "r_auroc")
                if isinstance(run.get(k), float) and isinstance(r[e].get(k), float)
            ),
            default=float("nan"),
        )
        n = next((int(v.get("n") or 0) for v in row.data["runs"].values()), 0)
        row.agrees = ok_all
        row.agreement = (
            f"R@1, R-AUROC within {_trained_tol(n):.2g} (n={n}): {ok_all}; max |d| {worst:.3g}"
            + (f"; off: {'; '.join(parts)}" if parts else "")
        )
    elif name.startswith("wrap "):
        wname = name.split(" ", 1)[1]
        r = ref(f"wrap_{wname}")
        if r is None:
            return
        imgs = probe_images(64 if not check.args.dry_run else 32, check.args.data_root)
        ckpt = check.work / "ckpt" / "last.pt"
        a = wrapper_u(Path(row.data["path"]), ckpt, imgs)
        b = wrapper_u(Path(r["path"]), ckpt, imgs)
        rho = spearman(a, b)
        need = 0.999 if wname == "laplace" else 0.9
        row.agrees = rho >= need
        row.agreement = f"Spearman of u on {len(imgs)} images {rho:.4f} (>= {need})"
    elif name.startswith("folder"):
        r = ref("folder")
        if r is None:
            return
        got, cpu = row.data["json"], r["json"]
        m_got, m_cpu = got.get("metrics") or {}, cpu.get("metrics") or {}
        n = int(m_got.get("n") or 0)
        ok, text = _compare_metrics(m_got, m_cpu, _trained_tol(n), ("r@1", "r_auroc"))
        nb_same = _csv_neighbours(check.work / "folder_dev", check.work / "folder_cpu")
        row.agrees = ok and nb_same >= 0.98
        row.agreement = f"neighbours equal {nb_same:.3f}; {text}"
    elif name.startswith("sampled ECE"):
        r = ref("ece")
        if r is None:
            return
        ok, text = _compare_metrics(row.data["metrics"], r, EVAL_TOL)
        row.agrees, row.agreement = ok, text
    elif name.startswith("torchrun"):
        r = ref("eval")
        if r is None:
            return
        ok, text = _compare_metrics(row.data["metrics"], r, EVAL_TOL)
        row.agrees, row.agreement = ok, f"vs one CPU process: {text}"
    else:
        row.agreement = "-"


def _csv_neighbours(a: Path, b: Path) -> float:
    import csv

    def read(p: Path) -> dict[str, str]:
        with open(p / "uncertainty.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        return {r["path"]: r["neighbour"] for r in rows if not r["error"]}

    ra, rb = read(a), read(b)
    common = [k for k in ra if k in rb]
    return sum(ra[k] == rb[k] for k in common) / max(len(common), 1)


# ---------------------------------------------------------------------- the table


def environment(check: Check) -> list[str]:
    lines = [
        f"# benchmarks/gpu_check.py {' '.join(sys.argv[1:])}".rstrip(),
        f"# torch {torch.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()})",
    ]
    if check.cuda:
        props = torch.cuda.get_device_properties(check.device)
        lines.append(
            f"# GPU: {torch.cuda.device_count()} x {props.name}, "
            f"{props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs"
        )
    else:
        lines.append("# no GPU used: every road ran on the CPU (a dry run proves the roads run)")
    try:
        from bayesurl.evaluation import search_precision
        from bayesurl.search.fused import fused_available

        lines.append(f"# fused kernel: {fused_available(check.device)[1]}")
        lines.append(f"# candidate pass: {search_precision(check.device)[1]}")
    except Exception as exc:
        lines.append(f"# bayesurl not importable: {_one_line(exc)}")
    return lines


def table(check: Check) -> str:
    head = ["road", "status", "wall s", "peak GPU MiB", "agreement with the CPU run", "note"]
    body = []
    for r in check.rows:
        status = r.status if not r.reason else f"{r.status}: {r.reason}"
        peak = "-" if r.peak_mib is None else f"{r.peak_mib:.0f}"
        wall = "-" if r.wall is None else f"{r.wall:.1f}"
        mark = {True: "agrees: ", False: "DIFFERS: ", None: ""}[r.agrees]
        body.append([r.road, status, wall, peak, mark + (r.agreement or "-"), r.note or "-"])
    widths = [
        max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)
    ]
    widths = [min(w, 60) for w in widths]
    lines = [" | ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines.append("-+-".join("-" * w for w in widths))
    for b in body:
        lines.append(" | ".join(c.ljust(w) for c, w in zip(b, widths)))
    tol = (
        f"# agreement: evaluation roads |d| <= {EVAL_TOL:g} and equal neighbours; trained roads "
        "|d| <= 3 sqrt(0.5 / n) for R@1 and R-AUROC; wrap: Spearman of u >= 0.9 (laplace "
        ">= 0.999); folder: >= 98 % equal neighbours"
    )
    return "\n".join([*environment(check), tol, *lines])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda")
    p.add_argument("--dry-run", action="store_true", help="every size shrunk (tests)")
    p.add_argument(
        "--out", default=None, help="the table (default results/benchmarks/gpu_check.txt)"
    )
    p.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.add_argument("--data-root", default=None, help="FashionMNIST folder (default: the system's)")
    p.add_argument("--budget-s", type=float, default=330.0, help="roads start until this (s)")
    p.add_argument("--reference-threads", type=int, default=None, help="CPU run's threads")
    p.add_argument("--only", nargs="*", default=None, help="roads whose name starts so")
    p.add_argument("--reference-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    cores = os.cpu_count() or 2
    if args.reference_threads is None:
        args.reference_threads = max(1, cores - 4) if args.device != "cpu" else max(1, cores // 2)
    if args.reference_worker:
        return reference_worker(args)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here: run with --device cpu (--dry-run for the small sizes)")
        return 2
    own_work = args.work is None
    tmp = tempfile.TemporaryDirectory(prefix="gpu_check_") if own_work else None
    args.work = tmp.name if tmp else args.work
    Path(args.work).mkdir(parents=True, exist_ok=True)
    check = Check(args)
    name = "gpu_check_dry_run.txt" if args.dry_run else "gpu_check.txt"
    out = Path(args.out or REPO / "results" / "benchmarks" / name)
    out.parent.mkdir(parents=True, exist_ok=True)
    check.partial = out
    torch.set_num_threads(max(1, cores - args.reference_threads))
    write_inputs(check.work, check.sizes)
    worker_cmd = [sys.executable, __file__, "--reference-worker", "--work", args.work]
    worker_cmd += ["--device", "cpu", "--budget-s", str(args.budget_s)]
    worker_cmd += ["--reference-threads", str(args.reference_threads)]
    worker_cmd += (["--dry-run"] if args.dry_run else []) + (
        ["--data-root", args.data_root] if args.data_root else []
    )
    worker_cmd += ["--only", *args.only] if args.only else []
    with open(check.log_path("reference_worker"), "w") as fh:
        worker = subprocess.Popen(worker_cmd, stdout=fh, stderr=subprocess.STDOUT)
    try:
        run_roads(check)
        agree(check)
    finally:
        if worker.poll() is None:
            worker.terminate()
            worker.wait(30)
    text = table(check) + f"\n# total {check.elapsed():.0f} s\n"
    print(text)
    out.write_text(text)
    print(f"wrote {out}")
    if args.json:
        rows = [{k: v for k, v in vars(r).items() if k != "data"} for r in check.rows]
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if tmp is not None and not args.dry_run:
        tmp.cleanup()
    return 0 if all(r.status == "ran" for r in check.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
