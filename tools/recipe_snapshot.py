"""Snapshot of every shipped recipe as it resolves: a check that a change to the recipe files
or their loader changes no run.

For every ``<dataset>/<estimator>`` of :func:`bayesurl.runs.config.list_recipes`, without a
preset and with each of the file's presets, ``load_recipe(...).to_dict()`` untuned, tuned (the
committed tuned settings applied, as a run gets them) and tuned on class splits 0-3 (or the
loader's error where there is no answer), and the estimator's hyper-parameter search space
(:func:`bayesurl.sweeps.tuning.search_space`). Usage (repository root)::

    python tools/recipe_snapshot.py write before.json   # before the change
    python tools/recipe_snapshot.py compare before.json  # after it: lists what differs
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bayesurl.data.class_splits import class_splits
from bayesurl.runs.config import list_recipes, load_recipe, read_recipe_file
from bayesurl.sweeps.tuning import search_space

#: Class splits resolved per preset (a cross-fitted preset's tuned set depends on the split).
SPLITS = 4


def _resolved(name: str, preset: str | None, overrides=(), tuned: bool = True) -> Any:
    """The resolved config as a dict, or the error the loader gives (that is its answer)."""
    try:
        return load_recipe(name, overrides, preset=preset, tuned=tuned).to_dict()
    except ValueError as exc:
        return {"error": str(exc)}


def snapshot() -> dict[str, Any]:
    """``{"<dataset>/<estimator>": {"configs": {preset: dict}, "space": {...}}}``."""
    out: dict[str, Any] = {}
    for dataset, names in list_recipes().items():
        raw = read_recipe_file(dataset)
        presets = [None, *raw.get("presets", {})]
        for name in names:
            configs = {}
            for p in presets:
                configs[f"{p} untuned"] = _resolved(f"{dataset}/{name}", p, tuned=False)
                configs[str(p)] = _resolved(f"{dataset}/{name}", p)
                for cs in class_splits(SPLITS):  # cross-fitted tuned sets: the split picks one
                    over = [("data.class_split", cs.to_dict())]
                    configs[f"{p} split {cs.index}"] = _resolved(f"{dataset}/{name}", p, over)
            space = search_space(name, raw["estimators"][name])
            out[f"{dataset}/{name}"] = {
                "configs": configs,
                "space": {k: list(v) for k, v in space.items()},
            }
    return json.loads(json.dumps(out))  # tuples as lists, as the file holds them


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("write", "compare"))
    ap.add_argument("file", type=Path)
    a = ap.parse_args()
    now = snapshot()
    if a.action == "write":
        a.file.write_text(json.dumps(now, indent=1))
        print(f"{len(now)} recipes written to {a.file}")
        return 0
    ref = json.loads(a.file.read_text())
    diff = sorted(k for k in set(ref) | set(now) if ref.get(k) != now.get(k))
    # the key order too: the search space's order is the order Optuna draws in
    order = sorted(k for k in set(ref) & set(now) if json.dumps(ref[k]) != json.dumps(now[k]))
    n_cfg = sum(len(v["configs"]) for v in now.values())
    print(
        f"{len(now)} recipes, {n_cfg} resolved configs, {len(diff)} differ, {len(order)} differ "
        "in key order" + "".join(f"\n  {k}" for k in sorted({*diff, *order}))
    )
    return 1 if diff or order else 0


if __name__ == "__main__":
    sys.exit(main())
