"""The steer port (docs/workers.md, routing layer 3): real sockets on loopback, the kernel's
choice of socket for each connection, and the settings that allow it."""

from __future__ import annotations

import random
import select
import socket
from pathlib import Path

import pytest

from laminar.server import steering
from laminar.server.config import BrokerConfig, ConfigError, new_secret

WORKERS = 3
CONNECTIONS = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepted_by(sockets: list[socket.socket], worker: int, port: int, rng: random.Random) -> int:
    """Which of `sockets` accepts a connection from a source port that names `worker` (one
    that no other socket of the machine holds: the first free one drawn)."""
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for _ in range(100):
            try:
                client.bind(("127.0.0.1", steering.source_port_for(worker, WORKERS, rng)))
                break
            except OSError:  # (in use: draw another)
                continue
        client.connect(("127.0.0.1", port))
        ready, _, _ = select.select(sockets, [], [], 5)
        assert ready, "no socket accepted the connection"
        connection, _ = ready[0].accept()
        connection.close()
        return sockets.index(ready[0])


def matches(attached: bool, monkeypatch: pytest.MonkeyPatch) -> int:
    if not attached:
        monkeypatch.setattr(steering, "attach", lambda sock, workers: False)
    port = free_port()
    sockets, on = steering.listen("127.0.0.1", port, WORKERS, 64)
    assert on == attached
    rng = random.Random(7)
    try:
        hits = 0
        for n in range(CONNECTIONS):
            worker = n % WORKERS
            hits += accepted_by(sockets, worker, port, rng) == worker
        return hits
    finally:
        for sock in sockets:
            sock.close()


def test_the_program_hands_each_connection_to_the_socket_its_source_port_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert matches(True, monkeypatch) == CONNECTIONS
    # without it the kernel's hash spreads them (all 30 right by chance: 3**-30)
    assert matches(False, monkeypatch) < CONNECTIONS


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


def test_the_steer_port_needs_workers_and_a_port_of_its_own(tmp_path: Path) -> None:
    def config(**kwargs: int) -> BrokerConfig:
        return BrokerConfig("n1", tmp_path, secret=new_secret(), allow_anonymous=True, **kwargs)

    assert config(workers=2, steer_port=7090).steer_port == 7090
    with pytest.raises(ConfigError, match="needs --workers"):
        config(steer_port=7090)
    with pytest.raises(ConfigError, match="must all differ"):
        config(workers=2, steer_port=7073)  # worker 1's API port
    with pytest.raises(ConfigError, match="not 0"):
        config(workers=2, api_port=0)
