"""``bayesurl`` CLI that records its peak resident memory (used by ``evaluator.py --distributed``).

Writes ``rank{RANK}.json`` into ``$BAYESURL_RSS_DIR`` with ``base``, the RSS once the
evaluation modules are imported, and ``peak``, the largest RSS sampled every 2 ms while the
command runs (import-time spikes are not counted), ``seconds`` / ``cpu``, the command's wall
and CPU time after the imports (the CPU time does not depend on what else the machine runs).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


if __name__ == "__main__":
    import torch
    import torch.distributed  # noqa: F401

    import bayesurl.commands.evaluate  # noqa: F401  (imported before the baseline)
    import bayesurl.evaluation  # noqa: F401
    from bayesurl.cli import main

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    base = peak = _rss()
    stop = threading.Event()

    def poll() -> None:
        global peak
        while not stop.is_set():
            peak = max(peak, _rss())
            time.sleep(0.002)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    t0, c0 = time.perf_counter(), time.process_time()
    code = main(sys.argv[1:])
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    stop.set()
    th.join()
    peak = max(peak, _rss())
    out = Path(os.environ["BAYESURL_RSS_DIR"]) / f"rank{os.environ.get('RANK', '0')}.json"
    out.write_text(json.dumps({"peak": peak, "base": base, "seconds": seconds, "cpu": cpu}))
    sys.exit(code)
