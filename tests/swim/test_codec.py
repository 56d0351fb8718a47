"""The SWIM wire format: every message round-trips with its envelope (sender address,
timestamp, nonce), and nothing malformed, foreign, forged or oversized gets through — nor
makes the decoder raise."""

from __future__ import annotations

import hmac
import struct
from dataclasses import replace

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from laminar.swim import Addresses, Codec, Member, MemberState, MemberStatus, Rejection
from laminar.swim.codec import (
    CLUSTER_HASH_OFFSET,
    HEADER,
    MAC_BYTES,
    MAGIC,
    MAGIC_OFFSET,
    MIN_DATAGRAM_BYTES,
    VERSION,
    Stamp,
    encode_sync_entry,
    encode_update,
)
from laminar.swim.config import SwimConfig
from laminar.swim.member import MAX_ADDRESS_BYTES, MAX_ID_BYTES
from laminar.swim.messages import (
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
)

from .helpers import CLUSTER, SECRET, member

SENDER = "10.0.0.1:7946"
STAMP = Stamp(1_700_000_000_123, 2**64 - 1)
CODEC = Codec(CLUSTER, SECRET, 1400, sender=SENDER)
#: The envelope as docs/formats.md §5 lays it out: str8 sender, u64 timestamp, u64 nonce.
ENVELOPE = bytes([len(SENDER)]) + SENDER.encode() + struct.pack("<QQ", 1_700_000_000_123, 2**64 - 1)
UPDATES: tuple[Update, ...] = (
    Alive(member("n1", epoch=7, weight=3, leaving=True), 5),
    Suspect("n2", 10**12, 3, "n1"),
    Dead("n3", 2**64 - 1, 2**32 - 1, "n4"),
    Left("n5", 0, 0),
)
SYNC = Sync(
    "n1",
    True,
    (
        MemberState(member("n1"), MemberStatus.ALIVE, 3),
        MemberState(member("n2", weight=9, leaving=True), MemberStatus.SUSPECT, 1),
        MemberState(member("n3"), MemberStatus.DEAD, 0),
        MemberState(member("ñ4"), MemberStatus.LEFT, 2),
        MemberState(replace(member("n5"), workers=3, workers_down=0b100), MemberStatus.ALIVE, 4),
        MemberState(
            replace(member("n6"), workers=64, workers_down=2**64 - 1), MemberStatus.DEAD, 1
        ),
    ),
)
MESSAGES: list[Message] = [
    Ping(7, "n1", 2**64 - 1, "n2", 0),
    Ack(2**32 - 1),
    PingReq(3, "n2", 5, "10.0.0.2:7946"),
    Nack(0),
    SYNC,
    Sync("n9", False, ()),
    Gossip(),
]


def encode(message: Message, updates: list[bytes] | tuple[bytes, ...] = ()) -> bytes:
    return CODEC.encode(message, updates, stamp=STAMP)


def datagram(message: Message, updates: tuple[Update, ...] = ()) -> Datagram:
    return Datagram(message, updates, SENDER, STAMP.timestamp_ms, STAMP.nonce)


def seal(
    kind: int,
    body: bytes,
    *,
    version: int = VERSION,
    magic: bytes = MAGIC,
    envelope: bytes = ENVELOPE,
) -> bytes:
    """An authenticated datagram around an arbitrary body (for malformed-body tests)."""
    unsigned = HEADER.pack(magic, version, kind, 0, CODEC.cluster_hash) + envelope + body
    return unsigned + hmac.digest(SECRET, unsigned, "sha256")


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_kind_round_trips_with_every_update_kind(message: Message) -> None:
    data = encode(message, [encode_update(u) for u in UPDATES])
    assert CODEC.decode(data) == datagram(message, UPDATES)
    assert CODEC.decode(encode(message)) == datagram(message)


def test_the_header_sits_at_fixed_offsets_for_the_xdp_router() -> None:
    data = encode(Ping(1, "n1", 1, "n2", 1))
    assert (MAGIC_OFFSET, CLUSTER_HASH_OFFSET) == (0, 8)
    assert data[0:4] == b"LMQG"
    assert struct.unpack_from("<H", data, 4) == (2,)
    assert data[6] == MessageKind.PING
    assert data[7] == 0
    assert struct.unpack_from("<Q", data, 8)[0] == xxhash.xxh64_intdigest(CLUSTER.encode())
    assert data[-MAC_BYTES:] == hmac.digest(SECRET, data[:-MAC_BYTES], "sha256")


def test_the_envelope_follows_the_header_under_the_mac() -> None:
    """Sender address, timestamp and nonce sit between header and body (docs/formats.md §5),
    so changing any of them breaks the MAC: they cannot be rewritten by a replayer."""
    data = encode(Ack(5))
    assert data[16 : 16 + len(ENVELOPE)] == ENVELOPE
    assert data[16 + len(ENVELOPE) : -MAC_BYTES] == struct.pack("<I", 5) + b"\x00"
    elsewhere = Codec(CLUSTER, SECRET, 1400, sender="10.0.0.2:7946")
    later = CODEC.encode(Ack(5), stamp=Stamp(STAMP.timestamp_ms + 1, STAMP.nonce))
    other_nonce = CODEC.encode(Ack(5), stamp=Stamp(STAMP.timestamp_ms, 0))
    assert len({data, elsewhere.encode(Ack(5), stamp=STAMP), later, other_nonce}) == 4
    forged = bytearray(data)
    forged[16 + 1 : 16 + len(SENDER) + 1] = b"10.0.0.9:7946"  # same length, another sender
    assert CODEC.decode(bytes(forged)) is Rejection.BAD_MAC
    with pytest.raises(ValueError):
        Codec(CLUSTER, SECRET, 1400, sender="")
    with pytest.raises(ValueError):
        CODEC.encode(Ack(1), stamp=Stamp(-1, 0))


@settings(max_examples=500)
@given(st.binary(max_size=1600))
def test_decoding_random_bytes_never_raises(data: bytes) -> None:
    assert isinstance(CODEC.decode(data), Rejection)


@settings(max_examples=500)
@given(kind=st.integers(0, 255), body=st.binary(max_size=1400))
def test_decoding_authenticated_garbage_never_raises(kind: int, body: bytes) -> None:
    result = CODEC.decode(seal(kind, body))
    assert isinstance(result, Datagram) or result in (
        Rejection.MALFORMED,
        Rejection.OVERSIZED,
        Rejection.TRUNCATED,
    )


@settings(max_examples=500)
@given(
    message=st.sampled_from(MESSAGES),
    updates=st.lists(st.sampled_from(UPDATES), max_size=3),
    edits=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 40),
)
def test_mutated_authenticated_datagrams_never_raise_and_what_decodes_is_canonical(
    message: Message, updates: list[Update], edits: list[tuple[int, int]], cut: int
) -> None:
    data = encode(message, [encode_update(u) for u in updates])
    body = bytearray(data[HEADER.size : -MAC_BYTES])  # envelope included
    for position, value in edits:
        if body:
            body[position % len(body)] = value
    mutated = seal(data[6], bytes(body[: max(0, len(body) - cut)]), envelope=b"")
    result = CODEC.decode(mutated)
    if isinstance(result, Datagram):  # whatever is accepted re-encodes to the same bytes
        again = Codec(CLUSTER, SECRET, 1400, sender=result.sender).encode(
            result.message,
            [encode_update(u) for u in result.updates],
            stamp=Stamp(result.timestamp_ms, result.nonce),
        )
        assert again == mutated
    else:
        assert result in (Rejection.MALFORMED, Rejection.TRUNCATED)


def _rejection_for_tampering_at(position: int) -> Rejection:
    if position < 4:
        return Rejection.BAD_MAGIC
    if position < 6:
        return Rejection.BAD_VERSION
    if 8 <= position < 16:
        return Rejection.WRONG_CLUSTER
    return Rejection.BAD_MAC  # kind, flags, envelope, body, updates and the MAC itself


def test_any_tampered_byte_is_rejected() -> None:
    data = encode(SYNC, [encode_update(u) for u in UPDATES])
    for position in range(len(data)):
        tampered = bytearray(data)
        tampered[position] ^= 0x01
        assert CODEC.decode(bytes(tampered)) is _rejection_for_tampering_at(position), position


def test_a_wrong_cluster_id_or_secret_is_rejected() -> None:
    other_cluster = Codec("other-cluster", SECRET, 1400, sender=SENDER)
    other_secret = Codec(CLUSTER, b"another secret", 1400, sender=SENDER)
    assert CODEC.decode(other_cluster.encode(Gossip(), stamp=STAMP)) is Rejection.WRONG_CLUSTER
    assert CODEC.decode(other_secret.encode(Gossip(), stamp=STAMP)) is Rejection.BAD_MAC


def test_oversized_and_truncated_datagrams_are_rejected() -> None:
    big = Codec(CLUSTER, SECRET, 4000, sender=SENDER)
    entries = tuple(MemberState(member(f"n{i}"), MemberStatus.ALIVE, 0) for i in range(40))
    oversized = big.encode(Sync("n1", False, entries), stamp=STAMP)
    assert len(oversized) > 1400
    assert CODEC.decode(oversized) is Rejection.OVERSIZED
    assert big.decode(oversized) == datagram(Sync("n1", False, entries))
    with pytest.raises(ValueError):
        encode(Sync("n1", False, entries))  # the encoder never builds one
    shortest = Codec(CLUSTER, SECRET, 1400, sender="a")
    gossip = shortest.encode(Gossip(), stamp=STAMP)  # 16 + (2 + 16) + 1 + 32 bytes
    assert len(gossip) == 67
    assert CODEC.decode(gossip) == Datagram(Gossip(), (), "a", STAMP.timestamp_ms, STAMP.nonce)
    assert CODEC.decode(b"") is Rejection.TRUNCATED
    assert CODEC.decode(gossip[:-1]) is Rejection.TRUNCATED
    assert CODEC.decode(encode(Ping(1, "n1", 1, "n2", 1))[:-1]) is Rejection.BAD_MAC


def test_wrong_magic_or_version_is_rejected_even_when_authenticated() -> None:
    assert CODEC.decode(seal(MessageKind.GOSSIP, b"\x00", magic=b"LMQX")) is Rejection.BAD_MAGIC
    assert CODEC.decode(seal(MessageKind.GOSSIP, b"\x00", version=1)) is Rejection.BAD_VERSION
    assert CODEC.decode(seal(MessageKind.GOSSIP, b"\x00", version=3)) is Rejection.BAD_VERSION


@pytest.mark.parametrize(
    "kind, body",
    [
        (99, b"\x00"),  # unknown message kind
        (MessageKind.PING, b"\x00"),  # no seq
        (MessageKind.GOSSIP, b"\x00\x00"),  # trailing byte
        (MessageKind.GOSSIP, b"\x02" + encode_update(UPDATES[1])),  # count says 2, has 1
        (MessageKind.GOSSIP, b"\x01\x09"),  # unknown update kind
        (MessageKind.ACK, b"\x01\x00\x00"),  # seq cut short
        (MessageKind.PING, b"\x01\x00\x00\x00\x00\x00"),  # empty target id
        (MessageKind.PING, b"\x01\x00\x00\x00\x02\xff\xfe\x00"),  # invalid UTF-8
        (MessageKind.PING, b"\x01\x00\x00\x00\x81" + b"a" * 129 + b"\x00"),  # id too long
        # an alive update with weight 0
        (MessageKind.GOSSIP, b"\x01" + encode_update(UPDATES[0])[:-5] + b"\x00\x00\x00\x00\x00"),
        # an alive update with an unknown flag bit
        (MessageKind.GOSSIP, b"\x01" + encode_update(UPDATES[0])[:-1] + b"\x04"),
        # workers: none, more than 64, a down worker the member does not have
        *(
            (
                MessageKind.GOSSIP,
                b"\x01" + encode_update(UPDATES[0])[:-1] + b"\x03" + struct.pack("<BQ", *w),
            )
            for w in ((0, 0), (65, 0), (2, 0b100))
        ),
        # a sync entry with status 5
        (
            MessageKind.SYNC,
            b"\x02n1\x00\x01\x00\x05" + encode_sync_entry(SYNC.entries[0])[1:] + b"\x00",
        ),
        # sync flags with an unknown bit
        (MessageKind.SYNC, b"\x02n1\x02\x00\x00\x00"),
        # a sync count far beyond what is there
        (MessageKind.SYNC, b"\x02n1\x00\xff\xff\x00"),
    ],
)
def test_malformed_authenticated_bodies_are_rejected(kind: int, body: bytes) -> None:
    assert CODEC.decode(seal(kind, body)) is Rejection.MALFORMED


@pytest.mark.parametrize(
    "envelope",
    [
        b"\x00" + struct.pack("<QQ", 1, 1) + b"\x00",  # empty sender
        b"\x02\xff\xfe" + struct.pack("<QQ", 1, 1),  # invalid UTF-8 sender
        b"\x05a:1" + struct.pack("<QQ", 1, 1),  # sender length past its bytes
        b"\x03a:1" + struct.pack("<Q", 1),  # no nonce
    ],
)
def test_malformed_authenticated_envelopes_are_rejected(envelope: bytes) -> None:
    assert CODEC.decode(seal(MessageKind.GOSSIP, b"\x00", envelope=envelope)) in (
        Rejection.MALFORMED,
        Rejection.TRUNCATED,
    )


def test_nonzero_header_flags_are_rejected() -> None:
    unsigned = (
        HEADER.pack(MAGIC, VERSION, MessageKind.GOSSIP, 1, CODEC.cluster_hash) + ENVELOPE + b"\x00"
    )
    assert CODEC.decode(unsigned + hmac.digest(SECRET, unsigned, "sha256")) is Rejection.MALFORMED


def test_a_large_member_table_is_chunked_into_bounded_sync_datagrams() -> None:
    states = [MemberState(member(f"member-{i:03d}"), MemberStatus.ALIVE, i) for i in range(60)]
    datagrams = CODEC.encode_sync("me", True, [encode_sync_entry(s) for s in states], stamp=STAMP)
    assert len(datagrams) > 1
    assert all(len(d) <= 1400 for d in datagrams)
    decoded = [CODEC.decode(d) for d in datagrams]
    assert all(isinstance(d, Datagram) and isinstance(d.message, Sync) for d in decoded)
    syncs = [d.message for d in decoded if isinstance(d, Datagram) and isinstance(d.message, Sync)]
    assert [s.reply_wanted for s in syncs] == [True] + [False] * (len(syncs) - 1)
    assert [e for s in syncs for e in s.entries] == states
    # each chunk has a nonce of its own (counting up, wrapping as a u64)
    nonces = [d.nonce for d in decoded if isinstance(d, Datagram)]
    assert len(set(nonces)) == len(nonces)


def test_the_smallest_allowed_datagram_carries_the_largest_record() -> None:
    longest = Member(
        "i" * MAX_ID_BYTES,
        Addresses("a" * MAX_ADDRESS_BYTES, "p" * MAX_ADDRESS_BYTES, "g" * MAX_ADDRESS_BYTES),
        weight=2**32 - 1,
        leaving=True,
        epoch=2**64 - 1,
        workers=64,
        workers_down=2**63,
    )
    small = Codec(CLUSTER, SECRET, MIN_DATAGRAM_BYTES, sender=longest.addresses.gossip)
    state = MemberState(longest, MemberStatus.SUSPECT, 2**32 - 1)
    stamp = Stamp(2**64 - 1, 0)
    (data,) = small.encode_sync(longest.id, True, [encode_sync_entry(state)], stamp=stamp)
    assert len(data) == MIN_DATAGRAM_BYTES
    assert small.decode(data) == Datagram(
        Sync(longest.id, True, (state,)), (), longest.addresses.gossip, 2**64 - 1, 0
    )
    with pytest.raises(ValueError):
        Codec(CLUSTER, SECRET, MIN_DATAGRAM_BYTES - 1, sender="a:1")
    with pytest.raises(ValueError):
        SwimConfig(max_datagram_bytes=MIN_DATAGRAM_BYTES - 1)
