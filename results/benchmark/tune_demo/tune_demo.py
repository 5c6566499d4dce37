"""Script of this result (see README.md); kept as it was run."""

import json
import sys
import time

import torch

from bayesurl.data.class_splits import class_splits
from bayesurl.runs.protocol import ProtocolPreset, pipeline_run_fn, tune_estimators
from bayesurl.runs.storage import SweepStorage

torch.set_num_threads(1)
out = sys.argv[1]
p = ProtocolPreset(
    "tune_demo",
    recipe_preset="quick",
    overrides=("train.epochs=2",),
    n_splits=1,
    max_train=1500,
    max_test=3000,
    max_id=1000,
    max_ood=500,
)
fn = pipeline_run_fn(preset=p, device="cpu")
store = SweepStorage(out=out, sweep="tune_demo")
t = time.time()
chosen = tune_estimators(
    ["ce", "losspred"],
    int(sys.argv[2]),
    fn,
    store,
    split=class_splits(4)[0],
    out=out,
    log=lambda s: print(s, flush=True),
)
print(json.dumps(chosen, indent=1))
print("WALL", time.time() - t)
