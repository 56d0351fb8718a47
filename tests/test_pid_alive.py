"""`pid_alive`, which `laminar local-cluster down` and the tests wait on: a process is running
while any of its threads is, and one reaped between the signal and the read of /proc is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from laminar.local_cluster import pid_alive

#: a child whose main thread exits (a zombie) while another thread goes on, until killed
MAIN_THREAD_EXITS = """
import ctypes, sys, threading, time
threading.Thread(target=lambda: time.sleep(600), daemon=False).start()
print("started", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


def main_thread_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(") ", 1)[1][:1]


def test_a_running_child_is_alive_and_a_zombie_child_is_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        assert pid_alive(child.pid)
        assert child.stdin is not None
        child.stdin.close()
        deadline = time.monotonic() + 30
        while main_thread_state(child.pid) != "Z":  # exited, not reaped: a zombie
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()


def test_a_process_reaped_after_the_signal_is_not_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its /proc entry is gone
    monkeypatch.setattr(os, "kill", lambda pid, sig: None)  # as if signalled just before
    assert not pid_alive(child.pid)


def test_a_zombie_main_thread_with_another_thread_running_is_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", MAIN_THREAD_EXITS], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"started\n"
        deadline = time.monotonic() + 30
        while main_thread_state(child.pid) != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert pid_alive(child.pid)  # its other thread still runs (and holds its files)
        os.kill(child.pid, signal.SIGKILL)
        while pid_alive(child.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()


def test_a_thread_state_that_cannot_be_read_leaves_the_signals_word(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error other than "gone" reading a thread's state answers alive (the signal found the
    process), rather than raising out of `local-cluster down`'s wait."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    real_open = open

    def refusing_open(path: object, *args: object, **kwargs: object) -> object:
        if str(path).startswith(f"/proc/{child.pid}/task/"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    try:
        monkeypatch.setattr("builtins.open", refusing_open)
        assert pid_alive(child.pid)
    finally:
        monkeypatch.undo()
        child.kill()
        child.wait()
