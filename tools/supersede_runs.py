"""Set some estimators' finished runs of a stored sweep aside, so the sweep runs them again.

    python tools/supersede_runs.py results/pretrained/crossfit/default \
        --estimators pvu,infonce,mcinfonce --reason "augmented views seeded per image"
    # then the protocol's own command, unchanged: it runs only the runs set aside
    bayesurl benchmark --preset pretrained --untuned --threads 1 \
        --out results/pretrained/crossfit/default --set backbone.cache=FEATURES

For a protocol some of whose estimators changed after it ran (a fix): the runs of the named
estimators are marked ``superseded`` with the reason (:meth:`bayesurl.sweeps.storage.
SweepStorage.supersede`); they stay in the storage, but no longer count, so the next start of
the sweep plans them again and its workers run only them (resumable as any stored sweep). The
same call again after the re-run changes nothing (it is idempotent per reason).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="the sweep's folder (holding sweep.db)")
    ap.add_argument("--storage", default=None, help="SQLAlchemy URL (default: FOLDER/sweep.db)")
    ap.add_argument("--sweep", default=None, help="sweep name (default: the storage's only one)")
    ap.add_argument("--estimators", required=True, help="comma-separated estimator names")
    ap.add_argument("--reason", required=True, help="why the runs are run again (stored)")
    a = ap.parse_args()

    from bayesurl.sweeps.storage import SweepStorage

    url = a.storage
    if url is None:
        db = a.folder / "sweep.db"
        if not db.is_file():
            packed = db.with_name("sweep.db.xz")
            hint = f"; unpack it first: xz -dk {packed}" if packed.is_file() else ""
            raise SystemExit(f"no sweep storage {db}{hint}")
        url = f"sqlite:///{db.resolve()}"
    sweep = a.sweep
    if sweep is None:
        import optuna

        names = [
            s.study_name.removeprefix("sweep:")
            for s in optuna.storages.RDBStorage(url).get_all_studies()
            if s.study_name.startswith("sweep:")
        ]
        if len(names) != 1:
            raise SystemExit(f"{url}: give --sweep, the storage holds sweeps {names}")
        sweep = names[0]
    store = SweepStorage(url, sweep=sweep)
    n = store.supersede(a.estimators.split(","), a.reason)
    print(f"{n} runs set aside in {store.url} (sweep {sweep!r}); status {store.status()}")


if __name__ == "__main__":
    main()
