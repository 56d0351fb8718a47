"""Multi-Raft: many groups per node, heartbeats coalesced into one message per peer node."""

from __future__ import annotations

import random

from laminar.raft import ConfState, MemoryRaftStorage, MessageType, Raft, RaftConfig, Role
from laminar.raft.multi import MultiRaft

NODES = ("a", "b", "c")
GROUPS = [f"p{i}" for i in range(6)]


def build() -> tuple[dict[str, MultiRaft], dict[tuple[str, str], MemoryRaftStorage]]:
    hosts = {n: MultiRaft(n) for n in NODES}
    stores: dict[tuple[str, str], MemoryRaftStorage] = {}
    for number, node in enumerate(NODES):
        for group in GROUPS:
            storage = MemoryRaftStorage(ConfState(NODES))
            stores[(node, group)] = storage
            rng = random.Random(number * 100 + len(stores))
            hosts[node].add(Raft(group, node, storage, RaftConfig(), rng))
    return hosts, stores


def pump(hosts: dict[str, MultiRaft], stores: dict[tuple[str, str], MemoryRaftStorage]) -> list:
    sent = []
    while True:
        outgoing = []
        for node, host in hosts.items():
            readies, messages = host.ready()
            for group, ready in readies.items():
                stores[(node, group)].append(ready.entries)
                if ready.hard_state is not None:
                    stores[(node, group)].set_hard_state(ready.hard_state)
            host.advance(readies)
            outgoing += messages
        if not outgoing:
            return sent
        sent += outgoing
        for message in outgoing:
            hosts[message.dst].step(message)


def test_heartbeats_of_all_groups_go_to_each_peer_as_one_message() -> None:
    hosts, stores = build()
    for _ in range(60):
        for host in hosts.values():
            host.tick()
        pump(hosts, stores)
    leaders = {g: n for n in NODES for g in GROUPS if hosts[n].groups[g].role is Role.LEADER}
    assert set(leaders) == set(GROUPS)
    # one heartbeat tick for every group at once
    for host in hosts.values():
        host.tick()
    sent = pump(hosts, stores)
    heartbeats = [m for m in sent if m.type is MessageType.HEARTBEATS]
    assert not [m for m in sent if m.type is MessageType.HEARTBEAT]  # never sent alone
    pairs = [(m.src, m.dst) for m in heartbeats]
    assert len(pairs) == len(set(pairs))  # one message per (leader node, peer) pair
    led = {n: sum(1 for g in GROUPS if leaders[g] == n) for n in NODES}
    for message in heartbeats:
        assert len(message.batch) == led[message.src]
        assert {part.group for part in message.batch} <= set(GROUPS)
    responses = [m for m in sent if m.type is MessageType.HEARTBEATS_RESP]
    assert sorted((m.dst, m.src) for m in responses) == sorted(pairs)


def test_messages_for_unknown_groups_are_dropped() -> None:
    hosts, stores = build()
    hosts["a"].remove("p0")
    for _ in range(60):
        for host in hosts.values():
            host.tick()
        pump(hosts, stores)
    assert "p0" not in hosts["a"].groups
    assert any(hosts[n].groups["p0"].role is Role.LEADER for n in ("b", "c"))
