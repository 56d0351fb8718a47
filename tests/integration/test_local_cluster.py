"""`laminar local-cluster up|status|down`, detached and in the foreground (Ctrl-C)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from laminar.local_cluster import LocalCluster, pid_alive, probe

from .conftest import interruptible, loopback_prefix

pytestmark = pytest.mark.integration
LAMINAR = [sys.executable, "-m", "laminar"]


def brokers_of(data_dir: Path) -> list[int]:
    document = json.loads((data_dir / "cluster.json").read_text())
    return [node["pid"] for node in document["nodes"].values()]


def test_detached_up_status_down(tmp_path: Path) -> None:
    data_dir = tmp_path / "detached"
    prefix = loopback_prefix()
    up = subprocess.run(
        [
            *LAMINAR,
            "local-cluster",
            "up",
            "--nodes",
            "2",
            "--detach",
            "--prefix",
            prefix,
            "--data-dir",
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"n1  http://{prefix}.11:7070" in up.stdout and "LAMINAR_BROKERS=" in up.stdout
        status = subprocess.run(
            [*LAMINAR, "local-cluster", "status", "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.stdout.count("ready") == 2, status.stdout
        again = subprocess.run(
            [*LAMINAR, "local-cluster", "up", "--data-dir", str(data_dir), "--detach"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        down = subprocess.run(
            [*LAMINAR, "local-cluster", "down", "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert down.returncode == 0 and "stopped 2 brokers" in down.stdout
    assert all(not pid_alive(pid) for pid in brokers_of(data_dir))
    for line in (data_dir / "n1" / "broker.log").read_text().splitlines()[-3:]:
        assert "Traceback" not in line


def test_foreground_up_stops_on_ctrl_c(tmp_path: Path) -> None:
    data_dir = tmp_path / "foreground"
    prefix = loopback_prefix()
    process = subprocess.Popen(
        [
            *LAMINAR,
            "local-cluster",
            "up",
            "--nodes",
            "1",
            "--prefix",
            prefix,
            "--data-dir",
            str(data_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=interruptible,
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        lines = []
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            lines.append(line)
            if "Ctrl-C" in line or not line:
                break
        assert "running; Ctrl-C stops the cluster" in "".join(lines), lines
        assert probe(f"http://{prefix}.11:7070/readyz") == 200
        pids = brokers_of(data_dir)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        assert all(not pid_alive(pid) for pid in pids)
    finally:
        if process.poll() is None:
            process.kill()
            LocalCluster.load(data_dir).stop()
