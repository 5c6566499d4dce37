"""Cost of the rows that score one embedding: searched once (NeighborMemo) against every time.

On one class split of the ``pretrained`` preset (frozen EfficientNet-Lite0 features, every one
of the 35,000 downstream images a query) the rows that keep an embedding of another row -- PVU,
post-hoc TaU and laplace-torch Laplace on the CE net, and the two free baselines on the
features -- are run twice, interleaved: with the search memo beside the feature store (as a
sweep runs them) and with ``neighbor_memo=None`` (a fresh search in every row). Prints each
row's CPU time both ways, the ratio of the totals, and checks that both give the same metrics.

CPU (process) time, one torch thread: the shared machine's wall time depends on other jobs.
The feature store must hold the split's features (the first run extracts them, minutes).

    PYTHONPATH=. python benchmarks/shared_search.py --cache runs/features
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROWS = ("ce", "pvu", "tau_posthoc", "laplace_ce", "feature_norm", "feature_knn")
KEYS = ("r@1", "r_auroc", "ausc", "map@5", "mixed_r_auroc", "ood_auroc")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default="runs/features", help="frozen-feature store")
    parser.add_argument("--split", type=int, default=0, help="class split of the protocol")
    parser.add_argument("--preset", default="pretrained")
    args = parser.parse_args()
    # benchmarks/laplace.py must not shadow laplace-torch, which the Laplace row imports
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]

    import torch

    from bayesurl.data.class_splits import class_splits
    from bayesurl.evaluation import NeighborMemo
    from bayesurl.runs import RunCache, load_recipe, run

    torch.set_num_threads(1)
    split = class_splits(args.split + 1)[args.split].to_dict()

    def cfg(name: str):
        return load_recipe(
            f"fashion_mnist/{name}",
            [("backbone.cache", args.cache), ("data.class_split", split), ("device", "cpu")],
            preset=args.preset,
        )

    # one cache per way, so the CE base is trained once in each (as a sweep worker does)
    caches = {"fresh": RunCache(), "memo": RunCache()}
    with tempfile.TemporaryDirectory() as tmp:
        # an empty memo folder in place of <backbone.cache>/neighbors: nothing is reused from
        # earlier runs of the protocol
        memo = NeighborMemo(Path(tmp) / "neighbors")
        caches["memo"].memos[str(Path(args.cache) / "neighbors")] = memo
        for cache in caches.values():  # the data are built once per cache, before any timing
            cache.get_data(cfg(ROWS[0]))
        times: dict[str, dict[str, float]] = {"memo": {}, "fresh": {}}
        metrics: dict[str, dict[str, dict]] = {"memo": {}, "fresh": {}}
        for name in ROWS:
            for way in ("fresh", "memo"):
                kw = {"neighbor_memo": None} if way == "fresh" else {}
                c0 = time.process_time()
                res = run(cfg(name), cache=caches[way], raise_errors=True, **kw)
                times[way][name] = time.process_time() - c0
                metrics[way][name] = {k: res.metrics.get(k) for k in KEYS}
                print(f"{name:13s} {way:5s} CPU {times[way][name]:6.1f} s", flush=True)
    print(f"\n{'row':13s} {'fresh s':>8s} {'memo s':>8s} {'ratio':>6s}")
    for name in ROWS:
        f, m = times["fresh"][name], times["memo"][name]
        print(f"{name:13s} {f:8.1f} {m:8.1f} {m / f:6.2f}")
    tf, tm = sum(times["fresh"].values()), sum(times["memo"].values())
    print(f"{'total':13s} {tf:8.1f} {tm:8.1f} {tm / tf:6.2f}")
    same = all(metrics["memo"][n] == metrics["fresh"][n] for n in ROWS)
    print(f"same metrics with and without the memo: {same}")
    if not same:
        raise SystemExit("the memo changed a metric")


if __name__ == "__main__":
    main()
