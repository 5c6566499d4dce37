"""The multi-machine figures on a throwaway PostgreSQL server: runs planned, done, retried,
duplicated and lost after a killed worker and a database restart, and the claim latency of 16
workers on one storage.

Runs ``tests/sweeps/test_postgres_sweeps.py`` (which starts its own server and asserts the
figures: 0 duplicated, 0 lost) and writes its ``FIGURES`` / ``SENTINEL`` lines, with the
machine's load, to ``results/benchmarks/postgres_sweeps.txt``::

    python benchmarks/postgres_sweeps.py
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "benchmarks" / "postgres_sweeps.txt"


def main() -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    load_before = os.getloadavg()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:randomly", "-p", "no:xdist",
         "tests/sweeps/test_postgres_sweeps.py"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    lines = [
        line
        for line in proc.stdout.splitlines()
        if line.startswith(("FIGURES", "SENTINEL", "unreachable", "wrong password", "missing"))
    ]
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
    head = [
        f"# benchmarks/postgres_sweeps.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} "
        f"UTC, {platform.machine()}, {os.cpu_count()} cores (shared: load average "
        f"{load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after)",
        "# retried: runs started more than once (the killed worker's run); duplicated: runs "
        "with more than one finished record; lost: planned runs never finished",
        f"# pytest: {summary}",
    ]
    text = "\n".join(head + lines) + "\n"
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(text, end="")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
