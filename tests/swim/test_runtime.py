"""The asyncio UDP runtime on real loopback sockets: nodes find each other through one seed,
a node that leaves is seen as left, a node that vanishes is eventually seen as dead."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import pytest

from laminar.server.swim_runtime import SwimNode, format_address, parse_address, wall_ms
from laminar.swim import Codec, EventKind, MemberStatus, SwimConfig
from laminar.swim.codec import Stamp
from laminar.swim.messages import Ack, Datagram, Ping, Sync

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
            sender.sendto(b"LMQG" + b"\x00" * 80, (host, port))
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


class _Inbox(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.received: asyncio.Queue[tuple[bytes, tuple[str, int]]] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.received.put_nowait((data, addr))


async def test_genuine_datagrams_replayed_from_another_address_get_no_answer() -> None:
    """Sniff a genuine ping and a genuine sync (asking for a reply) that node a sends node b
    on loopback, replay both to b from 127.0.0.2, then send b a fresh genuine ping from the
    same socket: the first (and only) thing the replayer receives is the answer to that
    fresh ping, so b answered neither replay (b handles one socket's datagrams in order, and
    answers at once)."""
    b = SwimNode("b", cluster_id=CLUSTER, secret=SECRET, config=FAST)
    await b.start()
    a = SwimNode("a", cluster_id=CLUSTER, secret=SECRET, seeds=[b.gossip_addr], config=FAST)
    b_port = parse_address(b.gossip_addr)[1]
    reader = Codec(CLUSTER, SECRET, FAST.max_datagram_bytes, sender="unused:1")
    sniffed: dict[str, bytes] = {}
    send = a._sendto

    def sniff(datagram: bytes, ip: str, port: int) -> None:  # a copy of what a sends to b
        decoded = reader.decode(datagram)
        if port == b_port and isinstance(decoded, Datagram):
            message = decoded.message
            if isinstance(message, Ping) and message.target == "b":
                sniffed.setdefault("ping", datagram)
            elif isinstance(message, Sync) and message.reply_wanted:
                sniffed.setdefault("sync", datagram)
        send(datagram, ip, port)

    a._sendto = sniff  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    transport, replayer = await loop.create_datagram_endpoint(_Inbox, local_addr=("127.0.0.2", 0))
    try:
        await a.start()
        await wait_for(lambda: {"ping", "sync"} <= sniffed.keys(), JOIN_TIMEOUT_S, "sniffed")
        for kind in ("ping", "sync"):
            transport.sendto(sniffed[kind], ("127.0.0.1", b_port))
        own = format_address(*transport.get_extra_info("sockname")[:2])
        fresh = Codec(CLUSTER, SECRET, FAST.max_datagram_bytes, sender=own).encode(
            Ping(4242, "b", b.epoch, "probe", 1), stamp=Stamp(wall_ms(), 1)
        )
        transport.sendto(fresh, ("127.0.0.1", b_port))
        data, source = await asyncio.wait_for(replayer.received.get(), JOIN_TIMEOUT_S)
        first = reader.decode(data)
        assert isinstance(first, Datagram) and first.message == Ack(4242), first
        assert source == ("127.0.0.1", b_port)
        assert b.core.dropped.get("wrong_sender") == 2
    finally:
        transport.close()
        await a.stop(leave=False)
        await b.stop(leave=False)


async def test_a_member_advertising_a_host_name_is_checked_by_resolving_it() -> None:
    """Kubernetes brokers advertise DNS names: a datagram declaring one is accepted once the
    name resolves to its source address (until then it counts as unverified)."""
    named = SwimNode(
        "named", cluster_id=CLUSTER, secret=SECRET, config=FAST, advertise_host="localhost"
    )
    await named.start()
    plain = SwimNode(
        "plain", cluster_id=CLUSTER, secret=SECRET, seeds=[named.gossip_addr], config=FAST
    )
    await plain.start()
    try:
        assert named.gossip_addr.startswith("localhost:")
        await wait_for(
            lambda: (
                set(statuses(plain)) == {"named", "plain"} == set(statuses(named))
                and all(
                    s is MemberStatus.ALIVE
                    for s in [*statuses(plain).values(), *statuses(named).values()]
                )
            ),
            JOIN_TIMEOUT_S,
            "the two see each other alive",
        )
        assert plain.core.dropped.get("wrong_sender", 0) == 0
    finally:
        await plain.stop(leave=False)
        await named.stop(leave=False)
