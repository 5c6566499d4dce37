"""Drop some estimators' runs from a stored sweep, so that the same benchmark command re-runs
just those (after their defaults changed) and keeps every other run.

A stored sweep (:class:`bayesurl.sweeps.storage.SweepStorage`) keeps its runs as Optuna trials,
and Optuna never edits a finished trial. This tool therefore writes a new SQLite storage with
every study of the old one and every trial except those of the named estimators, then puts it
in the old one's place. The next ``bayesurl benchmark`` with the same preset and ``--storage``
plans the whole sweep again, finds the dropped runs missing and runs only them; its
``results.json`` then holds the kept runs and the new ones::

    python tools/sweep_without.py results/pretrained/crossfit/default/sweep.db \
        --estimators lam_posthoc,lam_online
    bayesurl benchmark --preset pretrained --untuned --threads 1 \
        --out results/pretrained/crossfit/default --set backbone.cache=FEATURES

Prints how many trials each study kept and dropped; ``--dry-run`` only counts.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def _estimator(trial: Any) -> str | None:
    key = trial.user_attrs.get("key")
    return None if key is None else str(key).split("/", 1)[0]


def without_runs(src: Path, dst: Path, estimators: Iterable[str]) -> dict[str, tuple[int, int]]:
    """Copy the SQLite storage ``src`` to a new ``dst`` without the trials of ``estimators``.

    Returns ``{study name: (kept, dropped)}``.
    """
    from bayesurl.sweeps.storage import require_optuna

    optuna = require_optuna()
    drop = set(estimators)
    old = optuna.storages.RDBStorage(f"sqlite:///{src}")
    new = optuna.storages.RDBStorage(f"sqlite:///{dst}")
    counts: dict[str, tuple[int, int]] = {}
    for frozen in old.get_all_studies():
        name = frozen.study_name
        sid = old.get_study_id_from_name(name)
        nid = new.create_new_study(frozen.directions, name)
        for k, v in old.get_study_user_attrs(sid).items():
            new.set_study_user_attr(nid, k, v)
        for k, v in old.get_study_system_attrs(sid).items():
            new.set_study_system_attr(nid, k, v)
        kept = dropped = 0
        for t in old.get_all_trials(sid, deepcopy=False):
            if _estimator(t) in drop:
                dropped += 1
                continue
            new.create_new_trial(nid, template_trial=t)
            kept += 1
        counts[name] = (kept, dropped)
    old.remove_session()
    new.remove_session()
    old.engine.dispose()
    new.engine.dispose()
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("storage", type=Path, help="the sweep's SQLite file (sweep.db)")
    ap.add_argument("--estimators", required=True, help="comma-separated estimator names")
    ap.add_argument("--dry-run", action="store_true", help="count, change nothing")
    args = ap.parse_args(argv)
    src = args.storage.resolve()
    if not src.is_file():
        print(f"error: `storage` {args.storage} is not a file", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.estimators.split(",") if n.strip()]
    if not names:
        print("error: `--estimators` names no estimator", file=sys.stderr)
        return 2
    fd, tmp = tempfile.mkstemp(suffix=".db", dir=src.parent)
    os.close(fd)
    os.unlink(tmp)  # Optuna creates the schema in a file of its own
    try:
        counts = without_runs(src, Path(tmp), names)
        for name, (kept, dropped) in counts.items():
            print(f"{name}: kept {kept} trials, dropped {dropped} ({', '.join(names)})")
        if not any(d for _, d in counts.values()):
            print(f"no run of {', '.join(names)} in {args.storage}: nothing changed")
            return 0
        if args.dry_run:
            return 0
        os.chmod(tmp, src.stat().st_mode & 0o777)
        os.replace(tmp, src)
        for side in ("-wal", "-shm"):  # the old file's journal belongs to the old file
            Path(f"{src}{side}").unlink(missing_ok=True)
        print(f"wrote {args.storage}: rerun the sweep's benchmark command to run them again")
    finally:
        Path(tmp).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
