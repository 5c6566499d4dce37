"""Write the clipart manifest committed with the package (bayesurl/data/clipart_manifest.json.gz).

Scans the Open Clip Art PNG tree (Debian ``openclipart-png``), fixes the classes, the kept
files and the duplicate groups (:func:`bayesurl.data.clipart.build_clipart_manifest`) and
prints a summary. Run it only to move the data set to a new tree: every committed class split
and result refers to the classes of the committed manifest.

    python tools/clipart_manifest.py [--root DIR] [--out FILE]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from bayesurl.data.clipart import (
    CLIPART_MANIFEST,
    DEFAULT_CLIPART_ROOT,
    build_clipart_manifest,
    write_clipart_manifest,
)


def _debian_version() -> str:
    try:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", "openclipart-png"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=DEFAULT_CLIPART_ROOT)
    ap.add_argument("--out", default=str(CLIPART_MANIFEST))
    ap.add_argument("--min-count", type=int, default=30)
    ap.add_argument("--per-class", type=int, default=80)
    args = ap.parse_args(argv)

    def progress(done: int, total: int) -> None:
        if done % 500 == 0:
            print(f"  {done}/{total}", file=sys.stderr, flush=True)

    source = f"Debian openclipart-png {_debian_version()} at {args.root}"
    man = build_clipart_manifest(
        args.root,
        min_count=args.min_count,
        per_class=args.per_class,
        source=source,
        progress=progress,
    )
    write_clipart_manifest(man, args.out)
    print(f"{len(man['classes'])} classes, {len(man['files'])} files; {source}")
    for c, name in enumerate(man["classes"]):
        print(f"  {c:2d} {name}: {man['counts'][name]} distinct drawings")
    print(f"{len(man['groups'])} duplicate groups")
    print("dropped folders:")
    for f, (n, why) in man["dropped_folders"].items():
        print(f"  {f}: {n} ({why})")
    print(f"{len(man['excluded'])} files not decoded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
