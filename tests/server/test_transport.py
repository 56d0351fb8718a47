"""The peer transport on real loopback sockets: ordered, batched delivery (large appends and
folded heartbeats included), both directions, the authenticated handshake (wrong secret,
wrong cluster, replays, a server that proves nothing to an unauthenticated client), hostile
bytes, forged routing, floods of idle connections, reconnection, address changes, the queue
bound, a clean stop, and mutual TLS (another CA's peer, a plain peer and a certificate for
another name refused). The raw peers here speak the handshake as docs/formats.md §7
describes it, independently of the module's own helpers."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import os
import socket
import struct
import time
import warnings
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import xxhash

from laminar.certs import KeyPair, issue, make_ca
from laminar.raft import Entry, EntryKind, Message, MessageType
from laminar.raft.codec import MAX_FRAME_BYTES, encode
from laminar.server import transport as transport_module
from laminar.server.transport import PeerTransport
from laminar.swim.address import parse_address
from laminar.tls import CertificateStore, TlsFiles

CLUSTER = "test-cluster"
SECRET = b"test-secret-0123456789abcdef0123"
HOST = "127.0.0.1"
WAIT_S = 10.0
POLL_S = 0.01


# ---- helpers --------------------------------------------------------------------------------


async def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        await asyncio.sleep(POLL_S)


class Inbox:
    """Collects what a transport delivers, batch by batch."""

    def __init__(self) -> None:
        self.batches: list[list[Message]] = []

    def __call__(self, messages: list[Message]) -> None:
        self.batches.append(list(messages))

    @property
    def messages(self) -> list[Message]:
        return [message for batch in self.batches for message in batch]


def node(
    name: str, *, secret: bytes = SECRET, cluster: str = CLUSTER, **kwargs: Any
) -> tuple[PeerTransport, Inbox]:
    inbox = Inbox()
    return PeerTransport(
        name, cluster_id=cluster, secret=secret, on_messages=inbox, **kwargs
    ), inbox


@contextlib.asynccontextmanager
async def stopping(*transports: PeerTransport) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for transport in transports:
            await transport.stop()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def vote(src: str, dst: str, term: int) -> Message:
    return Message(MessageType.VOTE, "orders/0", src, dst, term, log_term=term - 1, index=term)


def append(src: str, dst: str, index: int, blocks: list[bytes]) -> Message:
    entries = tuple(
        Entry(index + i, 1, 3, block, EntryKind.NORMAL) for i, block in enumerate(blocks)
    )
    return Message(
        MessageType.APPEND, "orders/1", src, dst, 3, log_term=3, index=index - 1, entries=entries
    )


def heartbeats(src: str, dst: str, groups: int, commit: int) -> Message:
    parts = tuple(
        Message(MessageType.HEARTBEAT, f"topic/{g}", src, dst, 5, commit=commit)
        for g in range(groups)
    )
    return Message(MessageType.HEARTBEATS, "", src, dst, 0, batch=parts)


# ---- a raw peer speaking the wire format of docs/formats.md §7 ------------------------------

HEAD = struct.Struct("<4sHBBH")  # magic, version, kind, flags, body length
HELLO, CHALLENGE, PROOF, CONFIRM = 1, 2, 3, 4
CLIENT_LABEL, SERVER_LABEL = b"LMQP/2 client", b"LMQP/2 server"


def handshake_message(kind: int, body: bytes, version: int = 2) -> bytes:
    return HEAD.pack(b"LMQP", version, kind, 0, len(body)) + body


def str8(value: str) -> bytes:
    raw = value.encode()
    return bytes([len(raw)]) + raw


def mac(
    label: bytes,
    client: str,
    server: str,
    client_nonce: bytes,
    server_nonce: bytes,
    *,
    secret: bytes = SECRET,
    cluster: str = CLUSTER,
) -> bytes:
    raw_cluster = cluster.encode()
    transcript = (
        label
        + struct.pack("<H", len(raw_cluster))
        + raw_cluster
        + str8(client)
        + str8(server)
        + client_nonce
        + server_nonce
    )
    return hmac.digest(secret, transcript, "sha256")


def hello(client: str, server: str, cluster: str = CLUSTER) -> bytes:
    cluster_hash = xxhash.xxh64_intdigest(cluster.encode())
    body = struct.pack("<Q", cluster_hash) + str8(client) + str8(server)
    return handshake_message(HELLO, body)


def frame(message: Message) -> bytes:
    body = encode(message)
    return struct.pack("<I", len(body)) + body


@dataclass
class RawPeer:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    hello: bytes = b""
    proof: bytes = b""  # the whole PROOF message sent

    async def read_message(self, kind: int, length: int) -> bytes:
        head = await asyncio.wait_for(self.reader.readexactly(HEAD.size), WAIT_S)
        assert HEAD.unpack(head) == (b"LMQP", 2, kind, 0, length)
        return await asyncio.wait_for(self.reader.readexactly(length), WAIT_S)

    async def read_challenge(self) -> bytes:
        """The server nonce: a CHALLENGE carries nothing else."""
        return await self.read_message(CHALLENGE, 32)

    async def expect_closed(self) -> None:
        """The other side closes the connection (and sends nothing before it)."""
        try:
            data = await asyncio.wait_for(self.reader.read(), WAIT_S)
        except ConnectionResetError:
            data = b""
        assert data == b""

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def raw_connect(address: str) -> RawPeer:
    host, port = parse_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    return RawPeer(reader, writer)


async def raw_authenticated(
    address: str, client: str = "x", server: str = "b"
) -> tuple[RawPeer, bytes, bytes]:
    """A connection that completed the handshake as node `client`; with the server's nonce
    and its proof (CONFIRM body)."""
    peer = await raw_connect(address)
    peer.hello = hello(client, server)
    peer.writer.write(peer.hello)
    server_nonce = await peer.read_challenge()
    client_nonce = os.urandom(32)
    client_proof = mac(CLIENT_LABEL, client, server, client_nonce, server_nonce)
    peer.proof = handshake_message(PROOF, client_nonce + client_proof)
    peer.writer.write(peer.proof)
    server_proof = await peer.read_message(CONFIRM, 32)
    expected = mac(SERVER_LABEL, client, server, client_nonce, server_nonce)
    assert hmac.compare_digest(server_proof, expected)
    return peer, server_nonce, server_proof


# ---- delivery -------------------------------------------------------------------------------


async def test_many_messages_arrive_in_order_with_large_appends_and_folded_heartbeats() -> None:
    a, _ = node("a")
    b, inbox = node("b")
    async with stopping(a, b):
        address = await b.start(HOST, 0)
        blocks = [os.urandom(256 << 10) for _ in range(4)]  # 1 MiB of entries per append
        sent: list[Message] = []
        for i in range(300):
            if i % 10 == 0:
                sent.append(append("a", "b", i * 4, blocks[i % 4 :] + blocks[: i % 4]))
            elif i % 3 == 0:
                sent.append(heartbeats("a", "b", groups=50, commit=i))
            else:
                sent.append(vote("a", "b", i + 1))
        # Several messages per send call, and more than one call per event-loop turn.
        for start in range(0, len(sent), 7):
            assert a.send("b", address, sent[start : start + 7])
            if start % 28 == 0:
                await asyncio.sleep(0)
        await wait_for(lambda: len(inbox.messages) >= len(sent), "all messages delivered")
        await asyncio.sleep(0.05)  # nothing extra arrives
        assert inbox.messages == sent
        assert sum(len(message.batch) for message in inbox.messages) == 50 * 90
        assert all(batch for batch in inbox.batches)
        assert len(inbox.batches) < len(sent)  # reads carry several frames each
        assert a.stats["frames_sent"] == b.stats["frames_received"] == len(sent)
        assert a.stats["bytes_sent"] == b.stats["bytes_received"]
        assert a.stats["bytes_sent"] == sum(4 + len(encode(message)) for message in sent)
        assert a.peers() == {"b": True}
        assert (a.stats["connects"], b.stats["accepts"]) == (1, 1)
        assert a.stats["dropped_queue_full"] == b.stats["bad_frames"] == 0
        assert a.queued_bytes("b") == 0


async def test_two_way_traffic_uses_one_connection_per_direction() -> None:
    a, inbox_a = node("a")
    b, inbox_b = node("b")
    async with stopping(a, b):
        address_a = await a.start(HOST, 0)
        address_b = await b.start(HOST, 0)
        to_b = [vote("a", "b", term) for term in range(1, 401)]
        to_a = [
            Message(MessageType.APPEND_RESP, "orders/1", "b", "a", 3, index=i) for i in range(400)
        ]
        for i in range(0, 400, 20):
            assert a.send("b", address_b, to_b[i : i + 20])
            assert b.send("a", address_a, to_a[i : i + 20])
            await asyncio.sleep(0)
        await wait_for(
            lambda: len(inbox_a.messages) == 400 and len(inbox_b.messages) == 400, "both ways"
        )
        assert inbox_b.messages == to_b
        assert inbox_a.messages == to_a
        assert a.peers() == {"b": True} and b.peers() == {"a": True}
        for transport in (a, b):
            assert transport.stats["connects"] == transport.stats["accepts"] == 1
            assert transport.stats["frames_sent"] == transport.stats["frames_received"] == 400


async def test_loopback_throughput_of_1mib_appends() -> None:
    """Moves 1 MiB appends through loopback and checks every byte; prints the rate (no
    timing is asserted)."""
    a, _ = node("a")
    b, inbox = node("b")
    count = 128
    async with stopping(a, b):
        address = await b.start(HOST, 0)
        blocks = [os.urandom(256 << 10) for _ in range(5)]
        assert a.send("b", address, [vote("a", "b", 1)])  # connect first
        await wait_for(lambda: len(inbox.messages) == 1, "connected")
        started = time.perf_counter()
        for i in range(count):
            await wait_for(lambda: a.queued_bytes("b") <= 8 << 20, "queue drains")
            assert a.send("b", address, [append("a", "b", 4 * i, blocks[i % 5 : i % 5 + 4])])
        await wait_for(lambda: len(inbox.messages) == count + 1, "appends delivered")
        elapsed = time.perf_counter() - started
        print(f"\nloopback: {count} MiB of 1 MiB appends in {elapsed:.3f} s ", end="")
        print(f"= {count * (1 << 20) / elapsed / 1e6:.0f} MB/s")
        for i, message in enumerate(inbox.messages[1:]):
            assert message.index == 4 * i - 1
            assert [entry.data for entry in message.entries] == blocks[i % 5 : i % 5 + 4]
        assert b.stats["bad_frames"] == a.stats["dropped_queue_full"] == 0


# ---- authentication -------------------------------------------------------------------------


async def test_wrong_secret_is_rejected_on_both_sides() -> None:
    a, inbox_a = node("a", secret=b"not-the-cluster-secret")
    b, inbox_b = node("b")
    async with stopping(a, b):
        address = await b.start(HOST, 0)
        assert a.send("b", address, [vote("a", "b", 1)])
        await wait_for(
            lambda: a.stats["auth_failures"] >= 1 and b.stats["auth_failures"] >= 1,
            "both sides count the failed handshake",
        )
        await asyncio.sleep(0.1)  # time for a (wrong) delivery, and for a retry
        assert inbox_b.batches == [] and inbox_a.batches == []
        assert a.peers() == {"b": False}
        assert a.stats["connects"] == b.stats["accepts"] == 0
        assert b.stats["frames_received"] == 0
        assert a.queued_bytes("b") > 0  # still queued: it keeps retrying


async def test_wrong_cluster_is_rejected(caplog: pytest.LogCaptureFixture) -> None:
    a, _ = node("a", cluster="another-cluster")
    b, inbox = node("b")
    async with stopping(a, b):
        address = await b.start(HOST, 0)
        assert a.send("b", address, [vote("a", "b", 1)])
        await wait_for(
            lambda: a.stats["auth_failures"] >= 1 and b.stats["auth_failures"] >= 1,
            "both sides count the failed handshake",
        )
        await asyncio.sleep(0.1)
        assert inbox.batches == []
        assert a.stats["connects"] == b.stats["accepts"] == 0
        assert "a belongs to another cluster" in caplog.text  # refused before any proof
        # The same secret and ids, with a HELLO claiming the right cluster but a proof over
        # the transcript of another: the proofs bind the cluster id, not just its hash.
        raw = await raw_connect(address)
        raw.writer.write(hello("x", "b"))
        server_nonce = await raw.read_challenge()
        client_nonce = os.urandom(32)
        wrong = mac(CLIENT_LABEL, "x", "b", client_nonce, server_nonce, cluster="another-cluster")
        raw.writer.write(handshake_message(PROOF, client_nonce + wrong))
        await raw.expect_closed()  # no CONFIRM
        await raw.close()


async def test_handshake_for_another_node_is_rejected() -> None:
    b, inbox = node("b")
    async with stopping(b):
        address = await b.start(HOST, 0)
        raw = await raw_connect(address)
        raw.writer.write(hello("x", "c"))  # meant for node c
        await raw.expect_closed()
        await raw.close()
        assert b.stats["auth_failures"] == 1 and inbox.batches == []


async def test_replayed_handshakes_are_rejected_both_ways() -> None:
    a, _ = node("a")
    b, inbox = node("b")
    async with stopping(a, b):
        address = await b.start(HOST, 0)
        # Client side replay: a recorded HELLO and PROOF on a new connection, then a frame.
        recorded, _, _ = await raw_authenticated(address, "x", "b")
        recorded.writer.write(frame(vote("x", "b", 1)))
        await wait_for(lambda: len(inbox.messages) == 1, "the genuine connection works")
        replay = await raw_connect(address)
        replay.writer.write(recorded.hello)
        await replay.read_challenge()  # a fresh server nonce: the old proof cannot match
        replay.writer.write(recorded.proof + frame(vote("x", "b", 2)))
        await replay.expect_closed()
        await asyncio.sleep(0.05)
        assert [message.term for message in inbox.messages] == [1]
        assert b.stats["auth_failures"] == 1
        # Server side replay: a fake "b" answers a's HELLO with the nonce and the proof the
        # real b gave in a handshake with "a" (for another client nonce).
        probe, old_nonce, old_proof = await raw_authenticated(address, "a", "b")
        await probe.close()
        got_proof = asyncio.Event()

        async def fake_b(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                head = await reader.readexactly(HEAD.size)
                await reader.readexactly(HEAD.unpack(head)[4])  # a's HELLO
                writer.write(handshake_message(CHALLENGE, old_nonce))
                await reader.readexactly(HEAD.size + 64)  # a's PROOF
                got_proof.set()
                writer.write(handshake_message(CONFIRM, old_proof))
                await reader.read()  # until a hangs up
            writer.close()

        fake = await asyncio.start_server(fake_b, HOST, 0)
        try:
            fake_address = f"{HOST}:{fake.sockets[0].getsockname()[1]}"
            assert a.send("b", fake_address, [vote("a", "b", 1)])
            await wait_for(lambda: a.stats["auth_failures"] >= 1, "a rejects the replay")
            assert got_proof.is_set()
            assert a.stats["connects"] == 0 and a.peers() == {"b": False}
        finally:
            await a.stop()
            fake.close()
            await fake.wait_closed()
        await recorded.close()


async def test_a_stalled_handshake_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_module, "HANDSHAKE_TIMEOUT_S", 0.2)
    b, inbox = node("b")
    async with stopping(b):
        address = await b.start(HOST, 0)
        raw = await raw_connect(address)
        raw.writer.write(hello("x", "b")[:15])  # half a HELLO, then silence
        started = time.monotonic()
        await raw.expect_closed()
        assert time.monotonic() - started < 5
        await raw.close()
        assert b.stats["auth_failures"] == 1 and inbox.batches == []


async def test_an_unauthenticated_client_gets_nothing_derived_from_the_secret() -> None:
    """An outsider who sends a valid HELLO receives a fresh nonce and nothing else: no proof
    to guess the secret against offline. A wrong proof ends the connection with nothing
    more sent (no CONFIRM)."""
    b, inbox = node("b")
    async with stopping(b):
        address = await b.start(HOST, 0)
        nonces = []
        for _ in range(2):
            raw = await raw_connect(address)
            raw.writer.write(hello("x", "b"))
            nonces.append(await raw.read_challenge())  # exactly a head and 32 bytes
            raw.writer.write(handshake_message(PROOF, os.urandom(64)))  # a guess
            await raw.expect_closed()  # and not a byte more
            await raw.close()
        assert nonces[0] != nonces[1]  # fresh for every connection
        assert b.stats["auth_failures"] == 2 and b.stats["accepts"] == 0
        assert inbox.batches == []


async def test_a_client_sends_no_frame_to_a_server_that_has_not_proven_itself() -> None:
    a, _ = node("a")
    after_proof: list[bytes] = []
    done = asyncio.Event()

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readexactly(HEAD.size)
            await reader.readexactly(HEAD.unpack(head)[4])  # a's HELLO
            writer.write(handshake_message(CHALLENGE, os.urandom(32)))
            await reader.readexactly(HEAD.size + 64)  # a's PROOF
            writer.write(handshake_message(CONFIRM, os.urandom(32)))  # no secret: a guess
            after_proof.append(await reader.read())  # until a hangs up
        writer.close()
        done.set()

    server = await asyncio.start_server(impostor, HOST, 0)
    try:
        fake_address = f"{HOST}:{server.sockets[0].getsockname()[1]}"
        assert a.send("b", fake_address, [vote("a", "b", 1)])
        await asyncio.wait_for(done.wait(), WAIT_S)
        assert after_proof == [b""]  # a hung up without sending its queued frame
        assert a.stats["auth_failures"] >= 1 and a.stats["connects"] == 0
        assert a.stats["frames_sent"] == 0
    finally:
        await a.stop()
        server.close()
        await server.wait_closed()


async def test_an_old_handshake_version_and_a_client_posing_as_the_server_are_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    b, _ = node("b")
    async with stopping(b):
        address = await b.start(HOST, 0)
        old = await raw_connect(address)
        body = struct.pack("<Q", xxhash.xxh64_intdigest(CLUSTER.encode())) + os.urandom(32)
        old.writer.write(handshake_message(HELLO, body + str8("x") + str8("b"), version=1))
        await old.expect_closed()
        await old.close()
        assert "handshake version 1, this broker speaks 2" in caplog.text
        itself = await raw_connect(address)
        itself.writer.write(hello("b", "b"))
        await itself.expect_closed()
        await itself.close()
        assert b.stats["auth_failures"] == 2 and b.stats["accepts"] == 0


async def idle_sockets(address: str, count: int, source: str) -> list[socket.socket]:
    """`count` TCP connections from `source` (a loopback address) that send nothing."""
    loop = asyncio.get_running_loop()
    host, port = parse_address(address)
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((source, 0))
        await loop.sock_connect(sock, (host, port))
        sockets.append(sock)
    return sockets


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


async def test_a_peer_completes_its_handshake_while_one_address_holds_256_idle_sockets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """256 idle connections from 127.0.0.2 (more than the 128 pending handshakes allowed in
    all) do not lock out a real peer on 127.0.0.1: 8 of them stay pending (for the whole
    test: the idle timeout is raised), the others are closed at once, and the peer's
    handshake completes at once rather than when the flood times out."""
    monkeypatch.setattr(transport_module, "IDLE_HANDSHAKE_TIMEOUT_S", 60.0, raising=False)
    b, inbox = node("b")
    a, _ = node("a")
    flood: list[socket.socket] = []
    async with stopping(a, b):
        address = await b.start(HOST, 0)
        try:
            flood = await idle_sockets(address, 256, "127.0.0.2")
            started = time.monotonic()
            assert a.send("b", address, [vote("a", "b", 1)])  # dials after the flood
            # Less than the 5 s handshake timeout that the flood's connections had before.
            await wait_for(lambda: len(inbox.messages) == 1, "a's message", timeout_s=3.0)
            print(f"\nhandshake under a flood of 256: {time.monotonic() - started:.3f} s ", end="")
            assert a.stats["connects"] == 1 and b.stats["accepts"] == 1
            # The flood was in force: b had refused all but 8, and still holds those.
            assert b.stats["handshakes_refused"] == 256 - 8
            await wait_for(
                lambda: sum(closed_by_peer(sock) for sock in flood) == 256 - 8, "refusals seen"
            )
            assert sum(not closed_by_peer(sock) for sock in flood) == 8
            assert b.stats["auth_failures"] == 0  # bare connections are not counted
        finally:
            for sock in flood:
                sock.close()


async def test_the_bound_in_all_is_shared_fairly_between_sources(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When the pending handshakes in all reach their bound, a new source takes the place
    of the oldest connection of the source with the most: no source crowds out another."""
    monkeypatch.setattr(transport_module, "MAX_PENDING_HANDSHAKES", 4)
    monkeypatch.setattr(transport_module, "IDLE_HANDSHAKE_TIMEOUT_S", 60.0)
    b, inbox = node("b")
    a, _ = node("a")
    held: list[socket.socket] = []
    async with stopping(a, b):
        address = await b.start(HOST, 0)
        try:
            crowd = await idle_sockets(address, 4, "127.0.0.2")
            held += crowd
            await wait_for(lambda: len(b._handshakes) == 4, "the bound in all reached")
            other = await idle_sockets(address, 2, "127.0.0.3")
            held += other
            await wait_for(lambda: b.stats["handshakes_evicted"] == 2, "room made twice")
            # the oldest two of the crowd went; 127.0.0.3 was refused nothing
            await wait_for(lambda: closed_by_peer(crowd[0]) and closed_by_peer(crowd[1]), "gone")
            assert b.stats["handshakes_refused"] == 0
            assert a.send("b", address, [vote("a", "b", 1)])  # the crowd (2) gives way again
            await wait_for(lambda: len(inbox.messages) == 1, "a's message")
            assert b.stats["handshakes_evicted"] == 3
            # Pending now: one of the crowd's, two of 127.0.0.3's. A third source gets the
            # free place; a fourth takes the place of 127.0.0.3's oldest (it has the most);
            # then every source has one, and one more from any of them is refused.
            assert closed_by_peer(crowd[2]) and not closed_by_peer(crowd[3])
            third = await idle_sockets(address, 1, "127.0.0.4")
            fourth = await idle_sockets(address, 1, "127.0.0.5")
            held += third + fourth
            await wait_for(lambda: closed_by_peer(other[0]), "127.0.0.3's oldest gave way")
            assert b.stats["handshakes_evicted"] == 4
            extra = await idle_sockets(address, 1, "127.0.0.3")
            held += extra
            await wait_for(lambda: closed_by_peer(extra[0]), "refused")
            assert b.stats["handshakes_refused"] == 1 and b.stats["handshakes_evicted"] == 4
            assert not any(closed_by_peer(sock) for sock in (crowd[3], other[1], *third, *fourth))
        finally:
            for sock in held:
                sock.close()


async def test_a_connection_that_sends_nothing_is_closed_sooner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transport_module, "IDLE_HANDSHAKE_TIMEOUT_S", 0.2)
    monkeypatch.setattr(transport_module, "HANDSHAKE_TIMEOUT_S", 1.0)
    b, _ = node("b")
    async with stopping(b):
        address = await b.start(HOST, 0)
        silent = await raw_connect(address)
        started = time.monotonic()
        await silent.expect_closed()
        silent_s = time.monotonic() - started
        await silent.close()
        slow = await raw_connect(address)
        started = time.monotonic()
        slow.writer.write(hello("x", "b")[:5])  # some bytes: the whole handshake timeout
        await slow.expect_closed()
        slow_s = time.monotonic() - started
        await slow.close()
        assert silent_s < 0.9 <= slow_s + 0.05, (silent_s, slow_s)
        assert b.stats["auth_failures"] == 1  # the silent one was a bare probe


# ---- hostile bytes --------------------------------------------------------------------------


async def test_garbage_bad_lengths_and_corrupt_frames_disconnect_but_the_server_serves_on() -> None:
    b, inbox = node("b")
    c, _ = node("c")
    async with stopping(b, c):
        address = await b.start(HOST, 0)

        garbage = await raw_connect(address)
        garbage.writer.write(b"GET / HTTP/1.1\r\nHost: b\r\n\r\n" + os.urandom(64))
        await garbage.expect_closed()
        await garbage.close()
        assert b.stats["auth_failures"] == 1

        # Unauthenticated frames are never parsed: frame bytes where the PROOF belongs.
        unauthenticated = await raw_connect(address)
        unauthenticated.writer.write(hello("x", "b"))
        await unauthenticated.read_challenge()
        unauthenticated.writer.write(frame(vote("x", "b", 1)) * 3)
        await unauthenticated.expect_closed()
        await unauthenticated.close()
        assert b.stats["auth_failures"] == 2

        bad_frames = [
            struct.pack("<I", 0xFFFF_FFFF),  # oversize length, refused before any body
            struct.pack("<I", MAX_FRAME_BYTES + 1),
            struct.pack("<I", 0),  # empty frame
            struct.pack("<I", 10) + b"\x01" * 10,  # a body that does not decode
            frame(vote("x", "b", 7)) + struct.pack("<I", 3) + b"\xff\x00\x00",
        ]
        for count, data in enumerate(bad_frames, start=1):
            raw, _, _ = await raw_authenticated(address, "x", "b")
            raw.writer.write(data)
            await raw.expect_closed()
            await raw.close()
            assert b.stats["bad_frames"] == count
        # The good frame before the corrupt one in the same read was delivered; nothing else.
        assert [(m.src, m.term) for m in inbox.messages] == [("x", 7)]

        # Meanwhile (and after) a real peer is served.
        assert c.send("b", address, [vote("c", "b", term) for term in range(1, 11)])
        await wait_for(lambda: len(inbox.messages) == 11, "c's messages delivered")
        assert [m.term for m in inbox.messages[1:]] == list(range(1, 11))
        assert b.stats["accepts"] == len(bad_frames) + 1
        assert b.stats["auth_failures"] == 2


async def test_messages_with_forged_src_or_dst_are_dropped() -> None:
    b, inbox = node("b")
    async with stopping(b):
        address = await b.start(HOST, 0)
        raw, _, _ = await raw_authenticated(address, "x", "b")
        forged = [
            vote("y", "b", 1),  # src is not the authenticated node
            vote("x", "c", 2),  # not for this node
            Message(
                MessageType.HEARTBEATS,
                "",
                "x",
                "b",
                0,
                batch=(
                    Message(MessageType.HEARTBEAT, "g/1", "x", "b", 5),
                    Message(MessageType.HEARTBEAT, "g/2", "y", "b", 5),  # folded forgery
                ),
            ),
        ]
        genuine = [vote("x", "b", 3), heartbeats("x", "b", groups=3, commit=9)]
        raw.writer.write(b"".join(frame(message) for message in [*forged, *genuine]))
        await wait_for(lambda: len(inbox.messages) == 2, "the genuine messages delivered")
        await asyncio.sleep(0.05)
        assert inbox.messages == genuine
        assert b.stats["bad_frames"] == 3
        assert b.stats["frames_received"] == 5
        # The connection stays open: a later genuine message arrives too.
        raw.writer.write(frame(vote("x", "b", 4)))
        await wait_for(lambda: len(inbox.messages) == 3, "the connection still works")
        assert inbox.messages[-1].term == 4
        await raw.close()


async def test_outgoing_connection_closes_if_the_server_sends_frames() -> None:
    a, _ = node("a")

    async def chatty_b(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readexactly(HEAD.size)
            await reader.readexactly(HEAD.unpack(head)[4])  # a's HELLO
            server_nonce = os.urandom(32)
            writer.write(handshake_message(CHALLENGE, server_nonce))
            proof = await reader.readexactly(HEAD.size + 64)  # a's PROOF
            client_nonce = proof[HEAD.size : HEAD.size + 32]
            server_proof = mac(SERVER_LABEL, "a", "b", client_nonce, server_nonce)
            writer.write(handshake_message(CONFIRM, server_proof))
            writer.write(frame(vote("b", "a", 1)))  # not allowed on a's connection
            await reader.read()
        writer.close()

    server = await asyncio.start_server(chatty_b, HOST, 0)
    try:
        fake_address = f"{HOST}:{server.sockets[0].getsockname()[1]}"
        assert a.send("b", fake_address, [vote("a", "b", 1)])
        await wait_for(lambda: a.stats["bad_frames"] >= 1, "a closes the connection")
        assert a.stats["connects"] >= 1 and a.stats["frames_received"] == 0
    finally:
        await a.stop()
        server.close()
        await server.wait_closed()


# ---- reconnection, addresses, bounds --------------------------------------------------------


async def test_reconnects_after_the_listener_restarts_on_the_same_port() -> None:
    a, _ = node("a")
    b, inbox = node("b")
    b2, inbox2 = node("b")
    async with stopping(a, b, b2):
        address = await b.start(HOST, 0)
        assert a.send("b", address, [vote("a", "b", 1)])
        await wait_for(lambda: len(inbox.messages) == 1, "first delivery")
        await b.stop()
        await wait_for(lambda: a.peers() == {"b": False}, "a notices b is gone")
        # Sent while b is down: queued, and a keeps retrying while they are.
        assert a.send("b", address, [vote("a", "b", term) for term in range(2, 6)])
        await wait_for(lambda: a.stats["reconnects"] >= 2, "a retries")
        host, port = parse_address(address)
        assert await b2.start(host, port) == address
        await wait_for(lambda: len(inbox2.messages) == 4, "queued messages delivered")
        assert a.send("b", address, [vote("a", "b", term) for term in range(6, 9)])
        await wait_for(lambda: len(inbox2.messages) == 7, "later messages delivered")
        assert [m.term for m in inbox2.messages] == list(range(2, 9))
        assert [m.term for m in inbox.messages] == [1]
        assert a.stats["connects"] == 2 and a.peers() == {"b": True}


async def test_a_changed_address_takes_effect_for_later_sends() -> None:
    a, _ = node("a")
    old, old_inbox = node("b")
    new, new_inbox = node("b")
    async with stopping(a, old, new):
        old_address = await old.start(HOST, 0)
        new_address = await new.start(HOST, 0)
        assert a.send("b", old_address, [vote("a", "b", term) for term in range(1, 4)])
        await wait_for(lambda: len(old_inbox.messages) == 3, "delivered at the old address")
        assert a.send("b", new_address, [vote("a", "b", term) for term in range(4, 7)])
        await wait_for(lambda: len(new_inbox.messages) == 3, "delivered at the new address")
        assert a.send("b", new_address, [vote("a", "b", 7)])
        await wait_for(lambda: len(new_inbox.messages) == 4, "and later ones too")
        await asyncio.sleep(0.05)
        assert [m.term for m in old_inbox.messages] == [1, 2, 3]
        assert [m.term for m in new_inbox.messages] == [4, 5, 6, 7]
        assert a.peers() == {"b": True}


async def test_queue_to_an_unreachable_peer_stays_bounded_then_drains_when_it_appears() -> None:
    limit = 64 << 10
    a, _ = node("a", max_queue_bytes=limit)
    b, inbox = node("b")
    async with stopping(a, b):
        port = free_port()
        address = f"{HOST}:{port}"
        message = Message(MessageType.APPEND, "g", "a", "b", 1, context=b"p" * 1000)
        frame_bytes = 4 + len(encode(message))
        fits = limit // frame_bytes
        results = []
        for round_ in range(10):
            for _ in range(20):
                results.append(a.send("b", address, [message]))
                assert a.queued_bytes("b") <= limit
            await asyncio.sleep(0.02 * round_)  # let connection attempts fail meanwhile
        assert results == [True] * fits + [False] * (200 - fits)
        assert a.queued_bytes("b") == fits * frame_bytes
        assert a.stats["dropped_queue_full"] == 200 - fits
        # One call with several messages: the ones that do not fit are refused.
        assert not a.send("b", address, [message, message])
        assert a.stats["dropped_queue_full"] == 202 - fits
        assert a.stats["reconnects"] >= 1 and a.stats["connects"] == 0
        assert a.peers() == {"b": False}
        # The peer appears on that address: everything queued is delivered, in order.
        await b.start(HOST, port)
        await wait_for(lambda: len(inbox.messages) == fits, "queued messages delivered")
        assert inbox.messages == [message] * fits
        await wait_for(lambda: a.queued_bytes("b") == 0, "queue empty")
        assert a.send("b", address, [message])


async def test_a_message_larger_than_a_frame_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_module, "MAX_FRAME_BYTES", 2000)
    a, _ = node("a")
    b, inbox = node("b")
    async with stopping(a, b):
        address = await b.start(HOST, 0)
        big = Message(MessageType.APPEND, "g", "a", "b", 1, context=b"p" * 3000)
        assert not a.send("b", address, [vote("a", "b", 1), big, vote("a", "b", 2)])
        assert a.stats["dropped_oversize"] == 1
        await wait_for(lambda: len(inbox.messages) == 2, "the others delivered")
        assert [m.term for m in inbox.messages] == [1, 2]


def test_invalid_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        PeerTransport("", cluster_id=CLUSTER, secret=SECRET, on_messages=Inbox())
    with pytest.raises(ValueError):
        PeerTransport("a", cluster_id=CLUSTER, secret=b"", on_messages=Inbox())
    with pytest.raises(ValueError):
        PeerTransport("n" * 256, cluster_id=CLUSTER, secret=SECRET, on_messages=Inbox())


async def test_a_malformed_address_raises() -> None:
    a, _ = node("a")
    async with stopping(a):
        with pytest.raises(ValueError):
            a.send("b", "no-port", [vote("a", "b", 1)])
        assert a.peers() == {}


# ---- stop -----------------------------------------------------------------------------------


async def test_stop_is_clean() -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    before = asyncio.all_tasks()  # this test's own (and the runner's)
    a, inbox_a = node("a")
    b, inbox_b = node("b")
    address_a = await a.start(HOST, 0)
    address_b = await b.start(HOST, 0)
    blocks = [os.urandom(256 << 10) for _ in range(4)]
    assert a.send("b", address_b, [vote("a", "b", 1)])
    assert b.send("a", address_a, [vote("b", "a", 1)])
    await wait_for(lambda: bool(inbox_a.batches and inbox_b.batches), "both directions up")
    # Leave work in flight: a peer in backoff, a half-done handshake, a queue mid-transfer.
    assert a.send("z", f"{HOST}:{free_port()}", [vote("a", "z", 1)])
    half = await raw_connect(address_b)
    half.writer.write(hello("x", "b"))
    await half.read_challenge()  # b now waits for the proof
    for i in range(8):
        a.send("b", address_b, [append("a", "b", 4 * i, blocks)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await a.stop()
        assert [t for t in asyncio.all_tasks() if t.get_name().startswith("peer-a")] == []
        await b.stop()
        await a.stop()  # idempotent
        await half.expect_closed()
        await half.close()
        assert not a.send("b", address_b, [vote("a", "b", 2)])
        assert a.queued_bytes("b") == 0
        assert a.peers() == {"b": False, "z": False}
        assert asyncio.all_tasks() - before == set()
        del a, b
        gc.collect()
        await asyncio.sleep(0)
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert errors == []


# ---- TLS --------------------------------------------------------------------------------------


def tls_store(
    directory: Path, ca: KeyPair, name: str, names: list[str] | None = None, *, trust: bytes = b""
) -> CertificateStore:
    """A CertificateStore for node `name`: a certificate of `ca` for `names` (default
    127.0.0.1), trusting `trust` (default: `ca`)."""
    pair = issue(ca, name, names or [HOST])
    files = TlsFiles(directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}.ca")
    files.cert.write_bytes(pair.cert_pem)
    files.key.write_bytes(pair.key_pem)
    files.ca.write_bytes(trust or ca.cert_pem)
    return CertificateStore(files)


async def test_mutual_tls_carries_large_appends_and_refuses_another_cas_peer(
    tmp_path: Path,
) -> None:
    ca = make_ca("cluster")
    a, _ = node("a", tls=tls_store(tmp_path, ca, "a"))
    b, inbox = node("b", tls=tls_store(tmp_path, ca, "b"))
    # the right secret, a certificate of another CA (c trusts b's CA: b's check refuses c)
    c, _ = node("c", tls=tls_store(tmp_path, make_ca("other"), "c", trust=ca.cert_pem))
    async with stopping(a, b, c):
        address = await b.start(HOST, 0)
        blocks = [os.urandom(256 << 10) for _ in range(4)]
        sent = [append("a", "b", 4 * i, blocks) for i in range(20)]
        sent += [vote("a", "b", term) for term in range(1, 101)]
        assert a.send("b", address, sent)
        await wait_for(lambda: len(inbox.messages) == len(sent), "all delivered over TLS")
        assert inbox.messages == sent and a.peers() == {"b": True}
        assert c.send("b", address, [vote("c", "b", 1)])
        await wait_for(lambda: c.stats["auth_failures"] >= 1, "c's connection refused")
        await asyncio.sleep(0.2)
        assert len(inbox.messages) == len(sent)  # nothing from c
        assert b.stats["accepts"] == 1
        # a plain-TCP peer (no TLS) gets nowhere either
        plain, _ = node("d")
        async with stopping(plain):
            assert plain.send("b", address, [vote("d", "b", 1)])
            await wait_for(lambda: plain.stats["auth_failures"] >= 1, "a plain peer refused")
        assert len(inbox.messages) == len(sent)


async def test_the_dialling_peer_checks_the_certificate_names_the_address_it_dials(
    tmp_path: Path,
) -> None:
    ca = make_ca("cluster")
    a, _ = node("a", tls=tls_store(tmp_path, ca, "a"))
    b, inbox = node("b", tls=tls_store(tmp_path, ca, "b", ["somewhere.else"]))
    async with stopping(a, b):
        address = await b.start(HOST, 0)
        assert a.send("b", address, [vote("a", "b", 1)])
        await wait_for(lambda: a.stats["auth_failures"] >= 1, "b's name does not match")
        assert inbox.messages == [] and a.peers() == {"b": False}
