"""Quiescence of idle Raft groups (`laminar.raft.raft`, "Quiescence"): an idle group stops
ticking on every member; it wakes on a proposal, on a message, or on `wake`; a follower awake
under a quiesced leader wakes the leader rather than campaigning."""

from __future__ import annotations

import random
from dataclasses import replace

from laminar.log.batch import Record, encode_batch
from laminar.raft import (
    ConfState,
    MemoryRaftStorage,
    Message,
    MessageType,
    Raft,
    RaftConfig,
    Role,
)
from laminar.raft.multi import MultiRaft

NODES = ("a", "b", "c")
GROUP = "g"


class Group:
    """One group on three nodes; messages are delivered by `pump` until none is left."""

    def __init__(self, *, quiesce: bool = True) -> None:
        self.hosts = {n: MultiRaft(n, quiesce=quiesce) for n in NODES}
        self.stores = {n: MemoryRaftStorage(ConfState(NODES)) for n in NODES}
        self.sent: list[Message] = []
        self.down: set[str] = set()
        for number, node in enumerate(NODES):
            rng = random.Random(number)
            raft = Raft(GROUP, node, self.stores[node], RaftConfig(), rng)
            self.hosts[node].add(raft)

    def raft(self, node: str) -> Raft:
        return self.hosts[node].groups[GROUP]

    def pump(self) -> None:
        while True:
            outgoing = []
            for node, host in self.hosts.items():
                readies, messages = host.ready()
                for ready in readies.values():
                    self.stores[node].append(ready.entries)
                    if ready.hard_state is not None:
                        self.stores[node].set_hard_state(ready.hard_state)
                host.advance(readies)
                outgoing += messages
            outgoing = [m for m in outgoing if m.dst not in self.down and m.src not in self.down]
            if not outgoing:
                return
            for message in outgoing:
                self.sent += message.batch or (message,)
                self.hosts[message.dst].step(message)

    def tick(self, ticks: int = 1) -> None:
        for _ in range(ticks):
            for node, host in self.hosts.items():
                if node not in self.down:
                    host.tick()
            self.pump()

    def leader(self) -> Raft:
        (leader,) = [self.raft(n) for n in NODES if self.raft(n).role is Role.LEADER]
        return leader

    def quiet(self) -> bool:
        return all(self.raft(n).quiesced for n in NODES if n not in self.down)


def settled() -> Group:
    group = Group()
    group.tick(40)
    assert group.quiet()
    return group


def test_an_idle_group_quiesces_and_sends_nothing_more() -> None:
    group = settled()
    group.sent.clear()
    group.tick(100)
    assert group.sent == []
    assert all(host.quiesced() == 1 for host in group.hosts.values())


def test_without_quiescence_heartbeats_go_on() -> None:
    group = Group(quiesce=False)
    group.tick(40)
    group.sent.clear()
    group.tick(10)
    assert sum(1 for m in group.sent if m.type is MessageType.HEARTBEAT) >= 20
    assert not any(group.raft(n).quiesced for n in NODES)


def test_a_proposal_wakes_the_group_and_commits_everywhere_then_it_quiesces() -> None:
    group = settled()
    leader = group.leader()
    index = leader.propose(encode_batch([Record(value=b"v")]), 1)
    assert not leader.quiesced
    group.pump()
    group.tick(3)
    assert all(group.raft(n).log.committed >= index for n in NODES)
    assert group.quiet()


def test_a_woken_follower_wakes_its_leader_instead_of_campaigning() -> None:
    group = settled()
    leader = group.leader()
    follower = group.raft(next(n for n in NODES if n != leader.id))
    term = leader.term
    group.sent.clear()
    follower.wake()  # as the node does when SWIM suspects the leader
    group.tick(60)  # longer than any election timeout
    assert not [m for m in group.sent if m.type in (MessageType.PRE_VOTE, MessageType.VOTE)]
    assert group.leader() is leader and leader.term == term
    assert group.quiet()  # the leader heartbeat again, then quiesced everyone again


def test_a_late_heartbeat_from_the_leader_leaves_a_follower_quiesced() -> None:
    group = settled()
    leader = group.leader()
    follower = group.raft(next(n for n in NODES if n != leader.id))
    late = Message(MessageType.HEARTBEAT, GROUP, leader.id, follower.id, leader.term, commit=0)
    follower.step(late)
    assert follower.quiesced
    follower.step(Message(MessageType.PRE_VOTE, GROUP, "c", follower.id, leader.term + 1))
    assert not follower.quiesced  # anything else wakes it


def test_a_late_commit_only_append_from_the_leader_leaves_a_follower_quiesced() -> None:
    """A commit-only append (marked `reject`, as one to a follower known to hold the whole log
    is) that arrives after the quiesce request tells the commit and wakes nothing: awake under
    its quiesced leader, the follower would campaign (node simulation seed 1, once commits
    of configuration changes went to every follower at once)."""
    group = settled()
    leader = group.leader()
    follower = group.raft(next(n for n in NODES if n != leader.id))
    last, term = leader.log.last_index(), leader.log.last_term()
    fields = {"index": last, "log_term": term, "commit": leader.log.committed}
    late = Message(MessageType.APPEND, GROUP, leader.id, follower.id, leader.term, **fields)
    follower.step(replace(late, reject=True))
    assert follower.quiesced and not follower.msgs  # matched: nothing to answer
    follower.step(late)  # an append not marked quiet is answered, and wakes it
    assert not follower.quiesced


def test_a_leader_waits_for_lagging_members_the_failure_detector_counts_live() -> None:
    group = settled()
    leader = group.leader()
    lagging = next(n for n in NODES if n != leader.id)
    group.down.add(lagging)
    leader.propose(encode_batch([Record(value=b"v")]), 1)
    group.pump()
    group.tick(5)
    assert not leader.quiesced  # the lagging member may be alive: keep trying
    group.hosts[leader.id].live = lambda node: node != lagging
    group.tick(2)
    assert leader.quiesced  # it is down: quiesce without it
    group.down.discard(lagging)
    group.hosts[leader.id].live = lambda node: True
    group.hosts[leader.id].wake_leaders_of([lagging])  # it is back
    group.tick(5)
    assert group.raft(lagging).log.committed == leader.log.committed
    assert group.quiet()


def test_a_follower_lacking_the_leaders_last_entry_does_not_quiesce() -> None:
    """Even when its leader, misled by the failure detector, quiesces without it."""
    group = settled()
    leader = group.leader()
    lagging = next(n for n in NODES if n != leader.id)
    group.down.add(lagging)
    leader.propose(encode_batch([Record(value=b"v")]), 1)
    group.pump()
    group.hosts[leader.id].live = lambda node: node != lagging
    group.tick(2)
    assert leader.quiesced
    group.down.discard(lagging)
    assert group.raft(lagging).quiesced  # (it never heard of the proposal)
    leader.wake()  # it quiesces again at once: the lagging member does not
    group.tick(5)  # its answer to the quiesce request wakes the leader, which catches it up
    assert group.raft(lagging).log.committed == leader.log.committed
    assert group.quiet()
