"""The machine's limits that the benchmarks quote their results against."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
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


class Stalled(RuntimeError):
    """`run_in_group`'s command made no progress (its `stalled` check said so): killed."""


def run_in_group(
    command: Sequence[str],
    timeout_s: float,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    stalled: Callable[[], bool] | None = None,
    poll_s: float = 1.0,
) -> subprocess.CompletedProcess[str]:
    """Run `command` in its own process group, output captured, bounded by `timeout_s`. On a
    timeout (subprocess.TimeoutExpired), Ctrl-C or SIGTERM the whole group (a script and what
    it runs in the foreground) is killed before the exception goes on. With `stalled`, asked
    every `poll_s` while the command runs: once it answers True, the group is killed and
    Stalled raised."""
    proc = subprocess.Popen(
        list(command),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            left = deadline - time.monotonic()
            try:  # (communicate again after its timeout loses no output)
                stdout, stderr = proc.communicate(
                    timeout=max(0.0, left if stalled is None else min(left, poll_s))
                )
                break
            except subprocess.TimeoutExpired:
                if left <= poll_s or stalled is None:
                    raise subprocess.TimeoutExpired(list(command), timeout_s) from None
                if stalled():
                    raise Stalled(f"no progress: {' '.join(command)}") from None
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(list(command), proc.returncode, stdout, stderr)
