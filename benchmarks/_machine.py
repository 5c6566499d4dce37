"""What machine a benchmark ran on, for the header of its result file: the processor, the
vector extensions the products can use, and the load (``uptime``) before and after.

Imported by the scripts of this folder (``python benchmarks/NAME.py`` puts the folder on the
path).
"""

from __future__ import annotations

import os
import platform
import subprocess

#: The extensions the exact search and the feature products can use.
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def _cpuinfo_field(name: str) -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(name):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_name() -> str:
    """The processor's model name (``/proc/cpuinfo``), else the platform's word for it."""
    return _cpuinfo_field("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_flags(want: tuple[str, ...] = VECTOR_FLAGS) -> str:
    """Those of ``want`` the processor has, space-separated (``"unknown"`` without
    ``/proc/cpuinfo``)."""
    flags = _cpuinfo_field("flags")
    if flags is None:
        return "unknown"
    have = set(flags.split())
    return " ".join(w for w in want if w in have)


def uptime() -> str:
    """``uptime``'s line (the load averages), or the load averages alone without it."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        load = os.getloadavg()
        return f"load average: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}"
