"""The asyncio UDP runtime on real loopback sockets: nodes find each other through one seed,
a node that leaves is seen as left, a node that vanishes is eventually seen as dead."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import pytest

from laminar.swim import EventKind, MemberStatus, SwimConfig
from laminar.swim.runtime import SwimNode, format_address, parse_address

from .helpers import CLUSTER, SECRET

#: Ten times faster than the LAN defaults, so that death is detected within seconds.
FAST = SwimConfig(
    probe_interval_ms=100,
    probe_timeout_ms=50,
    gossip_interval_ms=20,
    join_retry_interval_ms=100,
    push_pull_interval_ms=3000,
    reconnect_interval_ms=3000,
)
#: Generous limits for a loaded CI machine; each wait ends as soon as its condition holds.
JOIN_TIMEOUT_S = 10
LEAVE_TIMEOUT_S = 10
DEAD_TIMEOUT_S = 20
POLL_S = 0.02


async def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll until `condition` holds; seconds it took. Fails after `timeout_s`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        await asyncio.sleep(POLL_S)
    return time.monotonic() - started


def statuses(node: SwimNode) -> dict[str, MemberStatus]:
    return {member_id: state.status for member_id, state in node.members().items()}


def drain(node: SwimNode) -> list[tuple[EventKind, str]]:
    events = []
    while not node.events.empty():
        event = node.events.get_nowait()
        events.append((event.kind, event.state.id))
    return events


async def test_loopback_nodes_join_through_one_seed_then_see_a_leave_and_a_death() -> None:
    seed = SwimNode("node-0", cluster_id=CLUSTER, secret=SECRET, config=FAST)
    await seed.start()
    nodes = [seed] + [
        SwimNode(
            f"node-{i}",
            cluster_id=CLUSTER,
            secret=SECRET,
            seeds=[seed.gossip_addr],
            config=FAST,
            api_addr=f"127.0.0.1:{8000 + i}",
        )
        for i in range(1, 5)
    ]
    try:
        for node in nodes[1:]:
            await node.start()
        ports = {parse_address(n.gossip_addr)[1] for n in nodes}
        assert len(ports) == 5 and 0 not in ports
        assert all(n.gossip_addr.startswith("127.0.0.1:") for n in nodes)

        everyone = {n.node_id for n in nodes}
        await wait_for(
            lambda: all(statuses(n) == dict.fromkeys(everyone, MemberStatus.ALIVE) for n in nodes),
            JOIN_TIMEOUT_S,
            "all five see each other alive",
        )
        assert seed.members()["node-3"].member.addresses.api == "127.0.0.1:8003"
        for node in nodes:
            joined = {i for kind, i in drain(node) if kind is EventKind.JOINED}
            assert joined == everyone - {node.node_id}

        leaver, victim, survivors = nodes[1], nodes[2], [nodes[0], nodes[3], nodes[4]]
        await leaver.stop()
        assert not leaver.running
        await wait_for(
            lambda: all(statuses(n)["node-1"] is MemberStatus.LEFT for n in [victim, *survivors]),
            LEAVE_TIMEOUT_S,
            "node-1 seen as left",
        )

        victim.abort()  # gone without a word, like a crash
        await wait_for(
            lambda: all(statuses(n)["node-2"] is MemberStatus.DEAD for n in survivors),
            DEAD_TIMEOUT_S,
            "node-2 seen as dead",
        )
        for node in survivors:
            events = drain(node)
            assert (EventKind.LEFT, "node-1") in events
            assert (EventKind.DEAD, "node-2") in events
            assert (EventKind.DEAD, "node-1") not in events
            assert statuses(node)["node-1"] is MemberStatus.LEFT
    finally:
        for node in nodes:
            await node.stop(leave=False)


async def test_oversized_and_foreign_datagrams_are_dropped_and_counted() -> None:
    node = SwimNode("solo", cluster_id=CLUSTER, secret=SECRET, config=FAST)
    await node.start()
    try:
        host, port = parse_address(node.gossip_addr)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            sender.sendto(b"\x00" * (FAST.max_datagram_bytes + 1), (host, port))
            sender.sendto(b"LMQG" + b"\x00" * 60, (host, port))
            sender.sendto(b"not swim at all, long enough to have a header" * 2, (host, port))
        await wait_for(
            lambda: sum(node.core.dropped.values()) == 3, JOIN_TIMEOUT_S, "three drops counted"
        )
        assert node.core.dropped == {"oversized": 1, "bad_version": 1, "bad_magic": 1}
        assert list(node.members()) == ["solo"]
    finally:
        await node.stop()


@pytest.mark.parametrize(
    "host, port, text",
    [
        ("127.0.0.1", 7946, "127.0.0.1:7946"),
        ("::1", 80, "[::1]:80"),
        ("pod-0.svc", 1, "pod-0.svc:1"),
    ],
)
def test_addresses_format_and_parse_both_ways(host: str, port: int, text: str) -> None:
    assert format_address(host, port) == text
    assert parse_address(text) == (host, port)


@pytest.mark.parametrize("text", ["", "host", "host:", ":80", "host:http", "host:70000", "[::1]"])
def test_malformed_addresses_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_address(text)
