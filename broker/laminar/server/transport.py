"""The broker-to-broker transport for Raft messages (docs/formats.md §7).

One persistent outgoing TCP connection per destination node: A's messages to B travel on A's
connection to B, B's replies on B's own connection to A, so each connection carries frames
one way only. Connections are opened lazily on the first send and reopened with capped
exponential backoff (50 ms to 2 s) while messages are queued.

A connection starts with a challenge-response handshake (version 2, docs/formats.md §7):
both sides prove knowledge of the cluster secret with HMAC-SHA256 over fresh nonces from both
sides, bound to the cluster id and both node ids. The server sends nothing derived from the
secret before the client has proven it knows the secret, so an outsider gets nothing to
guess the secret against offline. Pending (unauthenticated) incoming connections are bounded
per source address and in all, and one that sends nothing is closed after a second
(docs/security.md, "Peer traffic").

With TLS (`tls`, a `CertificateStore`: docs/security.md, "TLS"), every connection is mutual
TLS first: the server requires the client's certificate and both verify the other's chain
against the cluster's CA bundle (the client also checks the server's name against the address
it dialled); the HMAC handshake then runs inside the TLS channel as the membership check, and
the frames after it are encrypted and integrity-protected by TLS. Without TLS the frames are
neither (a network that carries them must be trusted). A TLS listener (`Listener`) admits a
connection at TCP accept, before any TLS work: it is a pending handshake from then until the
HMAC handshake is over, and TLS and HMAC handshakes together must be over within
HANDSHAKE_TIMEOUT_S of the accept.

After the handshake, the client sends frames: a u32 little-endian length and one
`laminar.raft.codec` message body. The writer task of a peer takes what is queued (whole
frames, up to WRITE_BATCH_BYTES) and hands it to the socket in one `writelines` call, never
waiting for replies, and waits for asyncio flow control before writing again. The reader
parses frames in place from one receive buffer (a frame larger than the buffer is received
straight into its own buffer) and hands every message decoded from one read to
`on_messages` as one batch, once the handshake authenticated the connection.

Queues are bounded by refusing the newest message: `send` returns False and counts
`dropped_queue_full` once a peer's unsent bytes (queued here plus buffered in the socket
transport) would pass `max_queue_bytes`. Raft retransmits whatever is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import random
import socket
import ssl
import struct
import time
from collections.abc import Callable
from typing import Any, cast

from ..raft.codec import MAX_FRAME_BYTES, FrameError, decode, encode
from ..raft.messages import Message
from ..swim.address import format_address, parse_address, source_key
from ..swim.codec import cluster_hash
from ..tls import CertificateStore
from .listener import AcceptedSocket, Listener

log = logging.getLogger(__name__)

MAGIC = b"LMQP"
#: 2: the server proves itself only after the client has (1 had the server prove first).
VERSION = 2
#: Handshake message kinds.
HELLO = 1  # client: cluster hash, client id, server id
CHALLENGE = 2  # server: server nonce
PROOF = 3  # client: client nonce, client proof
CONFIRM = 4  # server: server proof
NONCE_BYTES = 32
MAC_BYTES = 32  # HMAC-SHA256
MAX_ID_BYTES = 255  # node ids are str8, as in the Raft codec
#: Labels that make a server's proof useless as a client's proof and the other way round.
SERVER_LABEL = b"LMQP/2 server"
CLIENT_LABEL = b"LMQP/2 client"
#: A handshake must be complete this long after the connection was accepted (or opened); with
#: TLS, the TLS handshake and the HMAC handshake in it together.
HANDSHAKE_TIMEOUT_S = 5.0
#: An accepted connection that has sent no byte this long is closed (a client sends its
#: HELLO as soon as it is connected; with TLS: as soon as the TLS handshake is over).
IDLE_HANDSHAKE_TIMEOUT_S = 1.0
#: Largest handshake body accepted (a HELLO with two 255-byte ids is 520 bytes).
MAX_HANDSHAKE_BODY = 1024
#: Unauthenticated incoming connections allowed at once, in all ...
MAX_PENDING_HANDSHAKES = 128
#: ... and from one source (an IPv4 address, or an IPv6 /64). Beyond either bound the new
#: connection is closed at once, unless the bound in all is what is reached and another
#: source has more pending than the new one's: then that source's oldest pending connection
#: is closed instead, so that no source can crowd out another.
MAX_PENDING_PER_SOURCE = 8
#: Connections the listening socket queues before they are accepted.
LISTEN_BACKLOG = 1024
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
#: Per-connection receive buffer; larger frames get a buffer of their own.
RECEIVE_BUFFER_BYTES = 256 << 10
#: A partial frame is moved to the front of the receive buffer when less room is left.
MIN_RECEIVE_ROOM = 16 << 10
#: asyncio write-buffer limits of a connection: the writer waits above high, until low.
WRITE_HIGH_WATER = 512 << 10
WRITE_LOW_WATER = 128 << 10
#: The writer hands the socket at most this much per call (or one frame, if larger), so
#: that a long queue does not become one huge copy into the transport's buffer: with 1 MiB
#: batches and a 512 KiB high-water mark loopback runs 2-3 times faster than when writing
#: the whole queue at once (fresh multi-MiB buffers cost page faults on every write).
WRITE_BATCH_BYTES = 1 << 20
#: Repeated warnings about the same thing are logged at debug level within this window.
WARNING_INTERVAL_S = 10.0
#: Keepalive and TCP_USER_TIMEOUT: notice a peer whose machine vanished (not just its
#: process, which the kernel reports at once) within tens of seconds, not minutes.
KEEPALIVE_IDLE_S = 10
KEEPALIVE_INTERVAL_S = 5
KEEPALIVE_COUNT = 3
USER_TIMEOUT_MS = 30_000

HANDSHAKE_HEAD = struct.Struct("<4sHBBH")  # magic, version, kind, flags, body length
_HELLO_FIXED = struct.Struct("<Q")  # cluster hash
_LENGTH = struct.Struct("<I")
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")

STAT_NAMES = (
    "frames_sent",
    "frames_received",
    "bytes_sent",
    "bytes_received",
    "dropped_queue_full",
    "dropped_oversize",
    "auth_failures",
    "bad_frames",
    "connects",
    "reconnects",
    "accepts",
    "handshakes_refused",  # closed at once: too many pending handshakes (from its source)
    "handshakes_evicted",  # closed to make room for another source's connection
)


class HandshakeError(Exception):
    """A handshake that did not complete: the connection is closed."""


def _str8(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > MAX_ID_BYTES:
        raise ValueError(f"node id longer than {MAX_ID_BYTES} bytes: {value!r}")
    return _U8.pack(len(raw)) + raw


def handshake_message(kind: int, body: bytes) -> bytes:
    return HANDSHAKE_HEAD.pack(MAGIC, VERSION, kind, 0, len(body)) + body


def hello_body(cluster_id: str, client: str, server: str) -> bytes:
    return _HELLO_FIXED.pack(cluster_hash(cluster_id)) + _str8(client) + _str8(server)


def parse_hello(body: bytes) -> tuple[int, str, str]:
    """(cluster hash, client id, server id); HandshakeError if malformed."""
    try:
        (hashed,) = _HELLO_FIXED.unpack_from(body)
        position = _HELLO_FIXED.size
        ids = []
        for _ in range(2):
            length = body[position]
            raw = body[position + 1 : position + 1 + length]
            if not length or len(raw) != length:
                raise HandshakeError("malformed hello")
            ids.append(raw.decode())
            position += 1 + length
    except (struct.error, IndexError, UnicodeDecodeError) as e:
        raise HandshakeError("malformed hello") from e
    if position != len(body):
        raise HandshakeError("malformed hello")
    return int(hashed), ids[0], ids[1]


def proof(
    secret: bytes,
    label: bytes,
    cluster_id: str,
    client: str,
    server: str,
    client_nonce: bytes,
    server_nonce: bytes,
) -> bytes:
    """HMAC-SHA256 over a role label and the whole transcript of one handshake."""
    cluster = cluster_id.encode()
    transcript = b"".join(
        (
            label,
            _U16.pack(len(cluster)),
            cluster,
            _str8(client),
            _str8(server),
            client_nonce,
            server_nonce,
        )
    )
    return hmac.digest(secret, transcript, "sha256")


def _tune_socket(sock: Any) -> None:
    """TCP_NODELAY, and keepalive/user timeout where the platform has them."""
    if sock is None:
        return
    options = [
        (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    ]
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
    ):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        with contextlib.suppress(OSError):
            sock.setsockopt(level, option, value)


class _Connection(asyncio.BufferedProtocol):
    """One TCP connection, either direction: handshake bytes first, then frames.

    Received bytes land in a fixed buffer (`_buf`, read through `_view`) between `_start`
    and `_end`; a frame that cannot fit there is received into a buffer of its own
    (`_large`). Frames are parsed only once the handshake authenticated the peer, and only
    on incoming connections: an outgoing connection that receives a frame byte is closed.
    """

    def __init__(self, owner: PeerTransport, *, incoming: bool, peer: str = "") -> None:
        self._owner = owner
        self.incoming = incoming
        #: Outgoing: the node we dial. Incoming: the node id proven in the handshake.
        self.peer = peer
        self.remote = "?"
        #: What pending handshakes are bounded per (`source_key` of the remote host).
        self.source = "?"
        self.pending_since = 0.0  # loop time it became a pending handshake (incoming)
        #: Incoming: the task running its handshakes (TLS too, until `transport` is set).
        self.handshake: asyncio.Task[None] | None = None
        self.transport: asyncio.Transport | None = None
        self.authenticated = False
        self.lost = False
        self.received_any = False
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._buf = bytearray(RECEIVE_BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._large: bytearray | None = None
        self._large_view: memoryview | None = None
        self._large_filled = 0
        self._eof = False
        self._reading_paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._writing_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None

    # ---- asyncio protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not derive from asyncio.Transport but have its methods.
        self.transport = cast(asyncio.Transport, transport)
        self.set_remote(transport.get_extra_info("peername"))
        _tune_socket(transport.get_extra_info("socket"))
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self._owner._connection_made(self)

    def set_remote(self, peername: Any) -> None:
        """`remote` and `source` from a socket's peer address."""
        if isinstance(peername, tuple) and len(peername) >= 2:
            self.remote = format_address(str(peername[0]), int(peername[1]))
            self.source = source_key(str(peername[0]))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._large_view is not None:
            return self._large_view[self._large_filled :]
        if self._end == len(self._buf):
            self._compact()
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self.received_any = True
        if self.lost or (self.transport is not None and self.transport.is_closing()):
            return
        if self._large is not None:
            self._large_filled += nbytes
            if self._large_filled == len(self._large):
                body = bytes(self._large)
                self._large = None
                self._large_view = None
                messages: list[Message] = []
                if self._accept(body, messages):
                    self._owner._deliver(messages)
            return
        self._end += nbytes
        if not self.authenticated:
            self._wake()
            if self._end == len(self._buf):
                self._compact()
                if self._end == len(self._buf) and self.transport is not None:
                    self._reading_paused = True
                    self.transport.pause_reading()
            return
        self._parse()

    def eof_received(self) -> bool | None:
        self._eof = True
        self._wake()
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._wake()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        if not self.closed.done():
            self.closed.set_result(None)
        self._owner._connection_lost(self)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # ---- writing -------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Open, and not closing: frames written now may still arrive."""
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    @property
    def writable(self) -> bool:
        """Usable, and its transport's buffer below the high-water mark."""
        return self.usable and not self._writing_paused

    def buffered_bytes(self) -> int:
        transport = self.transport
        return 0 if transport is None or self.lost else transport.get_write_buffer_size()

    async def drain(self) -> None:
        """Return once the transport's buffer is below its low-water mark (or it closed)."""
        if not self._writing_paused or self.lost:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._drain_waiter = waiter
        try:
            await waiter
        finally:
            self._drain_waiter = None

    def close(self) -> None:
        """Close after flushing what the transport holds."""
        if self.transport is not None:
            self.transport.close()
        else:
            self._end_tls_handshake()

    def abort(self) -> None:
        """Close now, discarding anything unsent."""
        if self.transport is not None:
            self.transport.abort()
        else:
            self._end_tls_handshake()

    def _end_tls_handshake(self) -> None:
        """Closing before the TLS handshake is over: end the task that runs it (it closes the
        socket), unless this is that task."""
        task = self.handshake
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    # ---- handshake -----------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait_for_bytes(self) -> None:
        """Return once some bytes were received; HandshakeError if it closes first."""
        await self._wait_until_buffered(1)

    async def _wait_until_buffered(self, count: int) -> None:
        while self._end - self._start < count:
            if self.lost or self._eof:
                raise HandshakeError("connection closed during the handshake")
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None

    async def _read_exactly(self, count: int) -> bytes:
        await self._wait_until_buffered(count)
        data = bytes(self._view[self._start : self._start + count])
        self._start += count
        return data

    async def read_handshake(self, kind: int, body_bytes: int | None = None) -> bytes:
        """The body of the next handshake message, which must be of `kind` (and exactly
        `body_bytes` long, when given)."""
        head = await self._read_exactly(HANDSHAKE_HEAD.size)
        magic, version, got_kind, flags, length = HANDSHAKE_HEAD.unpack(head)
        if magic != MAGIC:
            raise HandshakeError("bad magic")
        if version != VERSION:
            raise HandshakeError(
                f"handshake version {version}, this broker speaks {VERSION} "
                "(brokers of different Laminar versions?)"
            )
        if got_kind != kind or flags != 0:
            raise HandshakeError(f"unexpected handshake message {got_kind} (flags {flags})")
        if length > MAX_HANDSHAKE_BODY or (body_bytes is not None and length != body_bytes):
            raise HandshakeError(f"bad handshake body length {length}")
        return await self._read_exactly(length)

    def write_handshake(self, kind: int, body: bytes) -> None:
        if self.transport is None or not self.usable:
            raise HandshakeError("connection closed during the handshake")
        self.transport.write(handshake_message(kind, body))

    def authenticate(self, peer: str) -> None:
        """The handshake succeeded: frames from now on."""
        self.peer = peer
        self.authenticated = True
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        if self._end > self._start:
            self._parse()

    # ---- frames --------------------------------------------------------------------------

    def _compact(self) -> None:
        """Move the unparsed bytes to the front of the receive buffer."""
        remaining = self._end - self._start
        if self._start and remaining:
            self._view[:remaining] = self._view[self._start : self._end]
        self._start, self._end = 0, remaining

    def _bad(self, reason: str) -> None:
        self._owner.stats["bad_frames"] += 1
        self._owner._warn(f"bad:{self.peer}", "peer %s (%s): %s", self.peer, self.remote, reason)
        self.abort()

    def _parse(self) -> None:
        if not self.incoming:
            self._bad("frame bytes on an outgoing connection")
            return
        messages: list[Message] = []
        buf, view = self._buf, self._view
        start, end = self._start, self._end
        needed = _LENGTH.size
        while end - start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(buf, start)
            if length == 0 or length > MAX_FRAME_BYTES:
                self._bad(f"frame length {length} out of bounds")
                start = end
                break
            needed = _LENGTH.size + length
            if end - start < needed:
                if needed > len(buf):  # receive the body straight into its own buffer
                    have = end - start - _LENGTH.size
                    large = bytearray(length)
                    large_view = memoryview(large)
                    large_view[:have] = view[start + _LENGTH.size : end]
                    self._large, self._large_view, self._large_filled = large, large_view, have
                    start = end
                break
            body = bytes(view[start + _LENGTH.size : start + needed])
            start += needed
            if not self._accept(body, messages):
                start = end
                break
        self._start, self._end = start, end
        if start == end:
            self._start = self._end = 0
        elif start + needed > len(buf) or len(buf) - end < MIN_RECEIVE_ROOM:
            self._compact()
        if messages:
            self._owner._deliver(messages)

    def _accept(self, body: bytes, messages: list[Message]) -> bool:
        """Decode one frame body into `messages`; False (connection closed) if malformed."""
        try:
            message = decode(body)
        except FrameError as e:
            self._bad(f"undecodable frame: {e}")
            return False
        stats = self._owner.stats
        stats["frames_received"] += 1
        stats["bytes_received"] += _LENGTH.size + len(body)
        me, peer = self._owner.node_id, self.peer
        if message.src != peer or message.dst != me:
            stats["bad_frames"] += 1
            self._owner._warn(
                f"route:{peer}", "peer %s sent a message %s -> %s", peer, message.src, message.dst
            )
            return True
        for part in message.batch:
            if part.src != peer or part.dst != me:
                stats["bad_frames"] += 1
                self._owner._warn(
                    f"route:{peer}", "peer %s folded a message %s -> %s", peer, part.src, part.dst
                )
                return True
        messages.append(message)
        return True


class _Peer:
    """A destination node: its queue of encoded frames and the task that sends them."""

    __slots__ = (
        "address",
        "connection",
        "frames",
        "kick",
        "node",
        "queued_bytes",
        "queued_frames",
        "task",
        "wakeup",
    )

    def __init__(self, node: str, address: str) -> None:
        self.node = node
        self.address = address
        #: Length prefixes and bodies, alternating, in send order.
        self.frames: list[bytes] = []
        self.queued_frames = 0
        self.queued_bytes = 0
        self.connection: _Connection | None = None  # set while authenticated and usable
        self.wakeup = asyncio.Event()  # frames queued, or the connection changed
        self.kick = asyncio.Event()  # the address changed: retry now
        self.task: asyncio.Task[None] | None = None

    def take(self, limit: int) -> tuple[list[bytes], int, int]:
        """Whole frames from the front of the queue: all of them if they come to at most
        `limit` bytes, else as many as fit in `limit` (at least one). (frames, count, bytes)"""
        frames = self.frames
        if self.queued_bytes <= limit:
            taken = (frames, self.queued_frames, self.queued_bytes)
            self.frames, self.queued_frames, self.queued_bytes = [], 0, 0
            return taken
        size = position = 0
        while position < len(frames):
            frame_bytes = len(frames[position]) + len(frames[position + 1])
            if position and size + frame_bytes > limit:
                break
            size += frame_bytes
            position += 2
        head = frames[:position]
        del frames[:position]
        self.queued_frames -= position // 2
        self.queued_bytes -= size
        return head, position // 2, size

    def unsent_bytes(self) -> int:
        connection = self.connection
        buffered = connection.buffered_bytes() if connection is not None else 0
        return self.queued_bytes + buffered


class PeerTransport:
    """Raft messages to and from the other brokers of one cluster (see the module doc)."""

    def __init__(
        self,
        node_id: str,
        *,
        cluster_id: str,
        secret: bytes,
        on_messages: Callable[[list[Message]], None],
        max_queue_bytes: int = 64 << 20,
        connect_timeout_s: float = 2.0,
        tls: CertificateStore | None = None,
    ) -> None:
        if not node_id or len(node_id.encode()) > MAX_ID_BYTES:
            raise ValueError(f"node id must be 1 to {MAX_ID_BYTES} bytes: {node_id!r}")
        if len(cluster_id.encode()) > 0xFFFF:
            raise ValueError("cluster id too long")
        if not secret:
            raise ValueError("the cluster secret must not be empty")
        if max_queue_bytes <= 0 or connect_timeout_s <= 0:
            raise ValueError("max_queue_bytes and connect_timeout_s must be positive")
        self.node_id = node_id
        self._cluster_id = cluster_id
        self._cluster_hash = cluster_hash(cluster_id)
        self._secret = secret
        self._on_messages = on_messages
        self._max_queue_bytes = max_queue_bytes
        self._connect_timeout_s = connect_timeout_s
        #: mutual TLS on every connection (None: plain TCP)
        self._tls = tls
        self.stats: dict[str, int] = dict.fromkeys(STAT_NAMES, 0)
        #: The address `start` bound ("" before).
        self.address = ""
        self._server: asyncio.AbstractServer | None = None
        self._stopped = False
        self._peers: dict[str, _Peer] = {}
        self._retired: set[asyncio.Task[None]] = set()  # tasks of removed peers
        self._connections: set[_Connection] = set()
        self._handshakes: set[asyncio.Task[None]] = set()
        #: Incoming connections not authenticated yet, by source, oldest first.
        self._pending: dict[str, dict[_Connection, None]] = {}
        self._pending_count = 0
        self._incoming: dict[str, _Connection] = {}  # peer node -> its current connection
        self._warned: dict[str, float] = {}

    # ---- public API ----------------------------------------------------------------------

    async def start(self, host: str, port: int) -> str:
        """Listen on host:port (port 0: an ephemeral one); the bound "host:port"."""
        if self._server is not None or self._stopped:
            raise RuntimeError("PeerTransport.start called twice or after stop")
        if self._tls is None:
            server = await asyncio.get_running_loop().create_server(
                lambda: _Connection(self, incoming=True),
                host,
                port,
                reuse_address=True,
                backlog=LISTEN_BACKLOG,
            )
            sockets: tuple[Any, ...] = tuple(server.sockets)
            self._server = server
        else:  # connections are admitted at TCP accept, before any TLS work
            listener = Listener(self._tls_accepted)
            await listener.start(host, port, backlog=LISTEN_BACKLOG)
            sockets = listener.sockets
            self._server = listener
        bound_port = int(sockets[0].getsockname()[1])
        self.address = format_address(host, bound_port)
        log.info("peer transport %s listening on %s", self.node_id, self.address)
        return self.address

    def send(self, dst_node: str, address: str, messages: list[Message]) -> bool:
        """Queue `messages` for `dst_node` at `address` ("host:port"); never blocks. False if
        any message was not queued: the queue was full (the newest are refused, counted in
        `dropped_queue_full`), a message exceeded MAX_FRAME_BYTES (`dropped_oversize`), or
        the transport is stopped. ValueError for a malformed address."""
        if self._stopped:
            return False
        peer = self._peers.get(dst_node)
        if peer is None:
            parse_address(address)
            _str8(dst_node)
            peer = _Peer(dst_node, address)
            self._peers[dst_node] = peer
        elif peer.address != address:
            parse_address(address)
            self._readdress(peer, address)
        if peer.task is None or peer.task.done():  # new, or (a bug) its task died: restart
            peer.task = asyncio.get_running_loop().create_task(
                self._run_peer(peer), name=f"peer-{self.node_id}->{dst_node}"
            )
            peer.task.add_done_callback(self._task_done)
        limit = self._max_queue_bytes
        used = peer.unsent_bytes()
        stats = self.stats
        accepted = 0
        all_queued = True
        for position, message in enumerate(messages):
            if used >= limit:
                stats["dropped_queue_full"] += len(messages) - position
                all_queued = False
                break
            body = encode(message)
            size = _LENGTH.size + len(body)
            if len(body) > MAX_FRAME_BYTES:
                stats["dropped_oversize"] += 1
                all_queued = False
                self._warn("oversize", "message of %d bytes to %s dropped", len(body), dst_node)
                continue
            if used + size > limit:
                stats["dropped_queue_full"] += len(messages) - position
                all_queued = False
                break
            peer.frames.append(_LENGTH.pack(len(body)))
            peer.frames.append(body)
            used += size
            peer.queued_bytes += size
            accepted += 1
        if accepted:
            peer.queued_frames += accepted
            connection = peer.connection
            if connection is not None and connection.writable:
                # straight to the socket, as the pump would (it has nothing queued before
                # these: it takes and writes in one step), without waking its task
                self._write(peer, connection)
            if peer.frames:
                peer.wakeup.set()
        return all_queued

    def peers(self) -> dict[str, bool]:
        """Every destination node sent to: whether its connection is up now."""
        return {
            node: peer.connection is not None and peer.connection.usable
            for node, peer in self._peers.items()
        }

    def queued_bytes(self, dst_node: str) -> int:
        """Bytes sent to `dst_node` and not yet handed to the kernel (what the bound caps)."""
        peer = self._peers.get(dst_node)
        return 0 if peer is None else peer.unsent_bytes()

    def remove_peer(self, dst_node: str) -> None:
        """Forget a node (e.g. it left the cluster): drop its queue, close its connection,
        stop reconnecting. A later `send` to it starts afresh."""
        peer = self._peers.pop(dst_node, None)
        if peer is None:
            return
        peer.frames = []
        peer.queued_bytes = peer.queued_frames = 0
        if peer.connection is not None:
            peer.connection.abort()
        if peer.task is not None:
            peer.task.cancel()
            self._retired.add(peer.task)
            peer.task.add_done_callback(self._retired.discard)

    async def stop(self) -> None:
        """Close the listener and every connection, cancel and await every task. Queued
        messages are discarded. Safe to call more than once."""
        self._stopped = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = [peer.task for peer in self._peers.values() if peer.task is not None]
        tasks += [*self._retired, *self._handshakes]
        for task in tasks:
            task.cancel()
        connections = list(self._connections)
        for connection in connections:
            connection.abort()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        # Aborted transports report connection_lost on the next loop iterations.
        pending = [connection.closed for connection in connections]
        if pending:
            await asyncio.wait(pending, timeout=1.0)
        if server is not None:
            await server.wait_closed()
        for peer in self._peers.values():
            peer.frames = []
            peer.queued_bytes = peer.queued_frames = 0
        log.info("peer transport %s stopped", self.node_id)

    # ---- outgoing connections ------------------------------------------------------------

    def _readdress(self, peer: _Peer, address: str) -> None:
        log.info("peer %s moved from %s to %s", peer.node, peer.address, address)
        peer.address = address
        peer.kick.set()
        connection = peer.connection
        if connection is not None:
            peer.connection = None
            connection.close()  # flushes what was written to the old address
        peer.wakeup.set()

    async def _run_peer(self, peer: _Peer) -> None:
        loop = asyncio.get_running_loop()
        backoff = BACKOFF_MIN_S
        retrying = False
        while True:
            while not peer.frames:
                peer.wakeup.clear()
                await peer.wakeup.wait()
            if retrying:
                self.stats["reconnects"] += 1
            peer.kick.clear()
            address = peer.address
            connection = await self._connect(peer.node, address)
            if connection is not None and peer.address != address:
                connection.close()
                continue
            if connection is None:
                retrying = True
                await self._backoff(peer, backoff)
                backoff = BACKOFF_MIN_S if peer.kick.is_set() else min(backoff * 2, BACKOFF_MAX_S)
                continue
            self.stats["connects"] += 1
            connected_at = loop.time()
            peer.connection = connection
            try:
                await self._pump(peer, connection)
            finally:
                if peer.connection is connection:
                    peer.connection = None
                connection.close()
            retrying = True
            if loop.time() - connected_at >= BACKOFF_MAX_S:
                backoff = BACKOFF_MIN_S
            await self._backoff(peer, backoff)
            backoff = BACKOFF_MIN_S if peer.kick.is_set() else min(backoff * 2, BACKOFF_MAX_S)

    async def _backoff(self, peer: _Peer, delay_s: float) -> None:
        """Sleep about `delay_s` (jittered down by up to half); an address change ends it."""
        if peer.kick.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(peer.kick.wait(), delay_s * (0.5 + random.random() / 2))

    async def _connect(self, node: str, address: str) -> _Connection | None:
        """An authenticated connection to `node` at `address`, or None (counted, logged)."""
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if self._tls is not None:  # the current certificate and CA bundle, for each connection
            tls = {"ssl": self._tls.client(), "server_hostname": host}
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self, incoming=False, peer=node), host, port, **tls
                )
        except ssl.SSLError as e:  # the peer's certificate is not valid for it, or ours for it
            self.stats["auth_failures"] += 1
            self._warn(f"tls:{node}", "TLS with %s at %s failed: %s", node, address, e)
            return None
        except (OSError, TimeoutError) as e:
            self._warn(f"connect:{node}", "cannot connect to %s at %s: %r", node, address, e)
            return None
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                await self._client_handshake(connection, node)
        except (HandshakeError, TimeoutError) as e:
            self.stats["auth_failures"] += 1
            reason = "timed out" if isinstance(e, TimeoutError) else str(e)
            self._warn(f"auth:{node}", "handshake with %s at %s failed: %s", node, address, reason)
            connection.abort()
            return None
        except BaseException:  # cancelled (stop, remove_peer): do not leave it open
            connection.abort()
            raise
        log.debug("%s connected to %s at %s", self.node_id, node, address)
        return connection

    async def _client_handshake(self, connection: _Connection, server: str) -> None:
        connection.write_handshake(HELLO, hello_body(self._cluster_id, self.node_id, server))
        server_nonce = await connection.read_handshake(CHALLENGE, NONCE_BYTES)
        client_nonce = os.urandom(NONCE_BYTES)
        args = (self._cluster_id, self.node_id, server, client_nonce, server_nonce)
        client_proof = proof(self._secret, CLIENT_LABEL, *args)
        connection.write_handshake(PROOF, client_nonce + client_proof)
        server_proof = await connection.read_handshake(CONFIRM, MAC_BYTES)
        if not hmac.compare_digest(proof(self._secret, SERVER_LABEL, *args), server_proof):
            raise HandshakeError("the server's proof does not match (wrong secret or cluster?)")
        connection.authenticate(server)  # frames only to a server that proved itself

    async def _pump(self, peer: _Peer, connection: _Connection) -> None:
        """Write whatever is queued, in one call, until the connection goes away."""
        while connection.usable and peer.connection is connection:
            if not peer.frames:
                peer.wakeup.clear()
                await peer.wakeup.wait()
                continue
            self._write(peer, connection)
            await connection.drain()

    def _write(self, peer: _Peer, connection: _Connection) -> None:
        """Hand the frames at the front of `peer`'s queue, up to WRITE_BATCH_BYTES, to
        `connection`'s transport in one call."""
        transport = connection.transport
        assert transport is not None
        frames, count, size = peer.take(WRITE_BATCH_BYTES)
        if self._tls is None:
            transport.writelines(frames)
        else:  # one buffer: TLS records of up to 16 KiB, not one per length prefix
            transport.write(b"".join(frames))
        stats = self.stats
        stats["frames_sent"] += count
        stats["bytes_sent"] += size

    # ---- incoming connections ------------------------------------------------------------

    def _connection_made(self, connection: _Connection) -> None:
        if self._stopped:
            connection.abort()
            return
        self._connections.add(connection)
        if not connection.incoming or connection.handshake is not None:
            return  # outgoing; or over TLS, admitted at TCP accept and in its handshake task
        if not self._admit(connection):
            self.stats["handshakes_refused"] += 1
            connection.abort()
            return
        self._start_handshake(connection, None)

    def _tls_accepted(self, sock: socket.socket, address: Any) -> None:
        """The TLS listener accepted `sock`: admitted as a pending handshake (its TLS one
        included) or closed at once, before any TLS work."""
        if self._stopped:
            sock.close()
            return
        connection = _Connection(self, incoming=True)
        connection.set_remote(address)
        if not self._admit(connection):
            self.stats["handshakes_refused"] += 1
            sock.close()
            return
        self._start_handshake(connection, AcceptedSocket(sock))

    def _start_handshake(self, connection: _Connection, accepted: AcceptedSocket | None) -> None:
        """The task that authenticates an admitted incoming connection (`accepted`: TLS to
        run on that socket first)."""
        task = asyncio.get_running_loop().create_task(
            self._accept_connection(connection, accepted),
            name=f"peer-{self.node_id}<-{connection.remote}",
        )
        connection.handshake = task
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)
        task.add_done_callback(self._task_done)
        if accepted is not None:
            task.add_done_callback(lambda _: self._tls_handshake_done(connection, accepted))

    def _tls_handshake_done(self, connection: _Connection, accepted: AcceptedSocket) -> None:
        """Its task cancelled before it ran (evicted, stop): close the socket, unpend it."""
        if accepted.close():
            self._unpend(connection)

    def _admit(self, connection: _Connection) -> bool:
        """Count `connection` as a pending handshake if the bounds allow (making room by
        closing another source's oldest if need be); False if it must be closed."""
        source = connection.source
        mine = self._pending.get(source, {})
        if len(mine) >= MAX_PENDING_PER_SOURCE:
            self._warn(
                f"handshakes:{source}",
                "%d handshakes pending from %s; closing %s",
                len(mine),
                source,
                connection.remote,
            )
            return False
        if self._pending_count >= MAX_PENDING_HANDSHAKES:
            # The source with the most pending (the oldest such connection among ties) gives
            # way, if it has more than the newcomer's source.
            crowded = max(
                self._pending.values(),
                key=lambda pending: (len(pending), -next(iter(pending)).pending_since),
            )
            if len(crowded) <= len(mine):
                self._warn("handshakes", "too many handshakes pending; closing %s", source)
                return False
            victim = next(iter(crowded))  # that source's oldest
            self._unpend(victim)
            self.stats["handshakes_evicted"] += 1
            self._warn(
                "handshakes",
                "too many handshakes pending; closing %s for %s",
                victim.remote,
                connection.remote,
            )
            victim.abort()
        connection.pending_since = asyncio.get_running_loop().time()
        self._pending.setdefault(source, {})[connection] = None
        self._pending_count += 1
        return True

    def _unpend(self, connection: _Connection) -> None:
        pending = self._pending.get(connection.source)
        if pending is None or connection not in pending:
            return
        del pending[connection]
        self._pending_count -= 1
        if not pending:
            del self._pending[connection.source]

    async def _accept_connection(
        self, connection: _Connection, accepted: AcceptedSocket | None
    ) -> None:
        try:
            await self._accept_handshake(connection, accepted)
        finally:
            self._unpend(connection)

    async def _accept_handshake(
        self, connection: _Connection, accepted: AcceptedSocket | None
    ) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(
                IDLE_HANDSHAKE_TIMEOUT_S if accepted is None else HANDSHAKE_TIMEOUT_S
            ) as deadline:
                if accepted is not None:
                    assert self._tls is not None
                    # the peer_listener context: its SNI callback switches to the current one
                    await accepted.start_tls(
                        connection, self._tls.peer_listener, HANDSHAKE_TIMEOUT_S
                    )
                    deadline.reschedule(
                        min(loop.time() + IDLE_HANDSHAKE_TIMEOUT_S, started + HANDSHAKE_TIMEOUT_S)
                    )
                await connection.wait_for_bytes()
                deadline.reschedule(started + HANDSHAKE_TIMEOUT_S)
                client = await self._server_handshake(connection)
        except ssl.SSLError as e:  # no certificate of the cluster's CA, not TLS at all, ...
            self.stats["auth_failures"] += 1
            self._warn(
                f"accept-tls:{connection.source}",
                "TLS handshake from %s failed: %s",
                connection.remote,
                e,
            )
            return  # the connection is closed (it never reached the protocol)
        except (HandshakeError, TimeoutError) as e:
            if connection.received_any:  # not a bare TCP probe
                self.stats["auth_failures"] += 1
                reason = "timed out" if isinstance(e, TimeoutError) else str(e)
                self._warn(
                    f"accept:{connection.remote}",
                    "handshake from %s failed: %s",
                    connection.remote,
                    reason,
                )
            connection.abort()
            return
        except OSError:  # gone during its TLS handshake (or asyncio's bound on it hit first)
            connection.abort()
            return
        previous = self._incoming.get(client)
        if previous is not None and previous is not connection:
            previous.abort()  # the peer reconnected: its old connection is dead to it
        self._incoming[client] = connection
        self.stats["accepts"] += 1
        log.debug("%s accepted %s from %s", self.node_id, client, connection.remote)
        connection.authenticate(client)

    async def _server_handshake(self, connection: _Connection) -> str:
        hashed, client, server = parse_hello(await connection.read_handshake(HELLO))
        if hashed != self._cluster_hash:
            raise HandshakeError(f"{client} belongs to another cluster")
        if server != self.node_id:
            raise HandshakeError(f"{client} wants node {server!r}, this is {self.node_id!r}")
        if client == self.node_id:
            raise HandshakeError(f"a client claims to be this node ({client!r})")
        server_nonce = os.urandom(NONCE_BYTES)
        connection.write_handshake(CHALLENGE, server_nonce)  # nothing derived from the secret
        body = await connection.read_handshake(PROOF, NONCE_BYTES + MAC_BYTES)
        client_nonce, client_proof = body[:NONCE_BYTES], body[NONCE_BYTES:]
        args = (self._cluster_id, client, server, client_nonce, server_nonce)
        if not hmac.compare_digest(proof(self._secret, CLIENT_LABEL, *args), client_proof):
            raise HandshakeError(f"{client}'s proof does not match (wrong secret?)")
        connection.write_handshake(CONFIRM, proof(self._secret, SERVER_LABEL, *args))
        return client

    # ---- plumbing ------------------------------------------------------------------------

    def _deliver(self, messages: list[Message]) -> None:
        try:
            self._on_messages(messages)
        except Exception:
            log.exception("on_messages failed on %d messages", len(messages))

    def _connection_lost(self, connection: _Connection) -> None:
        self._connections.discard(connection)
        if connection.incoming:
            if self._incoming.get(connection.peer) is connection:
                del self._incoming[connection.peer]
            return
        peer = self._peers.get(connection.peer)
        if peer is not None and peer.connection is connection:
            peer.wakeup.set()  # the pump notices and the peer task reconnects

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("peer transport task %s failed", task.get_name(), exc_info=task.exception())

    def _warn(self, key: str, message: str, *args: object) -> None:
        """Log a warning, or a debug message if the same key warned recently."""
        now = time.monotonic()
        if now - self._warned.get(key, -WARNING_INTERVAL_S) < WARNING_INTERVAL_S:
            log.debug(message, *args)
            return
        if len(self._warned) > 1024:
            self._warned.clear()
        self._warned[key] = now
        log.warning(message, *args)
