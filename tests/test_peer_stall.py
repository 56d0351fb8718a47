"""The benches' stall watch: `machine.run_in_group` kills a command found stalled, and
`nats_peer.StreamProgress` calls a publish stalled only once its stream stopped growing."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from machine import Stalled, run_in_group
from nats_peer import StreamProgress

#: how long a killed process group may take to be gone (an event waited for, not a sleep)
GONE_WITHIN_S = 10.0


def _gone(pid: int) -> bool:
    """Whether process `pid` has ended (exited or reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_command_found_stalled_is_killed_with_its_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"

    def stalled() -> bool:  # once the command's child is known
        return pid_file.exists() and pid_file.read_text().strip() != ""

    command = ["bash", "-c", f"sleep 60 & echo $! > {pid_file}; wait"]
    with pytest.raises(Stalled):
        run_in_group(command, 60, stalled=stalled, poll_s=0.1)
    child = int(pid_file.read_text())
    deadline = time.monotonic() + GONE_WITHIN_S
    while not _gone(child):  # the background sleep, in the group, was killed too
        assert time.monotonic() < deadline, f"pid {child} still runs"
        time.sleep(0.05)


def test_the_time_limit_holds_while_the_command_is_not_stalled() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_in_group(["sleep", "60"], 0.5, stalled=lambda: False, poll_s=0.1)


def test_a_command_that_ends_gives_its_output_under_the_watch() -> None:
    done = run_in_group(["bash", "-c", "echo out; echo err >&2"], 30, stalled=lambda: False)
    assert (done.returncode, done.stdout, done.stderr) == (0, "out\n", "err\n")


class _Readings:
    """Counts and clock readings handed out in order, one pair per check."""

    def __init__(self, pairs: list[tuple[int, float]]) -> None:
        self.pairs = list(pairs)
        self.now = 0.0

    def count(self) -> int:
        count, self.now = self.pairs.pop(0)
        return count

    def clock(self) -> float:
        return self.now


def _checks(pairs: list[tuple[int, float]]) -> list[bool]:
    readings = _Readings(pairs)
    progress = StreamProgress(readings.count, readings.clock, stall_s=15.0)
    return [progress() for _ in pairs]


@pytest.mark.parametrize(
    ("readings", "answers"),
    [
        # cpurun.py waits for an idle machine before jsbench starts: no message meanwhile
        ([(0, 0.0), (0, 30.0), (0, 100.0)], [False] * 3),
        # stopped growing: stalled once the limit has passed since the last change
        ([(0, 0.0), (5, 1.0), (5, 10.0), (5, 15.9), (5, 16.0)], [False] * 4 + [True]),
        # each message taken restarts the count
        ([(0, 0.0), (5, 1.0), (6, 14.0), (6, 28.9), (6, 29.0)], [False] * 4 + [True]),
    ],
    ids=["never-moved-is-not-stalled", "stopped-is-stalled-after-the-limit", "a-message-restarts"],
)
def test_a_publish_is_stalled_only_once_its_stream_stopped_growing(
    readings: list[tuple[int, float]], answers: list[bool]
) -> None:
    assert _checks(readings) == answers
