"""What every adapter reports about the host: the CPU's brand name. NumPy-free, library-free."""

from __future__ import annotations

import platform
from functools import cache


@cache
def cpu_name() -> str:
    """The CPU's brand string (``/proc/cpuinfo``'s model name), else what ``platform`` knows."""
    # platform.processor() is empty on most Linux systems; /proc/cpuinfo has the brand string.
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
