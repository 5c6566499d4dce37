"""``bayesurl folder`` with the scores that train nothing (``knn``, ``mahalanobis``, ``gmm``)
on two labelled folders, each metric with its 95 % interval over the folder's images.

Folders (built once under ``--work``): ``--images`` Open Clip Art PNGs, round robin over the
ten largest categories (as ``benchmarks/folder_road.py`` builds them), and as many
FashionMNIST test PNGs (the first ``images / 10`` of each class, 28 px, as
``benchmarks/lam_hessian_pairs.py`` builds them). Each method runs :func:`score_folder` at its
defaults (EfficientNet-Lite0, ImageNet weights, 224 px, cross-fitted over five folds); the
features are encoded once per folder (``--cache``). Writes ``--out`` (JSON: per folder and
method R@1, R-AUROC, AUSC with their intervals, the number of wrong retrievals, CPU time)::

    python benchmarks/folder_reference_rows.py --out results/folder_reference/results.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import torch
from _machine import cpu_flags, cpu_name

from bayesurl.files import write_json
from bayesurl.folder import FolderOptions, score_folder
from bayesurl.stats.intervals import read_interval

REPO = Path(__file__).resolve().parents[1]
METHODS = ("knn", "mahalanobis", "gmm")
KEYS = ("r@1", "r_auroc", "ausc")
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def _module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_folders(work: Path, n: int) -> dict[str, Path]:
    """The two labelled folders of ``n`` images each (built once)."""
    builders = {
        "fashion_mnist": _module("lam_hessian_pairs")._fmnist_folder,
        "clipart": _module("folder_road").build_folder,
    }
    out = {}
    for name, build in builders.items():
        root = work / f"{name}_{n}"
        if not (work / f"{name}_{n}.done").is_file():
            root.mkdir(parents=True, exist_ok=True)
            build(root, n)
            (work / f"{name}_{n}.done").write_text("ok\n")
        out[name] = root
    return out


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--work", type=Path, default=Path("runs/folder_reference"))
    parser.add_argument("--out", type=Path, default=Path("results/folder_reference/results.json"))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folders = build_folders(args.work, args.images)
    doc: dict[str, Any] = {
        "settings": {
            "images": args.images,
            "threads": args.threads,
            "folder_options": "defaults (efficientnet_lite0, ImageNet weights, 224 px, "
            "cross-fitted over 5 folds)",
            "machine": f"{cpu_name()}; {', '.join(cpu_flags(FLAGS).split())}",
            "load_average_before": os.getloadavg(),
            "torch": torch.__version__,
        },
        "folders": {},
    }
    for name, root in folders.items():
        rows = {}
        for method in METHODS:
            t0, c0 = time.perf_counter(), _cpu()
            res = score_folder(
                root,
                out=args.work / "out" / f"{name}_{method}",
                options=FolderOptions(method=method, cache=args.work / "cache", progress=False),
            )
            row: dict[str, Any] = {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu() - c0}
            for key in KEYS:
                iv = read_interval(res.metrics, key)
                row[key] = res.metrics.get(key)
                row[f"{key}_interval"] = None if iv is None else [iv.low, iv.high, iv.method, iv.n]
            row["wrong"] = round((1 - res.metrics["r@1"]) * len(res.record.u))
            row["queries"] = len(res.record.u)
            rows[method] = row
            print(
                f"{name:13s} {method:11s} R@1 {row['r@1']:.3f}  R-AUROC {row['r_auroc']:.3f} "
                f"[{row['r_auroc_interval'][0]:.3f}, {row['r_auroc_interval'][1]:.3f}]  "
                f"({row['wrong']} wrong of {row['queries']}; {row['cpu_s']:.0f} s CPU)",
                flush=True,
            )
        doc["folders"][name] = rows
    doc["settings"]["load_average_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, doc)
    print(f"wrote {args.out}")
    print(json.dumps(doc["settings"], indent=1))


if __name__ == "__main__":
    main()
