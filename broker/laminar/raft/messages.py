"""Raft values: entries, snapshots, configuration changes and the one flat message type.

Indexes are the partition's record indexes: an entry is a whole batch covering
[index, index + count), and its term is the term stored in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class EntryKind(IntEnum):
    NORMAL = 0  # user records
    NOOP = 1  # appended by a new leader to commit entries of earlier terms
    CONF = 2  # a single-server configuration change


@dataclass(slots=True)
class Entry:
    """A log entry; treated as a value (not frozen, for the same reason as Message)."""

    index: int  # base index: the first record index the batch covers
    count: int  # records in the batch (>= 1)
    term: int
    data: bytes  # the encoded batch (the log stamps index and term when persisting it)
    kind: EntryKind = EntryKind.NORMAL

    @property
    def last_index(self) -> int:
        return self.index + self.count - 1


class ConfChangeKind(IntEnum):
    ADD_LEARNER = 1
    PROMOTE = 2  # learner -> voter, once it has caught up
    REMOVE = 3


@dataclass(frozen=True, slots=True)
class ConfChange:
    kind: ConfChangeKind
    node: str


@dataclass(frozen=True, slots=True)
class ConfState:
    voters: tuple[str, ...]  # sorted
    learners: tuple[str, ...] = ()  # sorted

    def apply(self, change: ConfChange) -> ConfState:
        voters, learners = set(self.voters), set(self.learners)
        if change.kind is ConfChangeKind.ADD_LEARNER:
            if change.node not in voters:
                learners.add(change.node)
        elif change.kind is ConfChangeKind.PROMOTE:
            if change.node in learners:
                learners.discard(change.node)
                voters.add(change.node)
        else:
            voters.discard(change.node)
            learners.discard(change.node)
        return ConfState(tuple(sorted(voters)), tuple(sorted(learners)))

    def members(self) -> tuple[str, ...]:
        return tuple(sorted((*self.voters, *self.learners)))


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before a message that depends on it is sent."""

    term: int = 0
    vote: str | None = None
    commit: int = -1
    conf: ConfState = ConfState(())
    #: Set while the node's log lacks entries it may have acknowledged (damage found on disk
    #: and cut away): the (index, term) its log ended at before the cut. Until a leader has
    #: repaired the log, the node does not campaign, and it votes as if its log still ended
    #: there, so no candidate missing what it acknowledged can win with its vote.
    repair_floor: tuple[int, int] | None = None
    #: A member created on this node by a leader's message (added to a running group, not
    #: one of its initial voters) until its log holds an entry some leader wrote: it neither
    #: campaigns nor votes. Its configuration is only a guess until then (the group's
    #: initial voters), and a stale message may have created it after its removal: an empty
    #: member that voted could elect a removed node, or another such member, next to the
    #: group's real leader.
    joining: bool = False


@dataclass(frozen=True, slots=True)
class Snapshot:
    """State up to and including `index` (of `term`); the log continues at index + 1."""

    index: int
    term: int
    conf: ConfState
    data: bytes = b""


class MessageType(IntEnum):
    PRE_VOTE = 1
    PRE_VOTE_RESP = 2
    VOTE = 3
    VOTE_RESP = 4
    APPEND = 5
    APPEND_RESP = 6
    HEARTBEAT = 7
    HEARTBEAT_RESP = 8
    SNAPSHOT = 9
    TIMEOUT_NOW = 10
    READ_INDEX = 11  # follower -> leader: confirm leadership for a read
    READ_INDEX_RESP = 12
    HEARTBEATS = 13  # node level: the heartbeats of many groups to one node, coalesced
    HEARTBEATS_RESP = 14
    REPAIR = 15  # a member repairing its log: its last index and term (`index`, `log_term`)
    REPAIR_RESP = 16  # entries held after that point, by a member that holds it too
    #: node level, not Raft: a broker's partition status report (laminar.partition.
    #: status_table; `index`: its version, one entry: the rows)
    STATUS = 17


@dataclass(slots=True)
class Message:
    """One Raft message. Fields a type does not use keep their defaults. Treated as a value:
    never mutated after construction (not frozen only because frozen construction costs
    ~1 us more per message on the hot path).

    APPEND: `index`/`log_term` are the entry before `entries`; APPEND_RESP: `index` is the
    last index matched, or on reject the probed index, with `reject_hint` the follower's
    hint of where to retry and `log_term` the term there.
    """

    type: MessageType
    group: str
    src: str
    dst: str
    term: int
    log_term: int = 0
    index: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = -1
    reject: bool = False
    reject_hint: int = 0
    context: bytes = b""
    snapshot: Snapshot | None = None
    #: HEARTBEATS / HEARTBEATS_RESP: the per-group messages folded into this one
    batch: tuple[Message, ...] = field(default=())


def up_to_date_order(position: tuple[int, int]) -> tuple[int, int]:
    """(index, term) pairs ordered as Raft compares logs: by term, then by index."""
    index, term = position
    return term, index
