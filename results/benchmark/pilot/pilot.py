"""Script of this result (see README.md); kept as it was run."""

import sys
import time

import torch

from bayesurl.runs.protocol import ProtocolPreset, run_protocol

torch.set_num_threads(1)
p = ProtocolPreset(
    "pilot",
    recipe_preset="quick",
    n_splits=4,
    seeds=(0,),
    max_train=4000,
    max_test=4000,
    max_id=2000,
    max_ood=1000,
    smoke=True,
    note="quick-scale pilot: 4,000 images x 3 epochs, 4,000 queries",
)
worker = sys.argv[1] == "worker"
t = time.time()
res = run_protocol(
    None if worker else "ce,losspred,mcinfonce,sngp,elk".split(","),
    preset=p,
    out="/tmp/bench_pilot/out",
    worker=worker,
    poll=5,
    heartbeat_interval=30,
    log=lambda s: print(s, flush=True),
)
print("WALL", time.time() - t, res, flush=True)
