"""``bayesurl`` CLI that records its peak resident memory (used by ``evaluator.py --distributed``).

Writes ``rank{RANK}.json`` into ``$BAYESURL_RSS_DIR`` with

- ``base`` / ``peak``: the resident set (``/proc/self/statm``) once the evaluation modules are
  imported, and its largest value sampled every 2 ms while the command runs (import-time
  spikes are not counted);
- ``anon_base`` / ``anon_peak``: the same for the anonymous part (``RssAnon``: the process's
  own data -- arrays, buffers, the allocator's heap), which the memory bound describes;
- ``file_base`` / ``file_peak``: the file-backed part (``RssFile + RssShmem``): library code
  paged in when a kernel first runs, shared between processes and independent of N;
- ``seconds`` / ``cpu``: the command's wall and CPU time after the imports (the CPU time does
  not depend on what else the machine runs); with ``--nproc-per-node W`` each forked rank
  records itself from its start (after the fork) to its end;
- ``phases`` (with ``BAYESURL_RSS_PHASES=1``): RSS / RssAnon / file-backed MiB above the
  baseline at the boundaries of the evaluation's phases (reading the shard, validation,
  normalising, the search and its ring steps, the gathers and metrics), for explaining a peak.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

MiB = 2**20


def _rss() -> tuple[int, int, int]:
    """Resident, anonymous and file-backed (+ shared memory) bytes of this process."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "RssAnon", "RssFile", "RssShmem")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out["VmRSS"], out["RssAnon"], out["RssFile"] + out["RssShmem"]


def _instrument(log: list, base: tuple[int, int, int]) -> None:
    """Record the RSS at the entry and exit of the evaluation's phases (monkeypatched)."""
    import bayesurl.commands.evaluate as CE
    import bayesurl.distributed as D
    import bayesurl.evaluation.evaluator as EV
    import bayesurl.evaluation.functional as Fm
    import bayesurl.search.exact as K  # normalize and search as search_shards calls them

    def mark(name: str) -> None:
        log.append([name, *(round((v - b) / MiB, 1) for v, b in zip(_rss(), base))])

    def wrap(mod: object, attr: str, name: str) -> None:
        f = getattr(mod, attr)

        def g(*a: object, **kw: object) -> object:
            mark(name + ">")
            out = f(*a, **kw)
            mark(name + "<")
            return out

        setattr(mod, attr, g)

    for mod, attr, name in [
        (CE, "load_npz_shard", "read"),
        (CE, "load_npz", "read"),
        (EV, "_prepare", "validate"),
        (K, "normalize", "normalize"),
        (K, "search", "search"),
        (D.Shards, "gather", "gather"),
        (Fm, "map_from_neighbors", "map"),
        (Fm, "r_auroc", "r_auroc"),
        (Fm, "sparsification_curve", "sparsification"),
    ]:
        wrap(mod, attr, name)
    ring = D.ring_chunks

    def ring_logged(*a: object, **kw: object):  # noqa: ANN202
        for j, item in enumerate(ring(*a, **kw)):
            mark(f"ring step {j}")
            yield item

    D.ring_chunks = ring_logged


def _measured(fn, log_phases: bool):  # noqa: ANN001, ANN202
    """``fn`` recording this process's time and peak memory into ``rank{RANK}.json``."""

    def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        import torch

        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        base = _rss()
        peak = list(base)
        log: list = []
        if log_phases:
            _instrument(log, base)
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                for j, v in enumerate(_rss()):
                    peak[j] = max(peak[j], v)
                time.sleep(0.002)

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        t0, c0 = time.perf_counter(), time.process_time()
        code = fn(*args, **kwargs)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        stop.set()
        th.join()
        for j, v in enumerate(_rss()):
            peak[j] = max(peak[j], v)
        out = Path(os.environ["BAYESURL_RSS_DIR"]) / f"rank{os.environ.get('RANK', '0')}.json"
        record = {
            "peak": peak[0],
            "base": base[0],
            "anon_peak": peak[1],
            "anon_base": base[1],
            "file_peak": peak[2],
            "file_base": base[2],
            "seconds": seconds,
            "cpu": cpu,
        }
        if log:
            record["phases"] = log
        out.write_text(json.dumps(record))
        return code

    return run


if __name__ == "__main__":
    import gc

    import torch
    import torch.distributed  # noqa: F401

    import bayesurl.commands.evaluate as CE  # imported before the baseline
    import bayesurl.evaluation  # noqa: F401
    from bayesurl.cli import main

    phases = os.environ.get("BAYESURL_RSS_PHASES") == "1"
    if "--nproc-per-node" in sys.argv:
        # the ranks are forked from this process: each measures itself from its start
        CE._run_distributed = _measured(CE._run_distributed, phases)
        code = main(sys.argv[1:])
    else:
        code = _measured(main, phases)(sys.argv[1:])
    gc.freeze()  # as the console script exits (bayesurl.cli.console_main)
    sys.exit(code)
