"""The binary decoders under Hypothesis (issue 19, "Fuzzing stays in CI"): whatever bytes arrive,
each decoder returns a value or raises its documented error, never anything else (IndexError,
struct.error, UnicodeDecodeError, a bare ValueError, RecursionError, ...).

- the record batch (`laminar.log.batch`): parse_header, verify_batch (with the C record
  walker), iter_records / decode_batch, split_batches and records_from: BatchError;
- the SWIM datagram (`laminar.swim.codec.Codec.decode`): never raises (a Rejection);
- the Raft frame (`laminar.raft.codec.decode`): FrameError;
- the peer handshake (`laminar.server.transport`): parse_hello raises HandshakeError, and a
  server connection fed any bytes (before and after a genuine handshake) closes or delivers,
  with no exception escaping its reader;
- the binary acquire answer (`laminar.queue.wire.decode_acquired`): BatchFramingError.

Inputs are random bytes and valid encodings mutated (bytes flipped, set to extremes, inserted,
deleted, truncated), re-sealed where a checksum or MAC would otherwise stop them at the door:
the parsers behind it are what is fuzzed. Bounded and derandomized (tests/fuzz/__init__.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
import struct
from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st

from laminar.log.batch import (
    BATCH_HEADER_BYTES,
    decode_batch,
    iter_records,
    parse_header,
    records_from,
    split_batches,
    verify_batch,
)
from laminar.log.errors import BatchError, BatchFramingError
from laminar.queue.wire import decode_acquired, encode_acquired
from laminar.raft.codec import FrameError, decode, encode
from laminar.raft.messages import ConfState, Entry, EntryKind, Message, MessageType, Snapshot
from laminar.server import transport as peer
from laminar.swim.codec import HEADER, MAC_BYTES, MAGIC, VERSION, Codec, Rejection, Stamp
from laminar.swim.member import Addresses, Member, MemberState, MemberStatus
from laminar.swim.messages import (
    Ack,
    Alive,
    Datagram,
    Dead,
    Gossip,
    Left,
    MessageKind,
    Nack,
    Ping,
    PingReq,
    Suspect,
    Sync,
)

from . import decoder_settings
from .strategies import NOW_MS, U64, batches, fuzzed, resealed, texts

FUZZ = decoder_settings(300)
CLUSTER = "fuzz-cluster"
SECRET = b"fuzz-secret-0123456789abcdef0123"
U32 = 2**32 - 1
I64 = st.integers(-(2**63), 2**63 - 1)


# ---- record batches -------------------------------------------------------------------------

batch_inputs = st.one_of(
    fuzzed(batches()),
    fuzzed(batches()).map(resealed),
    fuzzed(batches(), keep=BATCH_HEADER_BYTES).map(resealed),  # the records section alone
).filter(lambda data: len(data) <= 4096)  # (mutations may not grow a batch past this)


def decode_one(data: bytes) -> None:
    """Each batch entry point on `data`: a value or a BatchError."""
    with contextlib.suppress(BatchError):
        parse_header(data)
    try:
        verify_batch(data, 1 << 20)
    except BatchError as e:
        event(f"verify_batch: {type(e).__name__}")
        verified = False
    else:
        event("verify_batch: valid")
        verified = True
    try:
        decoded = list(iter_records(data))
    except BatchError:
        # the C walker's verdict and the Python decoder agree on what is a valid batch
        assert not verified, "verify_batch passed a batch iter_records refuses"
    else:
        assert verified, "iter_records decoded a batch verify_batch refuses"
        assert len(decoded) == parse_header(data).record_count
    try:
        decode_batch(data)
    except BatchError:
        assert not verified


@FUZZ
@given(batch_inputs)
def test_batch_decoding_raises_only_batch_errors(data: bytes) -> None:
    decode_one(data)


@FUZZ
@given(st.lists(batch_inputs, min_size=1, max_size=4), st.integers(0, 30), st.integers(1, 20))
def test_reading_concatenated_batches_raises_only_batch_errors(
    parts: list[bytes], from_index: int, max_records: int
) -> None:
    data = b"".join(parts)
    try:
        for batch in split_batches(data):
            assert len(batch) >= BATCH_HEADER_BYTES
    except BatchError:
        pass
    try:
        found, _, _ = records_from(data, from_index, max_records)
    except BatchError:
        return
    assert len(found) <= max_records
    assert all(record.index >= from_index for record in found)


# ---- SWIM datagrams ------------------------------------------------------------------------

ids = texts(128)
addresses = texts(255)
epochs = st.integers(0, U64)
incarnations = st.integers(0, U32)
members = st.builds(
    Member,
    id=ids,
    addresses=st.builds(Addresses, addresses, addresses, addresses),
    weight=st.integers(1, U32),
    leaving=st.booleans(),
    epoch=epochs,
)
updates = st.one_of(
    st.builds(Alive, members, incarnations),
    st.builds(Suspect, ids, epochs, incarnations, ids),
    st.builds(Dead, ids, epochs, incarnations, ids),
    st.builds(Left, ids, epochs, incarnations),
)
swim_messages = st.one_of(
    st.builds(Ping, st.integers(0, U32), ids, epochs, ids, epochs),
    st.builds(Ack, st.integers(0, U32)),
    st.builds(PingReq, st.integers(0, U32), ids, epochs, addresses),
    st.builds(Nack, st.integers(0, U32)),
    st.builds(
        Sync,
        ids,
        st.booleans(),
        st.lists(
            st.builds(MemberState, members, st.sampled_from(list(MemberStatus)), incarnations),
            max_size=3,
        ).map(tuple),
    ),
    st.builds(Gossip),
)
CODEC = Codec(CLUSTER, SECRET, 8192, sender="10.0.0.1:7946")


@st.composite
def datagrams(draw: st.DrawFn) -> bytes:
    from laminar.swim.codec import encode_update

    encoded = [encode_update(u) for u in draw(st.lists(updates, max_size=3))]
    stamp = Stamp(draw(st.integers(0, U64)), draw(st.integers(0, U64)))
    return CODEC.encode(draw(swim_messages), encoded, stamp=stamp)


def sealed(data: bytes) -> bytes:
    """A datagram's bytes before its MAC (any of them, a valid header first when there is
    room for one), with a MAC that matches: what only a cluster member can send, and what
    reaches the parser behind the MAC check."""
    unsigned = data[:-MAC_BYTES] if len(data) > MAC_BYTES else data
    return unsigned + hmac.digest(SECRET, unsigned, "sha256")


def swim_inputs() -> st.SearchStrategy[bytes]:
    header = HEADER.size
    after_header = fuzzed(datagrams(), keep=header).map(sealed)
    any_kind = st.tuples(st.sampled_from([*MessageKind, 0, 7, 255]), st.binary(max_size=200)).map(
        lambda kb: sealed(
            HEADER.pack(MAGIC, VERSION, kb[0], 0, CODEC.cluster_hash) + kb[1] + bytes(32)
        )
    )
    return st.one_of(fuzzed(datagrams()), after_header, after_header, any_kind)


@FUZZ
@given(swim_inputs())
def test_swim_decoding_never_raises(data: bytes) -> None:
    result = CODEC.decode(data)
    assert isinstance(result, Datagram | Rejection)
    event(str(result) if isinstance(result, Rejection) else type(result.message).__name__)


@FUZZ
@given(swim_messages, st.lists(updates, max_size=3))
def test_swim_datagrams_round_trip(message: Any, ups: list[Any]) -> None:
    from laminar.swim.codec import encode_update

    data = CODEC.encode(message, [encode_update(u) for u in ups], stamp=Stamp(NOW_MS, 7))
    assert CODEC.decode(data) == Datagram(message, tuple(ups), CODEC.sender, NOW_MS, 7)


# ---- Raft frames ----------------------------------------------------------------------------

node_ids = texts(255)
entries = st.builds(
    Entry,
    index=I64,
    count=st.integers(1, U32),
    term=st.integers(0, 2**63 - 1),
    data=st.binary(max_size=40),
    kind=st.sampled_from(list(EntryKind)),
)
snapshots = st.builds(
    Snapshot,
    index=I64,
    term=I64,
    conf=st.builds(
        ConfState,
        st.lists(node_ids, max_size=3).map(tuple),
        st.lists(node_ids, max_size=2).map(tuple),
    ),
    data=st.binary(max_size=40),
)


def raft_message(nested: st.SearchStrategy[tuple[Message, ...]]) -> st.SearchStrategy[Message]:
    return st.builds(
        Message,
        type=st.sampled_from(list(MessageType)),
        group=texts(2000),
        src=node_ids,
        dst=node_ids,
        term=st.integers(0, 2**63 - 1),
        log_term=st.integers(0, 2**63 - 1),
        index=I64,
        entries=st.lists(entries, max_size=3).map(tuple),
        commit=I64,
        reject=st.booleans(),
        reject_hint=I64,
        context=st.binary(max_size=20),
        snapshot=st.none() | snapshots,
        batch=nested,
    )


raft_messages = raft_message(st.lists(raft_message(st.just(())), max_size=3).map(tuple))


@FUZZ
@given(fuzzed(raft_messages.map(encode)))
def test_raft_frame_decoding_raises_only_frame_errors(data: bytes) -> None:
    try:
        decode(data)
    except FrameError as e:
        event(f"FrameError: {str(e).split(' ')[0]}")
    else:
        event("decoded")


@FUZZ
@given(raft_messages)
def test_raft_frames_round_trip(message: Message) -> None:
    assert decode(encode(message)) == message


# ---- the peer handshake ----------------------------------------------------------------------

SERVER, CLIENT = "n1", "n2"
hellos = st.one_of(
    st.builds(peer.hello_body, st.just(CLUSTER), node_ids, node_ids),
    st.builds(peer.hello_body, st.just(CLUSTER), st.just(CLIENT), st.just(SERVER)),
)


@FUZZ
@given(fuzzed(hellos))
def test_parse_hello_raises_only_handshake_errors(body: bytes) -> None:
    try:
        _, client, server = peer.parse_hello(body)
    except peer.HandshakeError:
        event("HandshakeError")
        return
    assert peer.hello_body(CLUSTER, client, server)[8:] == body[8:]


class FakeTransport:
    """What a `_Connection` needs of an asyncio transport; records what it writes."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.written = bytearray()
        self.closing = False
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("192.0.2.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: bytes) -> None:
        assert not self.closing
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def abort(self) -> None:
        self.close()

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            asyncio.get_running_loop().call_soon(self.connection.connection_lost, None)


def feed(connection: Any, transport: FakeTransport, data: bytes, chunk: int) -> None:
    """Hand `data` to the connection as a socket would, `chunk` bytes at most at a time."""
    while data and not transport.closing and not transport.paused:
        view = connection.get_buffer(-1)
        n = min(len(view), len(data), chunk)
        if n == 0:
            return
        view[:n] = data[:n]
        data = data[n:]
        connection.buffer_updated(n)


def frames(bodies: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(body)) + body for body in bodies)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def serve(
    hello: bytes, before: bytes, after: bytes, chunk: int
) -> tuple[FakeTransport, Any, list[Any]]:
    """One incoming connection of a server: `hello` (a HELLO message's bytes, or anything),
    then the genuine PROOF if the server answered with a CHALLENGE, then `before` (buffered
    until the handshake completes), then end of file unless the handshake completed, then
    `after`. The accept task must end by itself, without an exception."""
    delivered: list[Any] = []
    server = peer.PeerTransport(
        SERVER, cluster_id=CLUSTER, secret=SECRET, on_messages=delivered.extend
    )
    connection = peer._Connection(server, incoming=True)
    transport = FakeTransport(connection)
    connection.connection_made(transport)
    (accepting,) = server._handshakes
    feed(connection, transport, hello, chunk)
    await settle()
    head = peer.HANDSHAKE_HEAD.size
    if len(transport.written) == head + peer.NONCE_BYTES:  # a CHALLENGE
        server_nonce = bytes(transport.written[head:])
        client_nonce = os.urandom(peer.NONCE_BYTES)
        args = (CLUSTER, CLIENT, SERVER, client_nonce, server_nonce)
        mac = peer.proof(SECRET, peer.CLIENT_LABEL, *args)
        feed(connection, transport, peer.handshake_message(peer.PROOF, client_nonce + mac), chunk)
    feed(connection, transport, before, chunk)
    await settle()
    if not accepting.done():
        connection.eof_received()
    await asyncio.wait_for(accepting, 5)  # re-raises whatever escaped the handshake
    feed(connection, transport, after, chunk)
    await settle()
    return transport, connection, delivered


GENUINE_HELLO = peer.handshake_message(peer.HELLO, peer.hello_body(CLUSTER, CLIENT, SERVER))
to_server = st.builds(
    Message,
    type=st.sampled_from(list(MessageType)),
    group=texts(40),
    src=st.just(CLIENT),
    dst=st.just(SERVER),
    term=st.integers(0, 2**63 - 1),
    entries=st.lists(entries, max_size=2).map(tuple),
)


@FUZZ
@given(
    fuzzed(hellos.map(lambda body: peer.handshake_message(peer.HELLO, body))),
    st.binary(max_size=100),
    st.integers(1, 64),
)
def test_a_server_handshake_fed_any_bytes_ends_cleanly(
    hello: bytes, after: bytes, chunk: int
) -> None:
    transport, connection, delivered = asyncio.run(serve(hello, after, b"", chunk))
    event("authenticated" if connection.authenticated else "closed")
    assert transport.closing or connection.authenticated
    assert not delivered or connection.authenticated


@FUZZ
@given(
    st.lists(fuzzed(to_server.map(encode)), min_size=1, max_size=4),
    st.sampled_from([0, 1, 4, 1000]),
    st.integers(1, 512),
)
def test_frames_after_a_genuine_handshake_deliver_or_close(
    bodies: list[bytes], cut: int, chunk: int
) -> None:
    data = frames(bodies)
    data = data[: len(data) - cut] if cut < len(data) else data
    half = len(data) // 2  # received before the handshake completes, and after
    transport, connection, delivered = asyncio.run(
        serve(GENUINE_HELLO, data[:half], data[half:], chunk)
    )
    assert connection.authenticated, "the genuine handshake failed"
    event(f"closed: {transport.closing}, delivered: {min(len(delivered), 2)}")
    for message in delivered:
        assert message.src == CLIENT and message.dst == SERVER


# ---- the binary acquire answer ------------------------------------------------------------


@st.composite
def acquired(draw: st.DrawFn) -> bytes:
    grants = draw(
        st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, U32), I64), max_size=4)
    )
    return encode_acquired(draw(texts(200)), grants, draw(st.lists(batches(), max_size=2)))


@FUZZ
@given(fuzzed(acquired()))
def test_acquire_answer_decoding_raises_only_framing_errors(data: bytes) -> None:
    try:
        consumer, _, rest = decode_acquired(data)
    except BatchFramingError:
        event("BatchFramingError")
        return
    assert isinstance(consumer, str) and len(rest) <= len(data)
    with contextlib.suppress(BatchError):
        records_from(rest, 0, 100)
