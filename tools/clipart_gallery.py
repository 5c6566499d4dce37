"""The gallery of the clipart classes (docs/_static/clipart_gallery.png).

One tile per class of the committed manifest: four of its drawings (a seeded pick) as the
data set delivers them (composited on white, padded to a square, 64 px), with the class index
and folder. Marked are the five validation classes of the protocol (upstream in every split).

    PYTHONPATH=. python tools/clipart_gallery.py [--out docs/_static/clipart_gallery.png]
"""

from __future__ import annotations

import argparse

import torch
from matplotlib.figure import Figure

from bayesurl.data.clipart import clipart
from bayesurl.sweeps.plan import sweep_preset


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/_static/clipart_gallery.png")
    ap.add_argument("--per-class", type=int, default=4)
    args = ap.parse_args(argv)
    ds = clipart(size=64)
    val = set(sweep_preset("clipart", "pretrained").val_classes or ())
    k = len(ds.classes)
    cols = 7
    rows = -(-k // cols)
    fig = Figure(figsize=(cols * 2.3, rows * 2.5))
    g = torch.Generator().manual_seed(0)
    n = int(args.per_class)
    side = 2 if n == 4 else n
    for c, name in enumerate(ds.classes):
        idx = (ds.targets == c).nonzero().flatten()
        pick = idx[torch.randperm(len(idx), generator=g)[:n]]
        tiles = ds.images[pick]
        grid = torch.full((3, 64 * 2 + 2, 64 * side + 2), 255, dtype=torch.uint8)
        for j, im in enumerate(tiles):
            r, q = divmod(j, side)
            grid[:, r * 66 : r * 66 + 64, q * 66 : q * 66 + 64] = im
        ax = fig.add_subplot(rows, cols, c + 1)
        ax.imshow(grid.permute(1, 2, 0).numpy())
        ax.set_xticks([])
        ax.set_yticks([])
        label = name.replace("signs_and_symbols/", "signs/").replace("computer/icons/", "icons/")
        mark = " (val)" if c in val else ""
        ax.set_title(f"{c} {label}{mark}", fontsize=7.5, color="tab:red" if mark else "black")
    fig.suptitle(
        f"clipart: {k} classes of the Open Clip Art Library (Debian openclipart-png), "
        f"{len(ds)} drawings; (val) = validation class, upstream in every split",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(args.out, dpi=80)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
