"""Real crashes: a child process appending to a SegmentedLog is killed with SIGKILL.

The child (crash_child.py) appends in rounds and acknowledges a round's batches once one
`sync` covers them, as the broker's driver does. On reopen, every batch it acknowledged is
present, in order, with its content, and no torn batch is ever served. The log is killed
several times in a row, so recovery also runs on logs that were recovered before.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from laminar.log import FileDirectory, SegmentedLog

from .crash_child import CONFIG
from .helpers import read_records

REPO = Path(__file__).resolve().parents[2]
KILLS = 6
MAX_CHILD_SECONDS = 20


def run_and_kill(
    path: str, seed: int, acks_before_kill: int, delay_s: float
) -> list[tuple[int, int, int]]:
    """Run the child until it has acknowledged `acks_before_kill` batches, then `delay_s`
    more (so the kill lands anywhere in a round, not just after a sync); SIGKILL it."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.log.crash_child", path, str(seed)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    acks: list[tuple[int, int, int]] = []
    deadline = time.monotonic() + MAX_CHILD_SECONDS
    try:
        while len(acks) < acks_before_kill and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            if line.startswith("ack "):
                _, base, tag, count = line.split()
                acks.append((int(base), int(tag), int(count)))
        time.sleep(delay_s)
    finally:
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate(timeout=30)
    for line in rest.splitlines():
        if line.startswith("ack "):  # reported before the kill: durable too
            _, base, tag, count = line.split()
            acks.append((int(base), int(tag), int(count)))
    assert child.returncode == -signal.SIGKILL
    return acks


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkill_during_appends_loses_nothing_acknowledged(tmp_path: Path, seed: int):
    rng = random.Random(seed)
    path = str(tmp_path / "log")
    acknowledged: dict[int, tuple[int, int]] = {}
    cuts = 0
    for _ in range(KILLS):
        kill = run_and_kill(path, seed, rng.randint(20, 400), rng.uniform(0, 0.01))
        for base, tag, count in kill:
            acknowledged[base] = (tag, count)
        log = SegmentedLog.open(FileDirectory(path), CONFIG)
        cuts += bool(log.recovery.cuts)
        records = dict(read_records(log))  # verifies every batch's checksum on the way
        for base, (tag, count) in acknowledged.items():
            for i in range(count):
                value = records[base + i]
                assert value is not None and value.rstrip(b".") == f"{tag}.{i}".encode()
        log.close()
    assert len(acknowledged) > KILLS * 20
    # Kills land mid-stream most of the time; recovery must have had torn bytes to cut.
    assert cuts > 0
    assert os.listdir(path)
