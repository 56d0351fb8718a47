"""Real partition replicas on files, driven by hand as the broker's driver would drive them:
a three-voter group whose peers are played by the test (it steps their Raft messages in)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from laminar.log.config import LogConfig
from laminar.partition.replica import Replica
from laminar.raft.config import RaftConfig
from laminar.raft.messages import ConfState, Entry, EntryKind, Message, MessageType
from laminar.raft.raft import encode_control

VOTERS = ("n1", "n2", "n3")


def open_replica(path: Path, voters: tuple[str, ...] = VOTERS, topic: str = "t") -> Replica:
    return Replica(
        topic, 0, "n1", path, LogConfig(segment_bytes=4096), RaftConfig(), ConfState(voters)
    )


def drive(replica: Replica) -> None:
    """What the broker's driver does with each Ready (messages to peers are dropped: the
    test answers for the peers itself)."""
    while replica.raft.has_ready():
        ready = replica.raft.ready()
        if ready.entries:
            replica.storage.append(ready.entries)
            replica.storage.sync()
        if ready.hard_state is not None:
            replica.storage.set_hard_state(ready.hard_state)
        if ready.committed is not None:
            replica.on_committed(*ready.committed)
        replica.raft.advance(ready)
        replica.on_leadership()


def elect(replica: Replica, voter: str = "n2") -> None:
    """n1 wins an election with `voter`'s pre-vote and vote."""
    raft = replica.raft
    raft.campaign()
    drive(replica)
    raft.step(Message(MessageType.PRE_VOTE_RESP, raft.group, voter, raft.id, raft.term + 1))
    drive(replica)
    raft.step(Message(MessageType.VOTE_RESP, raft.group, voter, raft.id, raft.term))
    drive(replica)
    assert replica.is_leader


def depose(replica: Replica, leader: str = "n2") -> None:
    """`leader` was elected in a later term and makes itself heard: n1 steps down."""
    raft = replica.raft
    raft.step(Message(MessageType.HEARTBEAT, raft.group, leader, raft.id, raft.term + 1))
    drive(replica)
    assert not replica.is_leader and raft.lead == leader


def noop(index: int, term: int) -> Entry:
    """The no-op a new leader of `term` appends at `index`."""
    return Entry(index, 1, term, encode_control(EntryKind.NOOP), EntryKind.NOOP)


def append_from(
    replica: Replica,
    leader: str,
    term: int,
    after: int,
    entries: Sequence[Entry] = (),
    *,
    commit: int,
) -> None:
    """`leader` of `term` sends `entries` following index `after` (which it holds with the
    term n1 has there), and its commit index."""
    raft = replica.raft
    raft.step(
        Message(
            MessageType.APPEND,
            raft.group,
            leader,
            raft.id,
            term,
            log_term=raft.log.term(after) or 0,
            index=after,
            entries=tuple(entries),
            commit=commit,
        )
    )
    drive(replica)
