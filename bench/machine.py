"""The machine's limits that the benchmarks quote their results against."""

from __future__ import annotations

import os
import time
from pathlib import Path


def fdatasync_per_s(directory: Path, seconds: float = 2.0) -> float:
    """4 KiB writes, each fdatasync'd, per second on `directory`'s disk."""
    path = directory / f".fsync-probe-{os.getpid()}"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        block = os.urandom(4096)
        count = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            os.write(fd, block)
            os.fdatasync(fd)
            count += 1
        return round(count / (time.perf_counter() - started), 1)
    finally:
        os.close(fd)
        path.unlink()


CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of process `pid` (all its threads) in seconds; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S
    except (OSError, IndexError, ValueError):
        return None


def load_avg_1m() -> float:
    """The machine's 1-minute load average."""
    return round(os.getloadavg()[0], 2)
