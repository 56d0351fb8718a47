"""SWIM messages (one per datagram) and the membership updates piggybacked on them."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from .member import Member, MemberState


class MessageKind(IntEnum):
    PING = 1
    ACK = 2
    PING_REQ = 3
    NACK = 4
    SYNC = 5
    GOSSIP = 6


@dataclass(frozen=True, slots=True)
class Ping:
    """Are you alive? `target` names the member meant, so a ping that reaches a different
    member at a reused address is not acked; `target_epoch` is the run the sender knows, so
    a restarted member can tell the sender about its new run in the ack. `source` and
    `source_epoch` name the sender, so a member that has not heard of it yet can sync."""

    seq: int
    target: str
    target_epoch: int
    source: str
    source_epoch: int


@dataclass(frozen=True, slots=True)
class Ack:
    seq: int


@dataclass(frozen=True, slots=True)
class PingReq:
    """Please ping `target` at `target_addr` and forward its ack, or a nack if none comes."""

    seq: int
    target: str
    target_epoch: int
    target_addr: str


@dataclass(frozen=True, slots=True)
class Nack:
    """Lifeguard: the relay is alive but heard no ack from the target."""

    seq: int


@dataclass(frozen=True, slots=True)
class Sync:
    """Push-pull: a chunk of the sender's member table. `reply_wanted` asks the receiver to
    send its own table back (set on the first chunk of a join or anti-entropy request)."""

    sender: str
    reply_wanted: bool
    entries: tuple[MemberState, ...]


@dataclass(frozen=True, slots=True)
class Gossip:
    """Carries nothing but piggybacked updates."""


Message = Ping | Ack | PingReq | Nack | Sync | Gossip


class UpdateKind(IntEnum):
    ALIVE = 1
    SUSPECT = 2
    DEAD = 3
    LEFT = 4


@dataclass(frozen=True, slots=True)
class Alive:
    """The member itself says it is alive, with what it advertises."""

    member: Member
    incarnation: int


@dataclass(frozen=True, slots=True)
class Suspect:
    """`accuser` could not reach member `id` (counted once per accuser by Lifeguard)."""

    id: str
    epoch: int
    incarnation: int
    accuser: str


@dataclass(frozen=True, slots=True)
class Dead:
    id: str
    epoch: int
    incarnation: int
    accuser: str


@dataclass(frozen=True, slots=True)
class Left:
    """The member itself left gracefully."""

    id: str
    epoch: int
    incarnation: int


Update = Alive | Suspect | Dead | Left


@dataclass(frozen=True, slots=True)
class Datagram:
    """A decoded, authenticated datagram, with its envelope: the gossip address its sender
    declares, when it sealed it (ms since the Unix epoch, by its clock) and its nonce."""

    message: Message
    updates: tuple[Update, ...]
    sender: str
    timestamp_ms: int
    nonce: int
