"""``bayesurl folder`` against the bare feature extractor, before / after, same run.

Builds a labelled folder of ``--images`` Open Clip Art PNGs (``/usr/share/openclipart/png``,
round robin over its ten largest categories, one sub-folder each) and times, as separate
processes (process start included), in alternating repeats:

- ``bare``: decode every image (:class:`bayesurl.data.folder.ReadableImages`) and encode it
  once with the frozen EfficientNet-Lite0 (ImageNet weights, 224 px, batches of 64) -- what
  one pass of a feature extractor costs;
- ``before``: ``bayesurl folder DIR --out OUT`` of the revision ``--before`` (checked out in a
  temporary git worktree);
- ``after``: the same command of this checkout.

Prints images per second by wall clock and by the processes' CPU time (user + system of the
child; on a shared machine the CPU time is the steadier figure), each road's ratio to
``bare`` of the same repeat, and whether ``before`` and ``after`` wrote byte-identical
``uncertainty.csv`` files::

    python benchmarks/folder_road.py --images 1000 --threads 2 --before 2f7d5ab
"""

from __future__ import annotations

import argparse
import filecmp
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLIPART = Path("/usr/share/openclipart/png")

BARE = """
import sys, torch
from torch.utils.data import DataLoader
from bayesurl.backbones import build_backbone, data_config
from bayesurl.data import default_transform
from bayesurl.data.folder import ReadableImages, collate_readable, scan_image_folder
from bayesurl.features import FrozenEncoder
backbone, _ = build_backbone("efficientnet_lite0", pretrained=True)
cfg = data_config(backbone)
enc = FrozenEncoder(backbone.eval(), default_transform(3, mean=cfg.mean, std=cfg.std), 224)
data = ReadableImages(scan_image_folder(sys.argv[1]), 224)
n = 0
with torch.no_grad():
    for x, _, _, _ in DataLoader(data, batch_size=64, collate_fn=collate_readable):
        n += len(enc(x))
print(n)
"""


def build_folder(root: Path, n: int) -> None:
    """``n`` Open Clip Art PNGs in ten class sub-folders (deterministic choice)."""
    files = sorted(CLIPART.rglob("*.png"))
    by_class: dict[str, list[Path]] = defaultdict(list)
    for p in files:
        by_class[p.relative_to(CLIPART).parts[0]].append(p)
    classes = sorted(by_class, key=lambda c: (-len(by_class[c]), c))[:10]
    if sum(len(by_class[c]) for c in classes) < n:
        raise SystemExit(f"fewer than {n} images in the ten largest classes of {CLIPART}")
    picked = 0
    for k in range(n):
        c = classes[k % len(classes)]
        src = by_class[c][k // len(classes)]
        (root / c).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, root / c / f"{k:05d}.png")
        picked += 1


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def summary(
    rates: dict[tuple[int, str], list[tuple[float, float]]], identical: list[bool], n: int
) -> None:
    """Medians over the repeats so far (printed after every repeat)."""
    print()
    print("threads road    img/s wall  img/s CPU  wall / bare  CPU / bare  (median of repeats)")
    for threads in sorted({t for t, _ in rates}):
        if len(rates[threads, "after"]) < len(rates[threads, "bare"]):
            continue
        bare_w = [n / w for w, _ in rates[threads, "bare"]]
        bare_c = [n / c for _, c in rates[threads, "bare"]]
        for road in ("bare", "before", "after"):
            w = [n / x for x, _ in rates[threads, road]]
            c = [n / y for _, y in rates[threads, road]]
            rw = statistics.median(a / b for a, b in zip(w, bare_w, strict=True))
            rc = statistics.median(a / b for a, b in zip(c, bare_c, strict=True))
            print(f"{threads:7d} {road:6s} {statistics.median(w):11.2f} "
                  f"{statistics.median(c):10.2f} {rw:12.2f} {rc:11.2f}")  # fmt: skip
        aw = statistics.median(
            b / a
            for (a, _), (b, _) in zip(
                rates[threads, "after"], rates[threads, "before"], strict=True
            )
        )
        ac = statistics.median(
            b / a
            for (_, a), (_, b) in zip(
                rates[threads, "after"], rates[threads, "before"], strict=True
            )
        )
        print(f"{threads:7d} after / before: {aw:.2f}x wall, {ac:.2f}x CPU")
    print(f"uncertainty.csv before == after, byte for byte: {all(identical)} ({identical})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, nargs="+", default=[2])
    parser.add_argument("--before", default="2f7d5ab", help="git revision of the old road")
    parser.add_argument(
        "--method",
        default="tau",
        help="bayesurl folder --method: tau (default; encodes 2 augmented views of every fitted "
        "image besides the plain one), pvu or laplace (the plain encoding only)",
    )
    parser.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="folder_road-"))
    images = work / "images"
    if not images.is_dir():
        build_folder(images, args.images)
    old_tree = work / "before"
    if not old_tree.is_dir():
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(old_tree), args.before],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    try:
        run_roads(args, work, images, old_tree)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old_tree)])


def run_roads(args: argparse.Namespace, work: Path, images: Path, old_tree: Path) -> None:
    """The alternating repeats of the three roads, with a summary after each."""
    trees = {"bare": REPO, "before": old_tree, "after": REPO}
    rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"{args.images} Open Clip Art PNGs, 224 px, EfficientNet-Lite0 (ImageNet weights),")
    print(f"bayesurl folder --method {args.method}; before = {args.before}, after = {rev}")
    print(f"load average at start: {os.getloadavg()[0]:.1f} (machine shared with other jobs)")
    rates: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    identical = []
    for threads in args.threads:
        for rep in range(args.repeats):
            # alternate the order so that a change in the machine's load hits each road alike
            order = ["bare", "before", "after"] if rep % 2 == 0 else ["after", "before", "bare"]
            for road in order:
                env = {**os.environ, "OMP_NUM_THREADS": str(threads),
                       "MKL_NUM_THREADS": str(threads), "PYTHONPATH": str(trees[road])}  # fmt: skip
                out = work / f"{road}_t{threads}_r{rep}"
                if road == "bare":
                    cmd = [sys.executable, "-c", BARE, str(images)]
                else:
                    cmd = [sys.executable, "-m", "bayesurl", "folder", str(images),
                           "--out", str(out), "--no-progress", "--method", args.method]  # fmt: skip
                wall, cpu = timed(cmd, env, trees[road])
                rates[threads, road].append((wall, cpu))
                print(f"  threads {threads} repeat {rep} {road:6s}: {wall:7.1f} s wall, "
                      f"{cpu:7.1f} s CPU, load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
            same = filecmp.cmp(
                work / f"before_t{threads}_r{rep}" / "uncertainty.csv",
                work / f"after_t{threads}_r{rep}" / "uncertainty.csv",
                shallow=False,
            )
            identical.append(same)
            summary(rates, identical, args.images)


if __name__ == "__main__":
    main()
