"""Two real brokers gossip across the veth pair with the router loaded on one end; a forged
sender of another cluster is dropped in the kernel: its datagrams never reach the broker (its
user-space drop counter stays put), until the router is unloaded."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from laminar.workers import broker_of, usable_cores
from laminar.xdp import CLASSES

from ..netns import Host, veth_pair
from .conftest import SECRET, bpffs, gossip_datagram, laminar_xdp, send_udp

CLUSTER = "prod.demo"
GOSSIP = 7072
WAIT_S = 60.0
FORGED = 50


def http_get(host: Host, url: str) -> str:
    script = (
        "import sys, urllib.request\n"
        "try:\n"
        "    print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())\n"
        "except OSError:\n"
        "    pass\n"
    )
    return host.run(sys.executable, "-c", script, url).stdout


def alive_members(host: Host) -> int:
    """The brokers `host`'s broker counts alive (each of their workers is a member)."""
    body = http_get(host, f"http://{host.address}:7070/v1/cluster")
    if not body.strip():
        return 0
    members = json.loads(body)["members"]
    return len({broker_of(m["id"]) for m in members if m["state"] == "alive"})


def wrong_cluster_drops(host: Host) -> int:
    metrics = http_get(host, f"http://{host.address}:7070/metrics")
    found = re.search(
        r'^laminar_swim_dropped_datagrams_total\{reason="wrong_cluster"(,worker="0")?\} (\S+)$',
        metrics,
        re.M,
    )
    return int(float(found.group(2))) if found else 0


def wait_until(what: str, probe: Callable[[], object], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


@pytest.fixture()
def brokers(
    router_object: Path, tmp_path: Path
) -> Iterator[tuple[Host, Host, Path, list[subprocess.Popen[bytes]]]]:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    with veth_pair() as (a, b), bpffs(tmp_path / "bpf") as fs:
        pins = fs / "laminar"
        laminar_xdp(b, pins, "load", "--iface", b.iface, "--object", str(router_object),
                    "--cluster-id", CLUSTER)  # fmt: skip
        processes = []
        try:
            for host, peer, node in ((a, b, "a"), (b, a, "b")):
                command = [
                    "ip", "netns", "exec", host.netns, sys.executable, "-m", "laminar", "serve",
                    "--node-id", node, "--data-dir", str(tmp_path / node), "--host", host.address,
                    "--seeds", f"{peer.address}:{GOSSIP}", "--initial-nodes", "a,b",
                    "--cluster-id", CLUSTER, "--secret-file", str(secret),
                    "--xdp-pin-dir", str(pins),
                    # the API is only read for membership and counters here (no tokens)
                    "--allow-anonymous",
                ]  # fmt: skip
                with open(tmp_path / f"{node}.log", "wb") as log:
                    processes.append(
                        subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
                    )
            yield a, b, pins, processes
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def test_gossip_works_through_the_router_and_forged_gossip_never_reaches_the_broker(
    brokers: tuple[Host, Host, Path, list[subprocess.Popen[bytes]]],
) -> None:
    a, b, pins, _ = brokers
    wait_until(
        "both brokers see two alive members", lambda: alive_members(a) == alive_members(b) == 2
    )
    assert http_get(a, f"http://{b.address}:7070/healthz")  # across the veth: class api

    def counted() -> dict[str, dict[str, int]]:
        shown: dict[str, dict[str, int]] = json.loads(laminar_xdp(b, pins, "stats"))
        return shown

    # Raft between the two (the metadata group) is peer traffic
    wait_until("peer traffic", lambda: counted()["peer"]["packets"] > 0)
    before = counted()
    assert before["membership"]["packets"] > 0 and before["membership"]["drops"] == 0
    assert before["api"]["packets"] > 0

    forged = gossip_datagram("someone.else")
    for _ in range(FORGED):
        send_udp(a, b.address, GOSSIP, forged)
    assert counted()["membership"]["drops"] == FORGED
    metrics = http_get(b, f"http://{b.address}:7070/metrics")
    # (the broker runs the default, one worker per usable core: worker 0 exports the counters)
    label = ',worker="0"' if usable_cores() > 1 else ""
    assert f'laminar_xdp_drops_total{{class="membership"{label}}} {FORGED}.0' in metrics
    assert metrics.count("laminar_xdp_drops_total{") == len(CLASSES)  # once, not per worker
    assert wrong_cluster_drops(b) == 0  # not one reached user space
    assert alive_members(a) == alive_members(b) == 2

    # without the router the broker itself has to look at (and drop) every forged datagram
    laminar_xdp(b, pins, "unload", "--iface", b.iface)
    for _ in range(FORGED):
        send_udp(a, b.address, GOSSIP, forged)
    wait_until("the broker dropped them itself", lambda: wrong_cluster_drops(b) == FORGED)
