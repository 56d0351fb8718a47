"""The client's HTTP/1.1 transport: keep-alive connections of its own for every request and
answer of the API (`AsyncClient._call`). aiohttp's client took about 150 µs of the client's
CPU a request, and it bounded `laminar bench produce` at 14 records an append (bench/RESULTS.md,
issue 22, thirteenth sitting). WebSockets (streaming appends) stay aiohttp's.

What it does, and nothing more:

* One request at a time on a connection. An answer is framed as RFC 9112 §6.3 says: none for
  HEAD, 1xx, 204 and 304; chunked transfer coding; Content-Length; else up to the connection's
  end. Interim 1xx answers are skipped. A head over `MAX_HEAD_BYTES` or `MAX_HEADERS`, or one
  that is not HTTP/1.x, fails the request as a broken connection.
* A connection is kept for the next request to its origin when the answer allows it (HTTP/1.1,
  no `Connection: close`, framed by its length or chunks, nothing after it) and is dropped
  once idle for `IDLE_S`, before a broker's idle timeout (60 s, docs/api.md) closes it under a
  request. At most `limit` connections are open in all: past that a request takes an idle
  connection of another origin (closed for it) or waits in turn, first come first served. A
  connection freed goes to the first waiter: as it is if of the waiter's origin, else closed to
  make room for it. A later waiter of the connection's own origin may take it instead (no
  reconnect), passing the first over at most `MAX_SKIPS` times. A waiter used to lose the
  freed connection to the next request of the call that freed it, made in the same turn of the
  loop: a steady load left the waiters waiting until it ended (bench/RESULTS.md, issue 22,
  thirty-first sitting).
* A broker refuses a connection over its cap on one client address's connections with a 429
  that carries `Laminar-Connection-Limit`, before reading anything; over TLS it closes the
  connection before its handshake (a reset, to the pool that holds other connections to it).
  The pool then holds at most as many connections to that origin as it has open (`cap_of`),
  and sends the request again on one of them (at most `MAX_REFUSED_SENDS` times; with none of
  its own open, the 429 is the answer, or NotConnected). Requests for it wait for its
  connections; the room of others goes to other origins. While they wait, one more connection
  is tried every `CAP_PROBE_S`.
* A request line or header that could end early or carry another (a control character, a
  space in the target, a name that is not a token) raises ValueError before anything is sent.
* TLS through asyncio with the caller's context, the server's name checked.
* A request's deadline (loop time) bounds the wait for a free connection, connecting, and
  the answer. A request cancelled or timed out closes its connection.

`NotConnected`: nothing was sent (connection refused, TLS handshake failed, deadline passed
before a connection). `Broken`: the request may have been sent (the connection broke, no answer
by the deadline, an answer that is not HTTP).
"""

from __future__ import annotations

import asyncio
import functools
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast

from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from ..contract import CONNECTION_LIMIT_HEADER

#: an answer's status line and headers may be this long (aiohttp's client allows 8190 bytes a
#: line and 128 headers)
MAX_HEAD_BYTES = 64 << 10
MAX_HEADERS = 128
#: an idle connection is closed rather than used after this long
IDLE_S = 15.0
#: origins whose parsed form is kept (brokers, and where they redirect to)
MAX_ORIGINS = 1024
#: the first request waiting for a connection lets at most this many freed connections go to
#: later waiters of their own origin before it is served (`Pool._hand_over`)
MAX_SKIPS = 8
#: a body up to this size goes out in one write with its head (one segment on loopback)
JOIN_BODY_BYTES = 256 << 10
#: once a broker refused a connection over its cap on this client address's connections, the
#: pool holds at most as many to it as it had open then; one more is tried this often while
#: requests wait for one (the cap is shared with other processes on the address, which may
#: close theirs)
CAP_PROBE_S = 1.0
#: a request whose new connection was refused so is sent again at most this many times (the
#: broker read none of it); then the 429 is its answer
MAX_REFUSED_SENDS = 3

#: what a request line's target or a header may not contain (a header or request injected)
_UNSAFE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_UNSAFE_TARGET = re.compile(r"[\x00-\x20\x7f]")
_TOKEN_PATTERN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_TOKEN = re.compile(_TOKEN_PATTERN)
#: an answer's header lines (CRLF between them): a token, a colon, any bytes but CR and LF
_HEADER_LINES = re.compile(f"{_TOKEN_PATTERN}:[^\r\n]*(?:\r\n{_TOKEN_PATTERN}:[^\r\n]*)*".encode())

_LENGTH, _CHUNKED, _UNTIL_CLOSE = 0, 1, 2

Answer = tuple[int, CIMultiDictProxy[str], bytes]
TlsContext = ssl.SSLContext | Callable[[], ssl.SSLContext] | None


class NotConnected(Exception):
    """No connection was made: the request was certainly not sent."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause) or type(cause).__name__)
        self.cause = cause
        #: the origin that could not be reached, when the caller says (a redirect's target)
        self.origin: str | None = None


class Refused(NotConnected):
    """A TLS connection closed in its handshake by an origin the pool holds other connections
    to: as a broker closes one over its cap on a client address's connections (the pool
    learned the cap). Nothing was sent."""


#: how a TLS handshake ends that the server closed before it began
_CLOSED_IN_HANDSHAKE = (
    ConnectionResetError,
    BrokenPipeError,
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
)


class Broken(Exception):
    """The connection failed after the request may have been sent."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause) or type(cause).__name__)
        self.cause = cause


class ProtocolError(Exception):
    """An answer that is not valid HTTP/1.1."""


@dataclass(frozen=True, slots=True)
class Origin:
    tls: bool
    host: str
    port: int
    #: the Host header: the URL's host and port as written
    authority: str


def split_url(url: str) -> tuple[str, str]:
    """(`scheme://authority`, the request target: path and query, "/" at least)."""
    start = url.find("://")
    if start < 0:
        raise ValueError(f"not an absolute URL: {url!r}")
    slash = url.find("/", start + 3)
    if slash < 0:
        return url, "/"
    return url[:slash], url[slash:]


def parse_origin(origin: str) -> Origin:
    parsed = URL(origin)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"not an http:// or https:// URL: {origin!r}")
    port = parsed.port
    assert port is not None  # (http and https have default ports)
    authority = parsed.raw_authority.rpartition("@")[2]
    return Origin(parsed.scheme == "https", parsed.host, port, authority)


def request_head(
    method: str, target: str, authority: str, headers: Mapping[str, str], body_bytes: int | None
) -> bytes:
    """A request's line and headers; Content-Length when there is a body (or for a POST or
    PUT without one). ValueError for a line break or control character in any of them."""
    if _UNSAFE_TARGET.search(target) or not _TOKEN.fullmatch(method) or not target.isascii():
        raise ValueError(f"not a valid request: {method} {target!r}")
    if body_bytes is not None or method in ("POST", "PUT", "PATCH"):
        length = b"Content-Length: %d\r\n\r\n" % (body_bytes or 0)
    else:
        length = b"\r\n"
    lines = _header_lines(authority, tuple(headers.items()))
    return b"".join((method.encode(), b" ", target.encode(), b" HTTP/1.1\r\n", lines, length))


@functools.lru_cache(maxsize=256)
def _header_lines(authority: str, headers: tuple[tuple[str, str], ...]) -> bytes:
    """Host and `headers`, each line ending in CRLF (checked and encoded once for the same
    headers: a client's differ only when its token or metadata index does)."""
    lines = [f"Host: {authority}\r\n"]
    for name, value in headers:
        if not _TOKEN.fullmatch(name) or _UNSAFE.search(value):
            raise ValueError(f"not a valid header: {name!r}")
        lines.append(f"{name}: {value}\r\n")
    try:
        return "".join(lines).encode("latin-1")
    except UnicodeEncodeError as e:
        raise ValueError(f"a header holds a character HTTP/1.1 cannot carry: {e}") from None


def parse_head(head: bytes) -> tuple[int, bool, CIMultiDict[str]]:
    """An answer's status, whether it is HTTP/1.1, and its headers (the head without its last
    CRLF CRLF). ProtocolError for anything else."""
    lines = head.split(b"\r\n")
    line = lines[0]
    if (
        len(line) < 12
        or line[:7] != b"HTTP/1."
        or line[7:8] not in (b"0", b"1")
        or line[8:9] != b" "
        or not line[9:12].isdigit()
        or line[12:13] not in (b"", b" ")
    ):
        raise ProtocolError(f"not an HTTP/1.x status line: {line[:40]!r}")
    if len(lines) > MAX_HEADERS + 1:
        raise ProtocolError(f"an answer with over {MAX_HEADERS} headers")
    if len(lines) > 1 and not _HEADER_LINES.fullmatch(head, len(line) + 2):
        raise ProtocolError(f"not header lines: {head[len(line) + 2 :][:60]!r}")
    headers: CIMultiDict[str] = CIMultiDict()
    for raw in lines[1:]:
        name, _, value = raw.partition(b":")
        headers.add(name.decode("ascii"), value.strip(b" \t").decode("latin-1"))
    return int(line[9:12]), line[7:8] == b"1", headers


class _Connection(asyncio.Protocol):
    """One connection: a request's answer parsed as its bytes arrive."""

    def __init__(self, pool: Pool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.open = True
        self.idle_since = 0.0
        self._buffer = bytearray()
        self._answer: asyncio.Future[Answer] | None = None
        self._no_body = False
        self._status = 0
        self._headers: CIMultiDict[str] | None = None
        self._framing = _LENGTH
        self._length = 0
        self._chunks: list[bytes] = []
        self.keep = False
        #: no request has been sent on it yet (a broker refuses a connection on its first)
        self.fresh = True

    # ---- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's are not subclasses)

    def data_received(self, data: bytes) -> None:
        answer = self._answer
        if answer is None or answer.done():  # bytes nobody asked for: not HTTP/1.1 keep-alive
            self.close()
            return
        self._buffer += data
        try:
            result = self._parse()
        except (ProtocolError, UnicodeDecodeError, ValueError) as e:
            answer.set_exception(ProtocolError(str(e)))
            self.close()
            return
        if result is not None:
            answer.set_result(result)

    def eof_received(self) -> bool:
        return False  # (closes: connection_lost follows)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.open = False
        self.pool._gone(self)
        answer = self._answer
        if answer is None or answer.done():
            return
        if self._headers is not None and self._framing == _UNTIL_CLOSE and exc is None:
            self.keep = False
            answer.set_result(self._result(bytes(self._buffer)))
            return
        answer.set_exception(exc or ConnectionResetError("the server closed the connection"))

    # ---- one exchange

    async def exchange(
        self, head: bytes, body: bytes | None, deadline: float, no_body: bool
    ) -> Answer:
        transport = self.transport
        if transport is None or not self.open or transport.is_closing():
            raise ConnectionResetError("the connection closed")
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Answer] = loop.create_future()
        self._answer = answer
        self._no_body = no_body
        self._headers = None
        self.keep = False
        self.fresh = False
        if body is None:
            transport.write(head)
        elif len(body) <= JOIN_BODY_BYTES:
            transport.write(head + body)
        else:
            transport.write(head)
            transport.write(body)
        timer = loop.call_at(deadline, self._timed_out)
        try:
            return await answer
        finally:
            timer.cancel()
            self._answer = None

    def usable(self, now: float | None = None) -> bool:
        """Open, nothing of the last request left to write, and (given `now`) not idle for
        `IDLE_S`: a request sent on it reaches a server that reads it."""
        transport = self.transport
        return (
            self.open
            and transport is not None
            and not transport.is_closing()
            and not transport.get_write_buffer_size()
            and (now is None or now - self.idle_since < IDLE_S)
        )

    def _timed_out(self) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(TimeoutError("no answer before the call's deadline"))

    def _parse(self) -> Answer | None:
        buffer = self._buffer
        while self._headers is None:
            end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
            if end < 0:
                if len(buffer) >= MAX_HEAD_BYTES + 4:
                    raise ProtocolError(f"an answer's head over {MAX_HEAD_BYTES} bytes")
                return None
            status, http11, headers = parse_head(bytes(buffer[:end]))
            del buffer[: end + 4]
            if status < 200:
                if status == 101:
                    raise ProtocolError("an upgrade nobody asked for")
                continue  # an interim answer
            self._status, self._headers = status, headers
            self._frame(status, http11, headers)
        if self._framing == _LENGTH:
            if len(buffer) < self._length:
                return None
            if len(buffer) > self._length:  # more than the answer: nothing to reuse
                self.keep = False
            body = bytes(buffer[: self._length])
            del buffer[:]
            return self._result(body)
        if self._framing == _CHUNKED:
            return self._dechunk()
        return None  # up to the connection's end (connection_lost)

    def _frame(self, status: int, http11: bool, headers: CIMultiDict[str]) -> None:
        tokens = ",".join(headers.getall("Connection", ())).lower().split(",")
        self.keep = http11 and "close" not in {t.strip() for t in tokens}
        codings = ",".join(headers.getall("Transfer-Encoding", ())).strip()
        if self._no_body or status in (204, 304):
            self._framing, self._length = _LENGTH, 0
        elif codings:
            if codings.rpartition(",")[2].strip().lower() == "chunked":
                self._framing, self._length = _CHUNKED, 0
                self._chunks = []
            else:
                self._framing, self.keep = _UNTIL_CLOSE, False
        elif "Content-Length" in headers:
            lengths = {v.strip() for v in headers.getall("Content-Length")}
            value = lengths.pop()
            if lengths or not value.isdigit() or len(value) > 18:
                raise ProtocolError(f"not a valid Content-Length: {value!r}")
            self._framing, self._length = _LENGTH, int(value)
        else:
            self._framing, self.keep = _UNTIL_CLOSE, False

    def _dechunk(self) -> Answer | None:
        buffer = self._buffer
        while True:
            if self._length > 0:  # inside a chunk: its data and CRLF
                if len(buffer) < self._length + 2:
                    return None
                if buffer[self._length : self._length + 2] != b"\r\n":
                    raise ProtocolError("a chunk not ended by CRLF")
                self._chunks.append(bytes(buffer[: self._length]))
                del buffer[: self._length + 2]
                self._length = 0
            line_end = buffer.find(b"\r\n")
            if line_end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    raise ProtocolError("a chunk size line too long")
                return None
            if self._length < 0:  # the trailers after the last chunk, up to an empty line
                if line_end == 0:
                    del buffer[:2]
                    if buffer:
                        self.keep = False
                    return self._result(b"".join(self._chunks))
                del buffer[: line_end + 2]
                continue
            size = buffer[:line_end].partition(b";")[0].strip()
            if not size or len(size) > 16 or size.strip(b"0123456789abcdefABCDEF"):
                raise ProtocolError(f"not a chunk size: {bytes(size[:20])!r}")
            del buffer[: line_end + 2]
            self._length = int(size, 16) or -1

    def _result(self, body: bytes) -> Answer:
        assert self._headers is not None
        self._length = 0
        return self._status, CIMultiDictProxy(self._headers), body

    def close(self) -> None:
        self.open = False
        if self.transport is not None:
            self.transport.close()
        self.pool._gone(self)


@dataclass(slots=True)
class _Cap:
    """How many connections to an origin the pool may hold, learned from its refusal."""

    limit: int
    #: the loop time from which one connection more may be tried
    probe_at: float


class _Waiter:
    """A request waiting for a connection: it gets one of its origin, or None (room to open
    one); `skips` counts the connections that went to later waiters of their own origin."""

    __slots__ = ("future", "origin", "skips")

    def __init__(self, origin: Origin, future: asyncio.Future[_Connection | None]) -> None:
        self.origin = origin
        self.future = future
        self.skips = 0


class Pool:
    """Keep-alive connections by origin, at most `limit` open in all."""

    def __init__(self, limit: int, connect_timeout_s: float) -> None:
        if limit < 1:
            raise ValueError(f"limit={limit} must be at least 1")
        self._limit = limit
        self._connect_timeout_s = connect_timeout_s
        self._origins: dict[str, Origin] = {}
        self._idle: dict[Origin, list[_Connection]] = {}
        #: requests waiting for a connection, first come first served, with their origins
        self._waiters: list[_Waiter] = []
        #: every connection made and not yet gone (`limit` bounds it, with `_reserved`)
        self._connections: set[_Connection] = set()
        #: room handed to waiters that have not opened their connection yet
        self._reserved = 0
        #: by origin: its connections made and not gone, and the room handed for one
        self._held: dict[Origin, int] = {}
        #: the origins that refused a connection over their cap (`_learn_cap`)
        self._caps: dict[Origin, _Cap] = {}
        self._probe_timer: asyncio.TimerHandle | None = None
        self.closed = False

    def cap_of(self, origin: str) -> int | None:
        """How many connections to `origin` (`scheme://host:port`) the pool may hold, once it
        refused one over its cap (None: no cap known)."""
        parsed = self._origins.get(origin)
        cap = None if parsed is None else self._caps.get(parsed)
        return None if cap is None else cap.limit

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        deadline: float,
        tls: TlsContext = None,
    ) -> Answer:
        """One request and its answer (status, headers, body). NotConnected, Broken;
        ValueError for a request HTTP/1.1 cannot carry."""
        origin_text, target = split_url(url)
        origin = self._origins.get(origin_text)
        if origin is None:
            if len(self._origins) >= MAX_ORIGINS:
                self._origins.clear()
            origin = self._origins[origin_text] = parse_origin(origin_text)
        head = request_head(
            method, target, origin.authority, headers, None if body is None else len(body)
        )
        sends = 0
        while True:
            try:
                connection = await self._connection(origin, deadline, tls)
            except Refused:
                sends += 1
                if sends > MAX_REFUSED_SENDS:
                    raise
                continue
            fresh = connection.fresh
            try:
                answer = await connection.exchange(head, body, deadline, method == "HEAD")
            except (OSError, TimeoutError, ProtocolError) as e:
                connection.close()
                raise Broken(e) from e
            except BaseException:  # cancelled: what the server sends next is nobody's
                connection.close()
                raise
            # a new connection refused over the cap, the request unread (docs/api.md)
            refused = fresh and answer[0] == 429 and CONNECTION_LIMIT_HEADER in answer[1]
            if refused:  # (learned before the connection goes: its room is not this origin's)
                self._learn_cap(origin)
            if connection.keep and connection.usable() and not self.closed:
                connection.idle_since = asyncio.get_running_loop().time()
                self._release(connection)
            else:
                connection.close()
            sends += 1
            if not refused or sends > MAX_REFUSED_SENDS or not self._caps[origin].limit:
                return answer

    async def _connection(self, origin: Origin, deadline: float, tls: TlsContext) -> _Connection:
        if self.closed:
            raise RuntimeError("the client is closed")
        loop = asyncio.get_running_loop()
        while not self._queued(origin, loop.time()):  # nobody it would overtake came first
            idle = self._idle.get(origin)
            while idle:
                connection = idle.pop()
                if connection.usable(loop.time()):
                    return connection
                connection.close()
            if not self._room_for(origin, loop.time()):
                break  # at its cap: it waits for a connection of its origin
            if len(self._connections) + self._reserved < self._limit:
                self._claim(origin, loop.time())
                return await self._open(origin, deadline, tls)
            if not self._close_an_idle():
                break
        got = await self._wait_for_room(origin, deadline)
        if self.closed:
            if got is not None:
                got.close()
            raise RuntimeError("the client is closed")
        if got is None:  # room: this request's connection opens in it (claimed for it)
            self._reserved -= 1
        elif got.usable(loop.time()):
            return got
        else:
            self._drop(got)  # (its room, and its origin's count, is this request's)
        return await self._open(origin, deadline, tls)

    async def _open(self, origin: Origin, deadline: float, tls: TlsContext) -> _Connection:
        """A new connection to `origin`, counted at once (the caller made room for it, and
        claimed it: `_claim`)."""
        loop = asyncio.get_running_loop()
        connection = _Connection(self, origin)
        self._connections.add(connection)
        try:
            context = None
            if origin.tls:
                context = tls() if callable(tls) else tls
                if context is None:
                    context = _default_context()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError("no connection before the call's deadline")
            async with asyncio.timeout(min(remaining, self._connect_timeout_s)):
                await loop.create_connection(
                    lambda: connection,
                    origin.host,
                    origin.port,
                    ssl=context,
                    server_hostname=origin.host if context is not None else None,
                )
        except TimeoutError as e:
            connection.close()
            raise NotConnected(TimeoutError("no connection before the deadline")) from e
        except OSError as e:  # (ssl.SSLError is one)
            refused = (
                origin.tls
                and isinstance(e, _CLOSED_IN_HANDSHAKE)
                and self._held.get(origin, 0) > 1  # (this one and others: it is up)
            )
            if refused:  # (learned before the connection goes: its room is not this origin's)
                self._learn_cap(origin)
            connection.close()
            raise (Refused if refused else NotConnected)(e) from e
        except BaseException:
            connection.close()
            raise
        return connection

    def _close_an_idle(self) -> bool:
        for connections in self._idle.values():
            if connections:
                connections.pop(0).close()
                return True
        return False

    async def _wait_for_room(self, origin: Origin, deadline: float) -> _Connection | None:
        """Wait in turn: a connection of `origin` handed over, or None (room to open one, or
        the pool closed)."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(origin, loop.create_future())
        self._waiters.append(waiter)
        if (cap := self._caps.get(origin)) is not None and not self._room_for(origin, loop.time()):
            self._arm_probe(cap.probe_at)
        try:
            async with asyncio.timeout_at(deadline):
                return await waiter.future
        except BaseException as e:
            future = waiter.future
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            elif future.done() and not future.cancelled():
                # handed something, but leaving: it goes to the next in turn
                got = future.result()
                if got is None:
                    self._reserved -= 1
                    self._unclaim(origin)
                    self._hand_over(None)
                else:
                    self._release(got)
            if isinstance(e, TimeoutError):
                raise NotConnected(TimeoutError("no free connection before the deadline")) from e
            raise

    def _release(self, connection: _Connection) -> None:
        """`connection` is free (usable, kept): to a waiter, else idle."""
        if not self._hand_over(connection):
            self._idle.setdefault(connection.origin, []).append(connection)

    def _hand_over(self, connection: _Connection | None) -> bool:
        """Give the first waiter it can serve its turn: `connection` (free) if it is of the
        waiter's origin, else the room it leaves once closed, or the room of a connection gone
        (None). Room goes only to a waiter whose origin is under its cap (`_room_for`). A
        connection goes to a later waiter of its own origin instead (no reconnect) while the
        first has been passed over fewer than MAX_SKIPS times, so that a full pool serving
        one origin without pause does not starve another's requests. Whether a waiter took
        it."""
        if not self._waiting():
            return False
        waiters = self._waiters
        now = asyncio.get_running_loop().time()
        origin = None if connection is None else connection.origin
        i = self._first_served(origin, now)
        if i < 0:
            return False  # every waiter waits for its own origin's connection
        first = waiters[i]
        if connection is None:
            del waiters[i]
            self._reserved += 1
            self._claim(first.origin, now)
            first.future.set_result(None)
            return True
        if first.origin != origin and first.skips < MAX_SKIPS:
            for j in range(i + 1, len(waiters)):
                waiter = waiters[j]
                if waiter.origin == origin and not waiter.future.done():
                    for ahead in waiters[:j]:
                        ahead.skips += 1
                    del waiters[j]
                    waiter.future.set_result(connection)
                    return True
        if first.origin == origin:
            del waiters[i]
            first.future.set_result(connection)
            return True
        connection.close()  # its room goes to the first waiter that may open one (`_gone`)
        return True

    def _first_served(self, origin: Origin | None, now: float) -> int:
        """The position of the first waiter that a connection of `origin` (None: room) can
        serve: one of `origin`, or one that may open a connection; -1 if none."""
        if not self._caps:  # (no origin refused one: the first waiter, as every request's)
            return 0 if self._waiting() else -1
        room: dict[Origin, bool] = {}  # (by origin: many may wait for one at its cap)
        for i, waiter in enumerate(self._waiters):
            if waiter.future.done():
                continue
            if waiter.origin == origin:
                return i
            may = room.get(waiter.origin)
            if may is None:
                may = room[waiter.origin] = self._room_for(waiter.origin, now)
            if may:
                return i
        return -1

    def _waiting(self) -> bool:
        """Whether a request waits for a connection (those leaving are dropped first)."""
        waiters = self._waiters
        while waiters and waiters[0].future.done():
            waiters.pop(0)
        return bool(waiters)

    def _queued(self, origin: Origin, now: float) -> bool:
        """Whether a request waits that one for `origin` would overtake: one of `origin`, or
        one that may open a connection."""
        return self._first_served(origin, now) >= 0

    # ---- caps on the connections to one origin

    def _room_for(self, origin: Origin, now: float) -> bool:
        """Whether a connection to `origin` may open: it refused none over its cap, the pool
        holds fewer to it than it learned, or one more is due a try."""
        cap = self._caps.get(origin)
        return cap is None or self._held.get(origin, 0) < cap.limit or now >= cap.probe_at

    def _claim(self, origin: Origin, now: float) -> None:
        """Count a connection to `origin` about to open (`_room_for` allowed it); over its
        cap, it is the one more tried, and the next waits `CAP_PROBE_S`."""
        held = self._held[origin] = self._held.get(origin, 0) + 1
        cap = self._caps.get(origin)
        if cap is not None and held > cap.limit:
            cap.limit, cap.probe_at = held, now + CAP_PROBE_S

    def _unclaim(self, origin: Origin) -> None:
        held = self._held.get(origin, 0) - 1
        if held > 0:
            self._held[origin] = held
        else:
            self._held.pop(origin, None)

    def _learn_cap(self, origin: Origin) -> None:
        """`origin` refused a new connection over its cap (counted still): the pool holds no
        more connections to it than the others it holds now."""
        if len(self._caps) >= MAX_ORIGINS:  # (those holding nothing go first)
            for known in [o for o in self._caps if o not in self._held]:
                del self._caps[known]
        now = asyncio.get_running_loop().time()
        self._caps[origin] = _Cap(max(0, self._held.get(origin, 0) - 1), now + CAP_PROBE_S)

    def _arm_probe(self, due: float) -> None:
        """Wake the pool at `due` (loop time), when a waiter at its origin's cap is due a try,
        unless it wakes sooner."""
        if self._probe_timer is not None:
            if self._probe_timer.when() <= due:
                return
            self._probe_timer.cancel()
        self._probe_timer = asyncio.get_running_loop().call_at(due, self._probe)

    def _probe(self) -> None:
        """A waiter's origin is due a try: room for it, if the pool has some free (else the
        next connection freed makes it, `_hand_over`); then the next time one is due."""
        self._probe_timer = None
        if self.closed:
            return
        while len(self._connections) + self._reserved < self._limit and self._hand_over(None):
            pass
        now = asyncio.get_running_loop().time()
        due = min(
            (
                cap.probe_at
                for origin in {waiter.origin for waiter in self._waiters}
                if (cap := self._caps.get(origin)) is not None and not self._room_for(origin, now)
            ),
            default=None,
        )
        if due is not None:
            self._arm_probe(due)

    def _drop(self, connection: _Connection) -> None:
        """Close `connection` and forget it, its room (and its count for its origin) left to
        the caller, who opens one to the same origin in it (not handed over)."""
        connection.open = False
        self._connections.discard(connection)
        if connection.transport is not None:
            connection.transport.close()

    def _gone(self, connection: _Connection) -> None:
        if connection not in self._connections:
            return
        self._connections.remove(connection)
        self._unclaim(connection.origin)
        idle = self._idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)
        self._hand_over(None)

    def close(self) -> None:
        """Close every connection; requests after this raise RuntimeError."""
        self.closed = True
        if self._probe_timer is not None:
            self._probe_timer.cancel()
            self._probe_timer = None
        waiters, self._waiters = self._waiters, []
        for connection in list(self._connections):
            connection.close()
        self._idle.clear()
        for waiter in waiters:  # (each finds the pool closed)
            if not waiter.future.done():
                waiter.future.set_result(None)


_DEFAULT_CONTEXT: list[ssl.SSLContext] = []


def _default_context() -> ssl.SSLContext:
    """The system's CAs, host names checked (aiohttp's `ssl=True`)."""
    if not _DEFAULT_CONTEXT:
        _DEFAULT_CONTEXT.append(ssl.create_default_context())
    return _DEFAULT_CONTEXT[0]
