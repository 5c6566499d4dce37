"""Frozen-feature extraction speed of the pretrained EfficientNet-Lite0 (one thread).

Prints images per second by wall clock and by this process's CPU time (the latter is what an
idle core would give on a shared, loaded machine) at the preset's 64 px and, in the same run,
at the weights' own 224 px, with their ratio::

    python benchmarks/feature_extraction.py [--images 512]
"""

from __future__ import annotations

import argparse
import time

import torch

from bayesurl.backbones import build_backbone, data_config
from bayesurl.data import default_transform
from bayesurl.features import FrozenEncoder


def measure(encoder: FrozenEncoder, images: torch.Tensor, batch: int) -> tuple[float, float]:
    """(wall img/s, CPU img/s) of encoding ``images`` in batches of ``batch``."""
    with torch.no_grad():
        encoder(images[:batch])  # warm-up
        w0, c0 = time.perf_counter(), time.process_time()
        for lo in range(0, len(images), batch):
            encoder(images[lo : lo + batch])
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return len(images) / wall, len(images) / cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    backbone, _ = build_backbone("efficientnet_lite0", pretrained=True)
    cfg = data_config(backbone)
    transform = default_transform(3, mean=cfg.mean[0], std=cfg.std[0])
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (args.images, 1, 28, 28), dtype=torch.uint8, generator=g)
    rates = {}
    for size in (64, 224):
        n = args.images if size == 64 else max(args.batch, args.images // 8)
        enc = FrozenEncoder(backbone.eval(), transform, size)
        rates[size] = measure(enc, images[:n], args.batch)
        print(f"{size:3d} px: {rates[size][0]:7.1f} img/s wall, {rates[size][1]:7.1f} img/s CPU")
    print(f"64 px / 224 px CPU throughput: {rates[64][1] / rates[224][1]:.1f}x")


if __name__ == "__main__":
    main()
