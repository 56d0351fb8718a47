"""What a member advertises, what a node knows about each member, and the events it reports."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum

#: Longest member id, in UTF-8 bytes (StatefulSet pod names stay below 64).
MAX_ID_BYTES = 128
#: Longest "host:port" address, in UTF-8 bytes (a DNS name is at most 253 characters).
MAX_ADDRESS_BYTES = 255
#: Largest weight and incarnation number (both travel as u32).
MAX_WEIGHT = 2**32 - 1
MAX_INCARNATION = 2**32 - 1
#: Largest epoch (u64).
MAX_EPOCH = 2**64 - 1
#: Most workers a member advertises (`laminar.workers`; the down set travels as a u64).
MAX_WORKERS = 64


class MemberStatus(IntEnum):
    """At one incarnation, a later status overrides an earlier one: suspect beats alive, dead
    beats suspect, left beats dead. Only a higher incarnation brings a member back to alive."""

    ALIVE = 1
    SUSPECT = 2
    DEAD = 3
    LEFT = 4


@dataclass(frozen=True, slots=True)
class Addresses:
    """Where to reach a member, each a "host:port" string."""

    api: str  # the public HTTP API
    peer: str  # broker-to-broker traffic (Raft)
    gossip: str  # SWIM datagrams


@dataclass(frozen=True, slots=True)
class Member:
    """What a member advertises about itself."""

    id: str
    addresses: Addresses
    weight: int = 1
    #: about to stop (a graceful stop or a pod's preStop has begun): it keeps its place and
    #: its replicas, but takes no leadership handed over (`laminar.node.core`)
    leaving: bool = False
    #: Chosen at process start and larger for every restart (e.g. wall-clock ns), so that a
    #: restarted process replaces its previous run whatever the incarnation numbers say.
    epoch: int = 0
    #: how many worker processes the member runs (`laminar.workers`), and the set of those
    #: not running now, as a bit mask (bit w: worker w)
    workers: int = 1
    workers_down: int = 0


def member_problem(member: Member) -> str | None:
    """Why `member` cannot be advertised (limits of the wire format), or None if it can."""
    if not 1 <= len(member.id.encode()) <= MAX_ID_BYTES:
        return f"member id must be 1..{MAX_ID_BYTES} UTF-8 bytes"
    for name in ("api", "peer", "gossip"):
        if not 1 <= len(getattr(member.addresses, name).encode()) <= MAX_ADDRESS_BYTES:
            return f"{name} address must be 1..{MAX_ADDRESS_BYTES} UTF-8 bytes"
    if not 1 <= member.weight <= MAX_WEIGHT:
        return f"weight must be in [1, {MAX_WEIGHT}]"
    if not 0 <= member.epoch <= MAX_EPOCH:
        return f"epoch must be in [0, {MAX_EPOCH}]"
    if not 1 <= member.workers <= MAX_WORKERS:
        return f"workers must be in [1, {MAX_WORKERS}]"
    if not 0 <= member.workers_down < 1 << member.workers:
        return "workers_down must name workers the member has"
    return None


@dataclass(frozen=True, slots=True)
class MemberState:
    """One row of a node's member table."""

    member: Member
    status: MemberStatus
    incarnation: int

    @property
    def id(self) -> str:
        return self.member.id

    @property
    def epoch(self) -> int:
        return self.member.epoch


class EventKind(StrEnum):
    JOINED = "joined"  # first seen alive, back from dead/left, or a new epoch (a restart)
    ALIVE = "alive"  # a suspect member refuted the suspicion
    UPDATED = "updated"  # an alive member changed its weight, leaving flag, workers or addresses
    SUSPECT = "suspect"
    DEAD = "dead"
    LEFT = "left"


@dataclass(frozen=True, slots=True)
class MembershipEvent:
    """A change in this node's view of another member (never of itself)."""

    kind: EventKind
    state: MemberState  # the member's row right after the change
    at_ms: int
