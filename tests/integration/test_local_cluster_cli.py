"""`laminar local-cluster up|down` where addresses are taken, brokers died, or nothing runs.

Every cluster is on a loopback /24 the test chose (never the default 127.0.0), real brokers;
"ours" is checked the way `up` checks it: the broker on the URL answers `GET /v1/cluster`
with that cluster's admin token, as that node.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from laminar.local_cluster import ClusterError, LocalCluster, get_json, pid_alive

from .conftest import loopback_prefix, make_cluster

pytestmark = pytest.mark.integration
LAMINAR = [sys.executable, "-m", "laminar", "local-cluster"]
GONE_S = 30.0


def run(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LAMINAR, *arguments], capture_output=True, text=True, timeout=120, check=False
    )


def pids_of(data_dir: Path) -> dict[str, int | None]:
    document = json.loads((data_dir / "cluster.json").read_text())
    return {node_id: node["pid"] for node_id, node in document["nodes"].items()}


def answers_as(cluster: LocalCluster, node_id: str) -> str | None:
    """The node id the broker on `node_id`'s URL gives `cluster`'s admin token (None: none)."""
    status, body = get_json(
        cluster.nodes[node_id].api_url + "/v1/cluster", cluster.token, ca_file=cluster.ca_file
    )
    return body.get("node_id") if status == 200 and isinstance(body, dict) else None


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + GONE_S
    while pid_alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still running"
        time.sleep(0.05)


@pytest.fixture
def other(tmp_path: Path) -> Iterator[LocalCluster]:
    """A one-broker cluster holding a /24 (without TLS, as the one it is mistaken for)."""
    cluster = make_cluster(tmp_path / "other", 1)
    yield cluster
    cluster.stop()


@pytest.fixture
def brought_up(tmp_path: Path) -> Iterator[Path]:
    """The data directory the test's `up` uses; whatever runs there is stopped at the end."""
    data_dir = tmp_path / "mine"
    yield data_dir
    if (data_dir / "cluster.json").exists():
        LocalCluster.load(data_dir).stop()


def test_up_on_an_explicit_prefix_in_use_fails_and_starts_nothing(
    other: LocalCluster, brought_up: Path
) -> None:
    up = run("up", "--nodes", "1", "--prefix", other.prefix, "--data-dir", str(brought_up))
    assert up.returncode == 1, up.stdout + up.stderr
    assert f"address in use: {other.prefix}.11:7070" in up.stderr, up.stderr
    assert "export LAMINAR_BROKERS" not in up.stdout and "Traceback" not in up.stderr
    running = [pid for pid in pids_of(brought_up).values() if pid is not None and pid_alive(pid)]
    assert running == []
    assert answers_as(other, "n1") == "n1"  # the other cluster is untouched


def test_a_url_answered_by_another_cluster_is_never_taken_for_ours(
    other: LocalCluster, tmp_path: Path
) -> None:
    """Were the addresses taken between the check and the start: the broker there refuses
    our token, so the start fails instead of reporting the other cluster's URL as ours."""
    mistaken = LocalCluster(tmp_path / "mistaken", 1, prefix=other.prefix)
    mistaken.credentials_path()  # its own admin token, as `start` makes it
    with pytest.raises(ClusterError, match="is not n1 of this cluster: it refuses"):
        mistaken.identify("n1")
    assert other.identify("n1") is True
    mistaken.start_node("n1")  # skipping the address check: it cannot listen
    try:
        with pytest.raises(ClusterError, match=r"not n1 of this cluster|in use"):
            mistaken.wait_ready()
    finally:
        mistaken.stop()


def test_up_without_a_prefix_moves_to_the_next_free_range(
    other: LocalCluster, brought_up: Path
) -> None:
    """A data directory's cluster comes back on its own range, or, when that is taken and no
    --prefix was given, on the next free one, which it says; the URLs it prints are its own."""
    mine = loopback_prefix()
    first = run("up", "--nodes", "1", "--prefix", mine, "--no-tls", "--detach",
                "--data-dir", str(brought_up))  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    assert run("down", "--data-dir", str(brought_up)).returncode == 0
    again = run("up", "--detach", "--data-dir", str(brought_up))  # its range is free: the same
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"export LAMINAR_BROKERS=http://{mine}.11:7070" in again.stdout, again.stdout
    assert run("down", "--data-dir", str(brought_up)).returncode == 0

    moved = LocalCluster(brought_up, 1, prefix=other.prefix)  # as if made on the other's range
    moved.save()
    up = run("up", "--detach", "--data-dir", str(brought_up))
    assert up.returncode == 0, up.stdout + up.stderr
    cluster = LocalCluster.load(brought_up)
    assert cluster.prefix != other.prefix
    assert f"{other.prefix}.11:7070" in up.stderr and f"using {cluster.prefix}.*" in up.stderr
    assert f"export LAMINAR_BROKERS=http://{cluster.prefix}.11:7070" in up.stdout, up.stdout
    assert answers_as(cluster, "n1") == "n1"
    assert answers_as(other, "n1") == "n1"


def test_up_restarts_the_missing_brokers_and_down_counts_what_it_stopped(
    brought_up: Path,
) -> None:
    prefix = loopback_prefix()
    up = run("up", "--nodes", "2", "--prefix", prefix, "--no-tls", "--detach",
             "--data-dir", str(brought_up))  # fmt: skip
    assert up.returncode == 0, up.stdout + up.stderr
    before = pids_of(brought_up)
    killed = before["n2"]
    assert killed is not None
    os.kill(killed, signal.SIGKILL)
    wait_gone(killed)

    changed = run("up", "--detach", "--prefix", loopback_prefix(), "--data-dir", str(brought_up))
    assert changed.returncode == 1 and "down` first" in changed.stderr, changed.stderr

    again = run("up", "--detach", "--data-dir", str(brought_up))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "started n2; n1 already running" in again.stdout, again.stdout
    after = pids_of(brought_up)
    assert after["n1"] == before["n1"] and after["n2"] not in (None, killed)
    cluster = LocalCluster.load(brought_up)
    assert cluster.nodes["n2"].host == f"{prefix}.12"  # its own address and data directory
    assert answers_as(cluster, "n2") == "n2"

    whole = run("up", "--detach", "--data-dir", str(brought_up))
    assert whole.returncode == 1 and "n1, n2 already running" in whole.stderr, whole.stderr

    down = run("down", "--data-dir", str(brought_up))
    assert down.returncode == 0 and "stopped 2 brokers: n1, n2" in down.stdout, down.stdout
    assert not any(pid_alive(pid) for pid in after.values() if pid is not None)
    second = run("down", "--data-dir", str(brought_up))
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == f"no brokers running in {brought_up}"


def test_down_on_a_missing_data_directory_says_so(tmp_path: Path) -> None:
    down = run("down", "--data-dir", str(tmp_path / "nothing-here"))
    assert down.returncode == 1
    assert f"no local cluster in {tmp_path / 'nothing-here'}" in down.stderr, down.stderr
    assert "Traceback" not in down.stderr
