"""LAM Table 2 (closed set, FashionMNIST) from a TOML config; resumable, one JSON per run.

Run (from the repository root)::

    python recipes/lam/table2.py recipes/lam/fashion_mnist_closed.toml \
        --out recipes/lam/results/fashion_mnist_closed

``--summarize`` only rebuilds ``table.md`` / ``table.csv`` from the JSON files. See
:mod:`bayesurl.experiments.lam_table2`.
"""

from __future__ import annotations

import argparse
import logging
import time

from bayesurl.experiments.lam_table2 import load_config, run_table2, summarize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", help="TOML file with a [table2] table")
    ap.add_argument("--out", required=True, help="results folder (JSON per row and seed)")
    ap.add_argument("--models", default=None, help="weights cache (default OUT/models)")
    ap.add_argument("--summarize", action="store_true", help="only rebuild the table")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if not args.summarize:
        t0 = time.perf_counter()
        run_table2(load_config(args.config), args.out, models=args.models)
        logging.info("wall time of this invocation: %.0f s", time.perf_counter() - t0)
    summarize(args.out)
    with open(f"{args.out}/table.md") as f:
        print(f.read())


if __name__ == "__main__":
    main()
