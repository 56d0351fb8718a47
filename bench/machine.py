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
