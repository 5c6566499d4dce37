"""Clipart: decoding speed and frozen EfficientNet-Lite0 extraction speed per input size.

The weights were made for 224 px; the clipart protocol extracts at a smaller, stated size.
For each size this script decodes a seeded sample of the drawings of the committed manifest
at that size (:func:`bayesurl.data.clipart.clipart`: composite on white, pad to a square,
resize) and encodes them with the frozen backbone
(:class:`bayesurl.features.FrozenEncoder`) at 1 and 2 threads, the sizes in alternating
order over ``--repeats`` rounds. It prints images per second by wall clock and by CPU time
(the latter is what an idle core gives on a shared, loaded machine) and each size's CPU
throughput as a ratio to 224 px measured in the same run::

    PYTHONPATH=. python benchmarks/clipart_extraction.py [--images 128] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bayesurl.backbones import build_backbone, data_config
from bayesurl.data import default_transform
from bayesurl.data.clipart import clear_clipart_cache, clipart, read_clipart_manifest
from bayesurl.features import FrozenEncoder

SIZES = (96, 128, 160, 224)


def _encode(encoder: FrozenEncoder, images: torch.Tensor, batch: int) -> tuple[float, float]:
    with torch.no_grad():
        w0, c0 = time.perf_counter(), time.process_time()
        for lo in range(0, len(images), batch):
            encoder(images[lo : lo + batch])
        return time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    backbone, _ = build_backbone("efficientnet_lite0", pretrained=True)
    dc = data_config(backbone)
    transform = default_transform(3, mean=dc.mean, std=dc.std)
    manifest = read_clipart_manifest()
    g = torch.Generator().manual_seed(0)
    pick = sorted(torch.randperm(len(manifest["files"]), generator=g)[: args.images].tolist())
    sample = {**manifest, "files": [manifest["files"][i] for i in pick]}
    images = {}
    for s in SIZES:
        clear_clipart_cache()
        w0, c0 = time.perf_counter(), time.process_time()
        images[s] = clipart(size=s, manifest=sample).images
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        n = len(images[s])
        print(f"decode {s:3d} px: {n / wall:6.1f} img/s wall, {n / cpu:6.1f} img/s CPU "
              f"({n} drawings, a seeded sample)", flush=True)  # fmt: skip
    clear_clipart_cache()
    rates: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for r in range(args.repeats):
            order = SIZES if r % 2 == 0 else tuple(reversed(SIZES))
            for s in order:
                enc = FrozenEncoder(backbone.eval(), transform, s)
                with torch.no_grad():
                    enc(images[s][: args.batch])  # warm-up
                wall, cpu = _encode(enc, images[s], args.batch)
                n = len(images[s])
                rates.setdefault((threads, s), []).append((n / wall, n / cpu))
    for threads in (1, 2):
        ref = statistics.median(c for _, c in rates[(threads, 224)])
        for s in SIZES:
            wall = statistics.median(w for w, _ in rates[(threads, s)])
            cpu = statistics.median(c for _, c in rates[(threads, s)])
            print(f"encode {s:3d} px, {threads} thread(s): {wall:6.1f} img/s wall, "
                  f"{cpu:6.1f} img/s CPU, {cpu / ref:4.2f}x CPU throughput of 224 px")  # fmt: skip


if __name__ == "__main__":
    main()
