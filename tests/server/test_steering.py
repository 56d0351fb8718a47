"""The steer port (docs/workers.md, routing layer 3): real sockets, on loopback and over a veth
pair between two network namespaces the test makes; the kernel's choice of socket for each
connection, by the eBPF program and by the classic one; the fall back from one to the other
without CAP_BPF; and the settings that allow it."""

from __future__ import annotations

import errno
import json
import os
import random
import select
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from laminar.server import steering
from laminar.server.config import BrokerConfig, ConfigError, new_secret

from ..netns import veth_pair
from ..privileges import in_a_child_as
from ..xdp.conftest import bpffs

WORKERS = 3
CONNECTIONS = 30
BROKER_UID = 10001  # (the broker image's)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepted_by(
    sockets: list[socket.socket], worker: int, port: int, rng: random.Random, used: set[int]
) -> int:
    """Which of `sockets` accepts a connection from a source port that names `worker` (one
    not used before here, and that no other socket of the machine holds: the first such
    drawn)."""
    with socket.socket() as client:
        for _ in range(100):
            source = steering.source_port_for(worker, WORKERS, rng)
            if source in used:
                continue
            used.add(source)
            try:
                client.bind(("127.0.0.1", source))
                break
            except OSError:  # (in use: draw another)
                continue
        client.connect(("127.0.0.1", port))
        ready, _, _ = select.select(sockets, [], [], 5)
        assert ready, "no socket accepted the connection"
        connection, _ = ready[0].accept()
        connection.close()
        return sockets.index(ready[0])


def needs_cap_bpf(mechanism: str) -> None:
    if mechanism == "ebpf" and os.geteuid() != 0:
        pytest.skip("loading the eBPF program needs CAP_BPF: run as root")


def matches(mechanisms: tuple[str, ...]) -> int:
    """How many of CONNECTIONS connections, each from a source port naming a worker, the
    socket of that worker accepted, with the first of `mechanisms` attached."""
    port = free_port()
    sockets, attached = steering.listen("127.0.0.1", port, WORKERS, 64, mechanisms)
    assert attached == (mechanisms[0] if mechanisms else None)
    rng = random.Random(7)
    used: set[int] = set()
    try:
        hits = 0
        for n in range(CONNECTIONS):
            worker = n % WORKERS
            hits += accepted_by(sockets, worker, port, rng, used) == worker
        return hits
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.parametrize("mechanism", ("ebpf", "cbpf"))  # ("pinned": below)
def test_the_program_hands_each_connection_to_the_socket_its_source_port_names(
    mechanism: str,
) -> None:
    needs_cap_bpf(mechanism)
    assert matches((mechanism,)) == CONNECTIONS
    # without it the kernel's hash spreads them (all 30 right by chance: 3**-30)
    assert matches(()) < CONNECTIONS


#: without CAP_BPF (a process whose bounding set is empty): what `listen` attached
WITHOUT_CAP_BPF = """
import json, sys
from laminar.server import steering
sockets, attached = steering.listen("127.0.0.1", int(sys.argv[1]), 2, 8)
try:
    steering.attach_ebpf(sockets)
    refused = None
except OSError as e:
    refused = e.errno
print(json.dumps([attached, refused]))
"""


def test_without_cap_bpf_the_classic_program_steers() -> None:
    needs_cap_bpf("ebpf")  # (to drop the capability, it must be held)
    out = subprocess.run(
        ["setpriv", "--bounding-set=-all", sys.executable, "-c", WITHOUT_CAP_BPF,
         str(free_port())],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    assert json.loads(out) == ["cbpf", 1]  # EPERM


def test_source_ports_name_their_worker() -> None:
    rng = random.Random(1)
    low, high = steering.EPHEMERAL_PORTS
    for workers in (2, 3, 64):
        for worker in range(workers):
            for _ in range(20):
                port = steering.source_port_for(worker, workers, rng)
                assert low <= port <= high and port % workers == worker
    assert len(steering.program(4, socket.AF_INET)) == 4 * 8  # ldx, ldh, mod, ret
    assert len(steering.program(4, socket.AF_INET6)) == 3 * 8
    assert len(steering.ebpf_program(4, 3)) == 19 * 8


def test_the_steer_port_needs_workers_and_a_port_of_its_own(tmp_path: Path) -> None:
    def config(**kwargs: int) -> BrokerConfig:
        return BrokerConfig("n1", tmp_path, secret=new_secret(), allow_anonymous=True, **kwargs)

    assert config(workers=2, steer_port=7090).steer_port == 7090
    with pytest.raises(ConfigError, match="needs --workers"):
        config(workers=1, steer_port=7090)
    with pytest.raises(ConfigError, match="must all differ"):
        config(workers=2, steer_port=7073)  # worker 1's API port
    with pytest.raises(ConfigError, match="not 0"):
        config(workers=2, api_port=0)


#: the broker's side, in its namespace: the steer port's sockets; prints the program attached,
#: then (source port, index of the socket that accepted) of each connection
ACCEPTOR = """
import json, select, sys
from laminar.server import steering
host, port, workers, count = sys.argv[1], *map(int, sys.argv[2:5])
mechanisms = tuple(m for m in sys.argv[5].split(",") if m)
sockets, attached = steering.listen(host, port, workers, 64, mechanisms)
print(json.dumps(attached), flush=True)
out = []
while len(out) < count:
    ready, _, _ = select.select(sockets, [], [], 20)
    if not ready:
        break
    for listening in ready:
        connection, address = listening.accept()
        out.append([address[1], sockets.index(listening)])
        connection.close()
print(json.dumps(out), flush=True)
"""
#: the client's side, in the other namespace: connections from source ports naming workers
CONNECTOR = """
import random, socket, sys
from laminar.server import steering
host, port, workers, count = sys.argv[1], *map(int, sys.argv[2:5])
rng = random.Random(5)
used = set()  # (a port is used once: no connection meets another's TIME_WAIT)
for n in range(count):
    port_ = steering.source_port_for(n % workers, workers, rng)
    while port_ in used:
        port_ = steering.source_port_for(n % workers, workers, rng)
    used.add(port_)
    client = socket.socket()
    client.bind((sys.argv[5], port_))
    client.connect((host, port))
    client.close()
"""


def steered_over_a_wire(mechanism: str | None) -> list[tuple[int, int]]:
    """(source port, the socket that accepted) of CONNECTIONS connections over a veth pair
    between two namespaces the test made, to 3 steer sockets with `mechanism` attached."""
    with veth_pair() as (client, broker):
        port = 7090
        acceptor = subprocess.Popen(
            ["ip", "netns", "exec", broker.netns, sys.executable, "-c", ACCEPTOR,
             broker.address, str(port), str(WORKERS), str(CONNECTIONS), mechanism or ""],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert acceptor.stdout is not None
            assert json.loads(acceptor.stdout.readline()) == mechanism
            client.run(sys.executable, "-c", CONNECTOR, broker.address, str(port),
                       str(WORKERS), str(CONNECTIONS), client.address)  # fmt: skip
            out, _ = acceptor.communicate(timeout=60)
        finally:
            if acceptor.poll() is None:
                acceptor.kill()
    return [(int(p), int(i)) for p, i in json.loads(out)]


@pytest.mark.parametrize("mechanism", ("ebpf", "cbpf"))  # ("pinned": below)
def test_the_kernel_chooses_the_socket_for_connections_over_a_wire(mechanism: str) -> None:
    """In namespaces: every connection is accepted on the socket its source port names, and
    nothing in user space moved it (the acceptor only reports where it arrived); without
    the program the same sockets get them by the kernel's hash."""
    needs_cap_bpf(mechanism)
    steered = steered_over_a_wire(mechanism)
    assert len(steered) == CONNECTIONS
    assert all(index == port % WORKERS for port, index in steered), steered
    spread = steered_over_a_wire(None)
    assert len(spread) == CONNECTIONS
    assert sum(index == port % WORKERS for port, index in spread) < CONNECTIONS


def as_the_broker(pins: Path, port: int, other: int) -> list[object]:
    """In the broker's uid (no capabilities): the steer port's sockets with the pinned
    program; how many connections reached their worker's socket; the errno of loading a
    program itself; what a second group (another broker) gets from the same pins."""
    sockets, attached = steering.listen("127.0.0.1", port, WORKERS, 64, ("pinned",), pins)
    rng, hits = random.Random(3), 0
    for n in range(CONNECTIONS):
        hits += accepted_by(sockets, n % WORKERS, port, rng, set()) == n % WORKERS
    try:
        steering.attach_ebpf(sockets)
        loaded = None
    except OSError as e:
        loaded = e.errno
    _, second = steering.listen("127.0.0.1", other, WORKERS, 64, ("pinned",), pins)
    return [attached, hits, loaded, second]


def test_a_program_pinned_beside_the_router_steers_for_the_unprivileged_broker() -> None:
    """What `laminar-xdp load` pins (as root) the broker's uid attaches without any
    capability, and it steers every connection; it cannot load one itself; and a second
    group is refused the pins the first one holds."""
    needs_cap_bpf("ebpf")
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o755)  # (the broker's uid must reach the pins)
        with bpffs(Path(tmp) / "bpf") as fs:
            pins = fs / "laminar"
            pins.mkdir(mode=0o755)
            steering.pin(pins, WORKERS, owner=BROKER_UID)
            for name in (steering.PINNED_PROGRAM, steering.PINNED_MAP):
                status = (pins / name).stat()
                assert (status.st_uid, status.st_mode & 0o777) == (BROKER_UID, 0o600), name
            got = in_a_child_as(BROKER_UID, lambda: as_the_broker(pins, free_port(), free_port()))
            assert got == ["pinned", CONNECTIONS, errno.EPERM, None]
