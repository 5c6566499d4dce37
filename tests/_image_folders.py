"""Small labelled (or flat) folders of images for the folder-road tests."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image


def noisy_squares(root: Path, n: int = 6, labelled: bool = True) -> Path:
    """Noisy 16 px squares of three colours, ``n`` per colour: ``root/c<k>/<i>.png``
    (labelled) or ``root/c<k>_<i>.png`` (flat)."""
    g = torch.Generator().manual_seed(0)
    for c, rgb in enumerate([(220, 30, 30), (30, 200, 30), (30, 30, 220)]):
        for i in range(n):
            px = torch.tensor(rgb).view(1, 1, 3) + 40 * torch.randn(16, 16, 3, generator=g)
            img = Image.fromarray(px.clamp(0, 255).to(torch.uint8).numpy())
            path = root / f"c{c}" / f"{i}.png" if labelled else root / f"c{c}_{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            img.save(path)
    return root
