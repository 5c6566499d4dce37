"""
Scale out with torchrun
=======================

Everything in bayesurl runs unchanged under ``torchrun``. On a machine with several GPUs::

    torchrun --nproc_per_node=2 -m bayesurl train --method mcinfonce --dataset fashion_mnist \\
        --epochs 10 --batch-size 128 --out runs/mcinfonce

starts two processes; each reads ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` from the
environment, and :mod:`bayesurl.distributed` does the
rest:

- :func:`~bayesurl.distributed.init_from_env` initialises the process group
  (``nccl`` on GPUs, ``gloo`` on CPU) and returns this rank's device; without torchrun it
  returns rank 0 of 1 and the same script runs in one process;
- :func:`bayesurl.training.fit` wraps the method in ``DistributedDataParallel`` (gradients
  are averaged, so 2 ranks x batch 128 follow the path of one process with batch 256, as
  the URL benchmark's large batches need, URL appendix B), shards the loader with a
  ``DistributedSampler``, and lets only rank 0 print and write checkpoints;
- evaluation is sharded too: each rank embeds its contiguous rows
  (:func:`~bayesurl.distributed.shard_range`) and calls
  :func:`bayesurl.evaluate` with ``distributed=True``. Every rank searches its own queries
  over every rank's rows, which pass by in bounded chunks
  (:func:`~bayesurl.search.knn_sharded`), so no rank ever holds all ``N x D``
  embeddings; each rank scores its own queries and only per-query scalars (hit flags,
  AP@k, u, labels) are gathered, and every rank gets the metrics of one process, ties
  included. The sampling-aware ECE is sharded the same way. The command line does it for
  you::

    torchrun --nproc_per_node=2 -m bayesurl evaluate embeddings.npz --json metrics.json

  (each rank reads only its rows of the ``.npz``). On one machine the command can start the
  ranks itself, forked from its own interpreter once the libraries are imported
  (:func:`~bayesurl.distributed.launch_local`, torchrun's environment, the cores shared
  between the ranks unless ``OMP_NUM_THREADS`` says otherwise; on a CUDA ``--device`` the
  ranks are spawned instead, since a forked process cannot use CUDA after its parent
  queried it)::

    bayesurl evaluate embeddings.npz --nproc-per-node 2 --json metrics.json

  torchrun's launcher imports torch once more and each rank imports everything again, which
  cost about 1.4-1.8 s on the 2-core CPU machine. Measured there (N = 60k, D = 256, one
  thread per process, gloo, medians of 3): one process 22.2 s for the whole command,
  ``--nproc-per-node 2`` 12.3 s (0.55x), ``torchrun --nproc_per_node 2`` 13.7 s (0.62x);
  the metrics identical.

  The neighbours do not depend on the number of ranks, exact ties included: a float32
  matrix product's last bits depend on the block's shape and the item's position in it, so
  the search trusts the block products' order only where their error bound separates the
  candidates and recomputes the others per pair in float64 (:doc:`/concepts/metrics`).

  Memory per rank shrinks with the number of ranks ``W``: its shard of the embeddings
  (normalised in place, ``evaluate(..., copy=False)``), the two ring buffers of at most
  8 MiB that bring the other shards past it, and its similarity block, which gets
  ``memory_budget / W`` (:func:`~bayesurl.search.rank_budget`; 256 MiB in one process,
  so 128 MiB of budget -- a 64 MiB block -- per rank with 2 ranks), plus the BLAS's own
  packing workspace (3.3 MiB) and the top-k. At N = 60k, D = 256 a rank's data peaked at
  123 MiB against that bound of 131 MiB. A rank's own shard is searched whole; only the
  other ranks' shards come in chunks. ``python benchmarks/evaluator.py --distributed 2
  --n 60000 --d 256`` prints the times of the whole command (1 process, torchrun, forked
  ranks), each rank's peak next to this bound term by term (``--phases`` for the RSS at
  each phase, ``--sweep-n 60000 120000`` for larger N, where start-up weighs less).
  ``bayesurl evaluate`` imports neither torchmetrics nor torchvision, so each rank starts in
  the time of ``import torch`` plus about half a second.

The run pipeline does the same end to end. ``bayesurl run`` under ``torchrun`` trains a
registry method with DDP, then each rank embeds only its contiguous block of whole batches of
the downstream test, held-out and OOD sets (:func:`bayesurl.runs.predict.batch_shard`; draws
seeded by global batch index) and the zero-shot evaluation is sharded as above; every rank
evaluates rank 0's model (the checkpoint's) and rank 0 prints and writes ``result.json``. The
metrics, the draw-based ECE included, are those of one process evaluating the same model. A
trained checkpoint is evaluated the same way::

    torchrun --nproc_per_node=2 -m bayesurl run fashion_mnist/mcinfonce --preset quick \\
        --set device=cpu --out runs/mcinfonce
    torchrun --nproc_per_node=2 -m bayesurl evaluate --checkpoint runs/mcinfonce/last.pt \\
        --json metrics.json

Inside your own training loop, ``fit(..., hooks=[EpochEvaluation(epoch_evaluator(data))])``
(:func:`bayesurl.runs.predict.epoch_evaluator`) scores every epoch sharded. Post-hoc and LAM
estimators do not train distributed; ``bayesurl run`` refuses them under ``torchrun``.

**Sweeps under torchrun.** ``bayesurl benchmark`` runs the same way: the sweep opens one
process group, every rank runs the same runs in the same order (each method trained with DDP
and evaluated sharded, as ``bayesurl run`` does), and rank 0 alone prints the table and writes
``results.json`` / ``results.csv`` / the plot (and, with ``--save-checkpoints``, each run's
checkpoint)::

    torchrun --nproc_per_node=2 -m bayesurl benchmark --preset quick \\
        --methods ce,mcinfonce,elk --seeds 0,1,2 --out runs/benchmark

Only estimators of kind ``method`` train under DDP: a list with post-hoc or LAM estimators
(the default list has five) is refused before anything runs, in one error naming them and
listing the distributed ones to pass to ``--methods``. The stored protocol (``--preset
standard`` or ``--storage``, :doc:`../concepts/benchmark_protocol`) works too: rank 0 alone
opens the sweep storage, claims each run and sends it to the other ranks, so all ranks run
the same run together (its mixed R-AUROC is computed from every rank's rows) and rank 0
stores it; under torchrun it does not wait for runs claimed by other workers, and
``--worker`` and ``--tune`` are refused there (a worker may wait an hour for another
machine's plan, longer than the other ranks may wait in a collective; Optuna's trials run in
one process). To spread a protocol sweep over GPUs without DDP, start one worker per GPU
instead (``CUDA_VISIBLE_DEVICES=k bayesurl benchmark --worker --storage URL``).

This page runs a real two-process job with the ``gloo`` backend on CPU, on tiny data.
"""

# %%
# The per-rank script
# -------------------
# This is what each process runs. We write it to a temporary folder and start it with
# ``python -m torch.distributed.run`` (that is, ``torchrun``) in a subprocess.
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

WORKER = r"""
import json, sys, warnings
import torch
from torch.utils.data import TensorDataset
import bayesurl
import bayesurl.methods
from bayesurl.data import as_tensors, default_transform, default_zero_shot, make_loader
from bayesurl.training import fit
from bayesurl import distributed as D

torch.set_num_threads(1)
info = D.init_from_env(device="cpu")  # gloo process group from torchrun's variables
out = sys.argv[1]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    data = default_zero_shot(max_train=512, max_test=400, val_fraction=0.0)
x, y = as_tensors(data.train, default_transform(1))
torch.manual_seed(0)  # identical initial weights on every rank
method = bayesurl.methods.create(
    "ce", backbone="small_convnet", embed_dim=16, num_classes=data.num_train_classes
)
loader = make_loader(TensorDataset(x, y), 32, shuffle=True, seed=0)  # sharded: 256 per rank
res = fit(method, loader, epochs=3, optimizer="adamw", lr=3e-3, seed=0, progress=False)

# sharded evaluation: each rank embeds its contiguous rows of the test set and evaluates
# them against every rank's rows; no rank holds the whole gallery
x_test, y_test = as_tensors(data.test, default_transform(1))
lo, hi = D.shard_range(len(y_test))
method.eval()
with torch.no_grad():
    o = method(x_test[lo:hi])
res_sharded = bayesurl.evaluate(o.embedding, y_test[lo:hi], uncertainties=o.uncertainty,
                                distributed=True)
record = {"rank": info.rank, "world_size": info.world_size, "backend": info.backend,
          "n_local": len(loader.dataset) if info.world_size == 1 else len(list(loader.sampler)),
          "losses": res.losses, "n_eval_rows": hi - lo,
          "metrics": {k: v for k, v in res_sharded.items() if isinstance(v, float)},
          "intervals": {k: list(v) for k, v in res_sharded["intervals"].items()}}
# for this page only: gather everything on rank 0 and compare with one process
emb, u = D.all_gather_tensors(o.embedding), D.all_gather_tensors(o.uncertainty)
if D.is_main_process():
    one = bayesurl.evaluate(emb, y_test, uncertainties=u)
    record["one_process"] = {k: v for k, v in one.items() if isinstance(v, float)}
    record["one_process_intervals"] = {k: list(v) for k, v in one["intervals"].items()}
    record["one_process_line"] = one.describe(["r@1", "r_auroc", "ausc", "map@5"])
with open(f"{out}/rank{info.rank}.json", "w") as f:
    json.dump(record, f)
D.cleanup()
"""

# %%
# Launch two processes
# --------------------
tmp = Path(tempfile.mkdtemp())
(tmp / "worker.py").write_text(WORKER)
env = dict(os.environ, OMP_NUM_THREADS="1")
proc = subprocess.run(
    [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--standalone",
        str(tmp / "worker.py"),
        str(tmp),
    ],
    capture_output=True,
    text=True,
    env=env,
    timeout=600,
    check=False,
)
if proc.returncode != 0:
    raise RuntimeError(proc.stderr[-3000:])
ranks = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]
for r in ranks:
    print(
        f"rank {r['rank']}/{r['world_size']} ({r['backend']}): {r['n_local']} training images, "
        f"{len(r['losses'])} steps, evaluated {r['n_eval_rows']} of the test rows"
    )
keys = ("r@1", "r_auroc", "ausc", "map@5")
for r in ranks:
    print(f"rank {r['rank']} sharded:", {k: round(r["metrics"][k], 4) for k in keys})
print("one process:     ", {k: round(ranks[0]["one_process"][k], 4) for k in keys})
assert all(r["metrics"] == ranks[0]["one_process"] for r in ranks)  # identical, ties included
# the 95 % intervals over the queries too, the bootstrap's included (seeded, gathered data)
print("with intervals:  ", ranks[0]["one_process_line"])
assert all(r["intervals"] == ranks[0]["one_process_intervals"] for r in ranks)
# the docs build checks the figure: 24 steps learn embeddings well above chance (0.2)
r1 = ranks[0]["one_process"]["r@1"]
assert 0.5 <= r1 <= 0.72, f"R@1 {r1:.3f} outside [0.5, 0.72]"

# %%
# Per-rank loss curves
# --------------------
# Each rank sees a different shard, so its batch losses differ, but after every step the
# averaged gradient keeps the weights identical on both ranks: the curves fall together.
fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
for r in ranks:
    ax.plot(r["losses"], "o-", ms=3, label=f"rank {r['rank']}")
ax.set(
    xlabel="optimiser step",
    ylabel="cross-entropy (local batch)",
    title="two gloo processes, DDP-averaged gradients",
)
ax.legend()
plt.show()
