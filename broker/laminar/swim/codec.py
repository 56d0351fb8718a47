"""The SWIM wire format: versioned, bounded, authenticated datagrams (docs/formats.md §5).

    magic "LMQG" | u16 version | u8 kind | u8 flags | u64 xxh64(cluster id)   (16 bytes)
    str8 sender gossip address | u64 timestamp ms | u64 nonce                  (envelope)
    message body | u8 update count | updates                                    (variable)
    HMAC-SHA256(secret, every byte before it)                                   (32 bytes)

Magic and the cluster-id hash sit at fixed offsets so the XDP router can drop foreign
datagrams without parsing. The envelope binds a datagram to its sender's address and to a
moment, so the core can refuse one replayed from elsewhere, late, or twice (the checks are
the core's: they need the source address and the time). Decoding never raises: anything
oversized, truncated, foreign, unauthenticated or malformed comes back as a `Rejection`, and
nothing after the header is parsed before the MAC has matched.
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import xxhash

from .member import (
    MAX_ADDRESS_BYTES,
    MAX_ID_BYTES,
    MAX_WORKERS,
    Addresses,
    Member,
    MemberState,
    MemberStatus,
)
from .messages import (
    Ack,
    Alive,
    Datagram,
    Dead,
    Gossip,
    Left,
    Message,
    MessageKind,
    Nack,
    Ping,
    PingReq,
    Suspect,
    Sync,
    Update,
    UpdateKind,
)

MAGIC = b"LMQG"
#: 2: the envelope (sender address, timestamp, nonce) after the header.
VERSION = 2
HEADER = struct.Struct("<4sHBBQ")  # magic, version, kind, flags, cluster hash
HEADER_BYTES = HEADER.size  # 16
#: Offsets the XDP router reads: magic at 0 (4 bytes), cluster hash at 8 (u64 LE).
MAGIC_OFFSET = 0
CLUSTER_HASH_OFFSET = 8
MAC_BYTES = 32  # HMAC-SHA256
UPDATE_COUNT_BYTES = 1
MAX_UPDATES_PER_DATAGRAM = 255  # the count is a u8
MAX_SYNC_ENTRIES_PER_DATAGRAM = 65_535  # the count is a u16
LEAVING_FLAG = 0x01
WORKERS_FLAG = 0x02  # a worker count (u8) and the down workers' mask (u64) follow

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_EPOCH_INCARNATION = struct.Struct("<QI")
_WEIGHT_FLAGS = struct.Struct("<IB")
_SYNC_PREFIX_AFTER_SENDER = struct.Struct("<BH")  # flags, entry count
_STAMP = struct.Struct("<QQ")  # timestamp ms, nonce
#: Largest envelope: the longest sender address, the timestamp and the nonce.
MAX_ENVELOPE_BYTES = 1 + MAX_ADDRESS_BYTES + _STAMP.size
MAX_U64 = 2**64 - 1

_WORKERS = struct.Struct("<BQ")
#: Largest encoded member record: id, epoch, incarnation, three addresses, weight, flags,
#: workers.
MAX_MEMBER_RECORD_BYTES = (
    1
    + MAX_ID_BYTES
    + _EPOCH_INCARNATION.size
    + 3 * (1 + MAX_ADDRESS_BYTES)
    + _WEIGHT_FLAGS.size
    + _WORKERS.size
)
#: Shortest datagram: header, a 1-byte sender, timestamp, nonce, an empty gossip, the MAC.
MIN_ENCODED_BYTES = HEADER_BYTES + 2 + _STAMP.size + UPDATE_COUNT_BYTES + MAC_BYTES
#: Smallest max_datagram_bytes that still carries any single update or sync entry.
MIN_DATAGRAM_BYTES = (
    HEADER_BYTES
    + MAX_ENVELOPE_BYTES
    + 1
    + MAX_ID_BYTES
    + _SYNC_PREFIX_AFTER_SENDER.size
    + 1
    + MAX_MEMBER_RECORD_BYTES
    + UPDATE_COUNT_BYTES
    + MAC_BYTES
)


class Rejection(StrEnum):
    """Why a datagram was dropped; the core counts drops by these names."""

    OVERSIZED = "oversized"
    TRUNCATED = "truncated"
    BAD_MAGIC = "bad_magic"
    BAD_VERSION = "bad_version"
    WRONG_CLUSTER = "wrong_cluster"
    BAD_MAC = "bad_mac"
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class Stamp:
    """What a sender puts in every datagram's envelope besides its address: the time it
    sealed it (ms since the Unix epoch, its wall clock) and a nonce unique among its
    datagrams of that millisecond."""

    timestamp_ms: int
    nonce: int


def cluster_hash(cluster_id: str) -> int:
    """The 8-byte cluster-id field: XXH64 (seed 0) of the UTF-8 cluster id."""
    return int(xxhash.xxh64_intdigest(cluster_id.encode()))


# ---- encoding ---------------------------------------------------------------------------------


def _str8(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 255:
        raise ValueError(f"string too long for the wire: {len(raw)} bytes")
    return _U8.pack(len(raw)) + raw


def _member_record(member: Member, incarnation: int) -> bytes:
    workers = member.workers != 1 or member.workers_down != 0
    return b"".join(
        (
            _str8(member.id),
            _EPOCH_INCARNATION.pack(member.epoch, incarnation),
            _str8(member.addresses.api),
            _str8(member.addresses.peer),
            _str8(member.addresses.gossip),
            _WEIGHT_FLAGS.pack(
                member.weight,
                (LEAVING_FLAG if member.leaving else 0) | (WORKERS_FLAG if workers else 0),
            ),
            _WORKERS.pack(member.workers, member.workers_down) if workers else b"",
        )
    )


def encode_update(update: Update) -> bytes:
    """One piggybacked update, as queued for dissemination."""
    if isinstance(update, Alive):
        return _U8.pack(UpdateKind.ALIVE) + _member_record(update.member, update.incarnation)
    if isinstance(update, Left):
        return (
            _U8.pack(UpdateKind.LEFT)
            + _str8(update.id)
            + _EPOCH_INCARNATION.pack(update.epoch, update.incarnation)
        )
    kind = UpdateKind.SUSPECT if isinstance(update, Suspect) else UpdateKind.DEAD
    return (
        _U8.pack(kind)
        + _str8(update.id)
        + _EPOCH_INCARNATION.pack(update.epoch, update.incarnation)
        + _str8(update.accuser)
    )


def encode_sync_entry(state: MemberState) -> bytes:
    return _U8.pack(state.status) + _member_record(state.member, state.incarnation)


def _body(message: Message) -> tuple[MessageKind, bytes]:
    if isinstance(message, Ping):
        target = _str8(message.target) + _U64.pack(message.target_epoch)
        source = _str8(message.source) + _U64.pack(message.source_epoch)
        return MessageKind.PING, _U32.pack(message.seq) + target + source
    if isinstance(message, Ack):
        return MessageKind.ACK, _U32.pack(message.seq)
    if isinstance(message, PingReq):
        return MessageKind.PING_REQ, (
            _U32.pack(message.seq)
            + _str8(message.target)
            + _U64.pack(message.target_epoch)
            + _str8(message.target_addr)
        )
    if isinstance(message, Nack):
        return MessageKind.NACK, _U32.pack(message.seq)
    if isinstance(message, Sync):
        entries = [encode_sync_entry(entry) for entry in message.entries]
        return MessageKind.SYNC, _sync_body(message.sender, message.reply_wanted, entries)
    return MessageKind.GOSSIP, b""


def _sync_body(sender: str, reply_wanted: bool, entries: Sequence[bytes]) -> bytes:
    prefix = _str8(sender) + _SYNC_PREFIX_AFTER_SENDER.pack(int(reply_wanted), len(entries))
    return prefix + b"".join(entries)


class Codec:
    """Seals and opens datagrams of one cluster (its id hash, its secret, its size bound),
    sealing them as sent by `sender`, a member's gossip address."""

    def __init__(
        self, cluster_id: str, secret: bytes, max_datagram_bytes: int, *, sender: str
    ) -> None:
        if not secret:
            raise ValueError("the cluster secret must not be empty")
        if max_datagram_bytes < MIN_DATAGRAM_BYTES:
            raise ValueError(f"max_datagram_bytes must be at least {MIN_DATAGRAM_BYTES}")
        if not 1 <= len(sender.encode()) <= MAX_ADDRESS_BYTES:
            raise ValueError(f"the sender address must be 1..{MAX_ADDRESS_BYTES} UTF-8 bytes")
        self.cluster_hash = cluster_hash(cluster_id)
        self.max_datagram_bytes = max_datagram_bytes
        self.sender = sender
        self._sender = _str8(sender)
        self._secret = secret
        #: Bytes every datagram spends besides its body and updates.
        self._overhead = (
            HEADER_BYTES + len(self._sender) + _STAMP.size + UPDATE_COUNT_BYTES + MAC_BYTES
        )

    def piggyback_budget(self, message: Message) -> tuple[MessageKind, bytes, int]:
        """The encoded body of `message` and the bytes left for piggybacked updates."""
        kind, body = _body(message)
        return kind, body, self.max_datagram_bytes - self._overhead - len(body)

    def seal(
        self, kind: MessageKind, body: bytes, updates: Sequence[bytes] = (), *, stamp: Stamp
    ) -> bytes:
        """Frame and authenticate an encoded body with pre-encoded updates."""
        if len(updates) > MAX_UPDATES_PER_DATAGRAM:
            raise ValueError("too many piggybacked updates")
        if not (0 <= stamp.timestamp_ms <= MAX_U64 and 0 <= stamp.nonce <= MAX_U64):
            raise ValueError("timestamp and nonce are u64")
        unsigned = b"".join(
            (
                HEADER.pack(MAGIC, VERSION, kind, 0, self.cluster_hash),
                self._sender,
                _STAMP.pack(stamp.timestamp_ms, stamp.nonce),
                body,
                _U8.pack(len(updates)),
                *updates,
            )
        )
        if len(unsigned) + MAC_BYTES > self.max_datagram_bytes:
            raise ValueError("datagram exceeds max_datagram_bytes")
        return unsigned + hmac.digest(self._secret, unsigned, "sha256")

    def encode(self, message: Message, updates: Sequence[bytes] = (), *, stamp: Stamp) -> bytes:
        kind, body = _body(message)
        return self.seal(kind, body, updates, stamp=stamp)

    def sync_bodies(
        self, sender: str, reply_wanted: bool, entries: Sequence[bytes]
    ) -> list[tuple[bytes, int]]:
        """A member table as the bodies of as many sync datagrams as it takes, each with the
        bytes left in its datagram for piggybacked updates. Only the first asks for a reply;
        an empty table still gives one body."""
        fixed = self._overhead + len(_str8(sender)) + _SYNC_PREFIX_AFTER_SENDER.size
        room = self.max_datagram_bytes - fixed
        chunks: list[list[bytes]] = [[]]
        used = 0
        for entry in entries:
            if len(entry) > room:
                raise ValueError("sync entry larger than a datagram")
            if used + len(entry) > room or len(chunks[-1]) == MAX_SYNC_ENTRIES_PER_DATAGRAM:
                chunks.append([])
                used = 0
            chunks[-1].append(entry)
            used += len(entry)
        bodies = []
        for i, chunk in enumerate(chunks):
            body = _sync_body(sender, reply_wanted and i == 0, chunk)
            bodies.append((body, room - sum(len(entry) for entry in chunk)))
        return bodies

    def encode_sync(
        self, sender: str, reply_wanted: bool, entries: Sequence[bytes], *, stamp: Stamp
    ) -> list[bytes]:
        """`sync_bodies`, sealed without piggybacked updates (nonces counting up from the
        stamp's, as u64s)."""
        return [
            self.seal(
                MessageKind.SYNC,
                body,
                stamp=Stamp(stamp.timestamp_ms, (stamp.nonce + i) & MAX_U64),
            )
            for i, (body, _) in enumerate(self.sync_bodies(sender, reply_wanted, entries))
        ]

    def decode(self, data: bytes) -> Datagram | Rejection:
        """Open a datagram; never raises."""
        if len(data) > self.max_datagram_bytes:
            return Rejection.OVERSIZED
        if len(data) < MIN_ENCODED_BYTES:
            return Rejection.TRUNCATED
        magic, version, kind, flags, cluster = HEADER.unpack_from(data)
        if magic != MAGIC:
            return Rejection.BAD_MAGIC
        if version != VERSION:
            return Rejection.BAD_VERSION
        if cluster != self.cluster_hash:
            return Rejection.WRONG_CLUSTER
        unsigned = memoryview(data)[:-MAC_BYTES]
        expected = hmac.digest(self._secret, unsigned, "sha256")
        if not hmac.compare_digest(expected, data[-MAC_BYTES:]):
            return Rejection.BAD_MAC
        if flags != 0:
            return Rejection.MALFORMED
        try:
            reader = _Reader(bytes(unsigned), HEADER_BYTES)
            sender = reader.str8(MAX_ADDRESS_BYTES)
            timestamp_ms, nonce = reader.unpack(_STAMP)
            message = reader.message(kind)
            count = reader.u8()
            updates = tuple(reader.update() for _ in range(count))
            reader.end()
        except (_Malformed, struct.error, UnicodeDecodeError, ValueError):
            return Rejection.MALFORMED
        return Datagram(message, updates, sender, timestamp_ms, nonce)


# ---- decoding ---------------------------------------------------------------------------------


class _Malformed(Exception):
    pass


class _Reader:
    """Bounds-checked cursor over an authenticated datagram (MAC stripped)."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def _take(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise _Malformed("truncated field")
        raw = self.data[self.pos : end]
        self.pos = end
        return raw

    def u8(self) -> int:
        return self._take(1)[0]

    def unpack(self, layout: struct.Struct) -> tuple[int, ...]:
        values: tuple[int, ...] = layout.unpack(self._take(layout.size))
        return values

    def str8(self, max_bytes: int) -> str:
        size = self.u8()
        if not 1 <= size <= max_bytes:
            raise _Malformed("bad string length")
        return self._take(size).decode()

    def end(self) -> None:
        if self.pos != len(self.data):
            raise _Malformed("trailing bytes")

    def member_record(self) -> tuple[Member, int]:
        member_id = self.str8(MAX_ID_BYTES)
        epoch, incarnation = self.unpack(_EPOCH_INCARNATION)
        api = self.str8(MAX_ADDRESS_BYTES)
        peer = self.str8(MAX_ADDRESS_BYTES)
        gossip = self.str8(MAX_ADDRESS_BYTES)
        weight, flags = self.unpack(_WEIGHT_FLAGS)
        if weight < 1 or flags & ~(LEAVING_FLAG | WORKERS_FLAG):
            raise _Malformed("bad weight or flags")
        workers, down = self.unpack(_WORKERS) if flags & WORKERS_FLAG else (1, 0)
        if not 1 <= workers <= MAX_WORKERS or down >> workers:
            raise _Malformed("bad workers")
        member = Member(
            member_id,
            Addresses(api, peer, gossip),
            weight,
            bool(flags & LEAVING_FLAG),
            epoch,
            workers,
            down,
        )
        return member, incarnation

    def update(self) -> Update:
        kind = self.u8()
        if kind == UpdateKind.ALIVE:
            member, incarnation = self.member_record()
            return Alive(member, incarnation)
        member_id = self.str8(MAX_ID_BYTES)
        epoch, incarnation = self.unpack(_EPOCH_INCARNATION)
        if kind == UpdateKind.LEFT:
            return Left(member_id, epoch, incarnation)
        if kind == UpdateKind.SUSPECT:
            return Suspect(member_id, epoch, incarnation, self.str8(MAX_ID_BYTES))
        if kind == UpdateKind.DEAD:
            return Dead(member_id, epoch, incarnation, self.str8(MAX_ID_BYTES))
        raise _Malformed("unknown update kind")

    def message(self, kind: int) -> Message:
        if kind == MessageKind.PING:
            (seq,) = self.unpack(_U32)
            target = self.str8(MAX_ID_BYTES)
            (target_epoch,) = self.unpack(_U64)
            source = self.str8(MAX_ID_BYTES)
            return Ping(seq, target, target_epoch, source, self.unpack(_U64)[0])
        if kind == MessageKind.ACK:
            return Ack(self.unpack(_U32)[0])
        if kind == MessageKind.PING_REQ:
            (seq,) = self.unpack(_U32)
            target = self.str8(MAX_ID_BYTES)
            (epoch,) = self.unpack(_U64)
            return PingReq(seq, target, epoch, self.str8(MAX_ADDRESS_BYTES))
        if kind == MessageKind.NACK:
            return Nack(self.unpack(_U32)[0])
        if kind == MessageKind.SYNC:
            sender = self.str8(MAX_ID_BYTES)
            flags, count = self.unpack(_SYNC_PREFIX_AFTER_SENDER)
            if flags & ~1:
                raise _Malformed("bad sync flags")
            entries = []
            for _ in range(count):
                status = self.u8()
                if not MemberStatus.ALIVE <= status <= MemberStatus.LEFT:
                    raise _Malformed("bad member status")
                member, incarnation = self.member_record()
                entries.append(MemberState(member, MemberStatus(status), incarnation))
            return Sync(sender, bool(flags & 1), tuple(entries))
        if kind == MessageKind.GOSSIP:
            return Gossip()
        raise _Malformed("unknown message kind")
