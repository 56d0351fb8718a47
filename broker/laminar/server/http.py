"""HTTP pieces shared by the API's handlers: JSON errors, bounded JSON parsing and body reads
(a body as its `laminar.models` model), content negotiation, and the HTTP server's connection
rules (`ApiRunner`: JSON errors even for requests aiohttp cannot parse, head and idle
timeouts, a cap on connections per client address; `ApiSite`: with TLS, that cap applies from
TCP accept, before the TLS handshake, which has to be over within a short bound)."""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from aiohttp import web

from ..contract import CONNECTION_LIMIT_HEADER
from ..log.errors import CorruptBatchError, MalformedRecordsError
from ..models import ErrorBody, JsonModel, ModelError, TooLargeError
from ..swim.address import source_key
from .h1 import LINGERING_TIME_S, FastConnection, FastRoutes, raw_error
from .listener import AcceptedSocket, Listener

if TYPE_CHECKING:
    from ..partition.replica import Replica


def json_response(
    body: Any, *, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """A JSON answer, encoded with orjson (acquire and read answers carry many records)."""
    return web.Response(
        body=orjson.dumps(body),
        status=status,
        headers=headers,
        content_type="application/json",
        charset="utf-8",
    )


#: the message of every 500: what went wrong is in the broker's log, not in the answer
INTERNAL_MESSAGE = "internal error (the broker logged it)"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        close: bool = False,
        **extra: Any,
    ) -> None:
        """`extra`: the fields of the error body (`ErrorBody`) beyond its code and message."""
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        #: end the connection after the answer (the request's body may be left half read)
        self.close = close
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """The API's error body (`ErrorBody`) as JSON."""
        return ErrorBody(self.code, self.message, **self.extra).to_json()

    def response(self) -> web.Response:
        response = json_response(self.body(), status=self.status, headers=self.headers)
        if self.close:
            response.force_close()
        return response


def unavailable(message: str) -> ApiError:
    """503: nothing was done (no leader known, not ready, shutting down); retry."""
    return ApiError(503, "unavailable", message, headers={"Retry-After": "1"})


def internal() -> ApiError:
    """500: a fault of the broker's own (a bug), logged there; the answer says no more."""
    return ApiError(500, "internal", INTERNAL_MESSAGE)


def damaged(replica: Replica, error: CorruptBatchError) -> ApiError:
    """A read met a batch damaged on disk (never served). Another replica has it: 503 while
    this one is repaired. This is the partition's only voter: 422 with where to read on."""
    if replica.repairable:
        return unavailable(
            f"{replica.group}: this replica's batch at {error.index} is damaged on disk and "
            "is being fetched again from the leader; retry (another replica may serve it)"
        )
    _, end = replica.log.batch_range(error.index)
    return ApiError(
        422,
        "corrupt_data",
        f"{replica.group}: the records {error.index}..{end - 1} are damaged on disk and the "
        f"partition has no other replica to fetch them from; read on from {end}",
        next_index=end,
    )


def malformed(replica: Replica, error: MalformedRecordsError) -> ApiError:
    """A read met a batch whose checksum holds but whose records are malformed (stored before
    appends checked records). Every replica holds the same bytes, so no repair can help: 422,
    as for damage nothing can repair, with where to read on (never a 500)."""
    return ApiError(
        422,
        "corrupt_data",
        f"{replica.group}: the records {error.base_index}..{error.next_index - 1} are "
        f"malformed and cannot be served ({error}); read on from {error.next_index}",
        next_index=error.next_index,
    )


def outcome_unknown(code: str, message: str) -> ApiError:
    """504: a write was proposed but whether it committed is not known (`timeout`: not within
    the request timeout; `outcome_unknown`: leadership was lost, or the replica closed, first).
    It may still commit: only a retry the broker deduplicates is safe."""
    return ApiError(504, code, message)


# ---- request bodies ------------------------------------------------------------------------

#: JSON request bodies (docs/api.md, "Limits"), checked before they are parsed: how deep arrays
#: and objects may nest, and how many values a body may hold (strings, numbers, literals,
#: arrays and objects; object keys count). Parsing and checking a body within them takes
#: bounded time and memory; a body beyond them is refused before any object is made.
MAX_JSON_DEPTH = 32
MAX_JSON_VALUES = 200_000
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b",:[]{}")
_BRACKETS_ONLY = bytes.maketrans(b"{}", b"[]")
#: The check reads a body this many bytes at a time: each step is a short call into C, so a
#: thread that checks a big body lets the event loop's thread run in between.
_SLICE_BYTES = 64 << 10


def check_json_bounds(body: bytes) -> None:
    """Refuse `body` (400 `bad_request`, 413 `payload_too_large`) unless its JSON nests at most
    MAX_JSON_DEPTH deep and holds at most MAX_JSON_VALUES values, without parsing it: a few
    passes of bytes operations in C.

    With escaped backslashes and quotes dropped, every `"` left delimits a string, so the
    text between strings is the document's structure: there, values are at most
    1 + commas + colons + brackets that open (a value is the root, an item after a comma, a
    member's value after a colon, or a container's first item), and repeatedly removing the
    innermost bracket pairs (`{}` written as `[]`: one pass removes one level) empties them in
    exactly as many rounds as they nest deep. For a body that is not valid JSON the counts are
    only what the parser will meet before it fails, or more."""
    text = body
    if b"\\" in text:
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    values = 1
    in_string = False
    structure: list[bytes] = []
    for start in range(0, len(text), _SLICE_BYTES):
        parts = text[start : start + _SLICE_BYTES].split(b'"')
        marks = b"".join(parts[in_string::2]).translate(None, _NOT_STRUCTURE)
        if len(parts) % 2 == 0:  # an odd number of quotes: the next slice starts on the other side
            in_string = not in_string
        values += marks.count(b",") + marks.count(b":") + marks.count(b"[") + marks.count(b"{")
        if values > MAX_JSON_VALUES:
            raise _too_many_values()
        structure.append(marks)
    if in_string:
        raise ApiError(400, "bad_request", "malformed JSON: a string is not terminated")
    marks = b"".join(structure)
    if marks.count(b"[") + marks.count(b"{") <= MAX_JSON_DEPTH:
        return  # cannot nest deeper; the parser judges whether the brackets pair up
    brackets = marks.translate(_BRACKETS_ONLY, b",:")
    for _ in range(MAX_JSON_DEPTH):
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            break
        brackets = inner
    if brackets:
        raise ApiError(
            400,
            "bad_request",
            f"malformed JSON: arrays and objects nest deeper than {MAX_JSON_DEPTH} levels, or "
            "their brackets do not pair up",
        )


def _too_many_values() -> ApiError:
    return ApiError(
        413,
        "payload_too_large",
        f"the JSON body holds more than {MAX_JSON_VALUES} values (strings, numbers, literals, "
        "arrays and objects, keys included): split it",
    )


M = TypeVar("M", bound=JsonModel)


def parsed(model: type[M], document: Any) -> M:
    """`document`, a request's parsed JSON body, as `model` (laminar.models): its ModelError
    is a 400 `bad_request`, a TooLargeError a 413 `payload_too_large`, with its message."""
    try:
        return model.from_json(document)
    except TooLargeError as e:
        raise ApiError(413, "payload_too_large", str(e)) from e
    except ModelError as e:
        raise ApiError(400, "bad_request", str(e)) from e


def parse_json(body: bytes) -> Any:
    """`body` parsed as JSON within MAX_JSON_DEPTH and MAX_JSON_VALUES (ApiError otherwise).
    Strict JSON: UTF-8 only, no lone surrogates, no NaN or Infinity."""
    check_json_bounds(body)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ApiError(400, "bad_request", f"malformed JSON: {e}") from e


async def read_body(request: web.BaseRequest, timeout_s: float) -> bytes:
    """The request's body (up to the application's `client_max_size`: else 413), which must
    have arrived `timeout_s` after this starts reading it: else 408 `request_timeout`, and the
    connection is closed rather than waited on."""
    try:
        if request.content.is_eof():  # all of it arrived already: no timer to make
            return await request.read()
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError as e:
        raise ApiError(
            408,
            "request_timeout",
            f"the request body did not arrive within {timeout_s:g} s",
            close=True,
        ) from e
    except web.RequestPayloadError as e:  # a broken chunked encoding, a short body at EOF
        raise ApiError(400, "bad_request", f"unreadable request body: {e}", close=True) from e


# ---- content negotiation -------------------------------------------------------------------

_QVALUE = re.compile(r"0(?:\.[0-9]{0,3})?|1(?:\.0{0,3})?")


def accepts(request: web.BaseRequest, media_type: str) -> bool:
    """Whether the request's `Accept` header asks for `media_type` (RFC 9110 §12.5.1): named
    itself, with a weight `q` above 0 (a missing q is 1; a malformed one counts as 0).
    Wildcards (`*/*`, `application/*`) do not ask for it: they leave the API's default."""
    wanted = media_type.lower()
    for header in request.headers.getall("Accept", ()):
        for media_range in header.split(","):
            kind, *params = media_range.split(";")
            if kind.strip().lower() != wanted:
                continue
            weight = 1.0
            for param in params:
                name, _, value = param.partition("=")
                if name.strip().lower() == "q":
                    value = value.strip()
                    weight = float(value) if _QVALUE.fullmatch(value) else 0.0
            if weight > 0:
                return True
    return False


# ---- the HTTP server -----------------------------------------------------------------------

#: An error message built from what the client sent is cut to this many characters.
MAX_ECHO_CHARS = 300


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The HTTP server's rules for connections (`laminar serve` flags, docs/api.md "Limits")."""

    #: a request's line and headers must have arrived this long after its first byte, or
    #: after the connection opened (the first request): else 408 and the connection is closed
    header_timeout_s: float = 10.0
    #: a keep-alive connection with no request is closed after this long
    idle_timeout_s: float = 60.0
    #: connections one client address may hold at once; another is answered 429 and closed
    max_connections_per_client: int = 256


class ApiRunner(web.AppRunner):
    """`web.AppRunner` whose connections follow `ConnectionLimits` and answer every error,
    those of requests aiohttp cannot parse included, as the API's JSON error. Its connections
    serve plain requests on the fast path (laminar.server.h1), and hand over to aiohttp's
    handler for the rest, and for the routes of `aiohttp_paths` (a WebSocket's)."""

    def __init__(
        self, app: web.Application, limits: ConnectionLimits, aiohttp_paths: tuple[str, ...] = ()
    ) -> None:
        super().__init__(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=limits.idle_timeout_s,
            lingering_time=LINGERING_TIME_S,
            # no Content-Encoding is accepted (415): a small compressed body must not
            # inflate into unbounded work
            auto_decompress=False,
        )
        self.limits = limits
        self.aiohttp_paths = aiohttp_paths

    def connections_refused(self) -> int:
        """Connections refused so far over their client address's cap."""
        return self.server.refused if isinstance(self.server, _ApiServer) else 0

    async def _make_server(self) -> web.Server:
        routes = FastRoutes(self.app, self.aiohttp_paths)
        return _ApiServer(await super()._make_server(), self.limits, routes)


class ApiSite(web.TCPSite):
    """`web.TCPSite` that, with TLS (`ssl_context`), counts a connection against its client
    address's cap (`ConnectionLimits.max_connections_per_client`) from TCP accept: one over the
    cap is closed at once, before any TLS work (no 429 can be sent without TLS), and the TLS
    handshake of one within it must be over within `handshake_timeout_s`. Otherwise a flood of
    connections that never send a ClientHello would be held, uncounted, until they time out."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        handshake_timeout_s: float = 10.0,
        backlog: int = 1024,
        sock: socket.socket | None = None,
    ) -> None:
        """`sock`: a listening socket to serve instead of binding (host, port): a worker's
        socket of the steer port (laminar.server.steering)."""
        super().__init__(
            runner, host, port, ssl_context=ssl_context, backlog=backlog, reuse_address=True
        )
        self.sock = sock
        self.handshake_timeout_s = handshake_timeout_s
        #: TLS handshakes under way (connections counted, not handed to aiohttp yet)
        self._handshakes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        if self._ssl_context is None and self.sock is None:
            await super().start()
            return
        await web.BaseSite.start(self)  # registers the site with its runner
        if self._ssl_context is None:
            assert self.sock is not None and self._runner.server is not None
            loop = asyncio.get_running_loop()
            self._server = await loop.create_server(
                self._runner.server, sock=self.sock, backlog=self._backlog
            )
            self._bound_port = int(self.sock.getsockname()[1])
            return
        listener = Listener(self._accepted)
        if self.sock is not None:
            listener.adopt(self.sock, backlog=self._backlog)
        else:
            await listener.start(self._host, self._port, backlog=self._backlog)
        self._server = listener
        self._bound_port = int(listener.sockets[0].getsockname()[1])

    def _accepted(self, sock: socket.socket, address: object) -> None:
        """A TCP connection to the HTTPS port: counted, or closed at once if its client holds
        its cap already; then its TLS handshake."""
        server = self._runner.server
        assert isinstance(server, _ApiServer) and self._ssl_context is not None
        client = source_key(str(address[0]) if isinstance(address, tuple) else str(address))
        if not server.hold(client):
            server.refused += 1
            sock.close()
            return
        connection = server.connection(client)
        accepted = AcceptedSocket(sock)
        task = asyncio.get_running_loop().create_task(
            self._handshake(accepted, connection, self._ssl_context)
        )
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)
        # cancelled before it ran (the site stopped): close the socket, release the count
        task.add_done_callback(lambda _: accepted.close() and connection.release())

    async def _handshake(
        self, accepted: AcceptedSocket, connection: FastConnection, context: ssl.SSLContext
    ) -> None:
        """The TLS handshake (the api_listener context: its SNI callback switches to the
        current certificate); then `connection` serves HTTP on it and releases the count when
        it closes. A handshake that fails, or is not over in time, releases it here."""
        try:
            await accepted.start_tls(connection, context, self.handshake_timeout_s)
        except OSError:  # not TLS, a refused handshake, too slow, or the client went away
            connection.release()
        except BaseException:  # cancelled (the site stops)
            connection.release()
            raise

    async def stop(self) -> None:
        handshakes = list(self._handshakes)
        for task in handshakes:
            task.cancel()
        await super().stop()
        if handshakes:
            await asyncio.gather(*handshakes, return_exceptions=True)


class _ApiServer(web.Server):
    """aiohttp's server (the protocol factory) making the API's connections (the fast path's,
    which hand over to `_ApiConnection`s), with the count of connections per client address."""

    def __init__(self, base: web.Server, limits: ConnectionLimits, routes: FastRoutes) -> None:
        super().__init__(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            loop=asyncio.get_running_loop(),
            **base._kwargs,  # the RequestHandler arguments the application gave it
        )
        self.limits = limits
        self.routes = routes
        #: connections held per client address (`source_key`)
        self.clients: dict[str, int] = {}
        #: connections refused over their client address's cap (plain HTTP: answered 429;
        #: TLS: closed at TCP accept)
        self.refused = 0

    def __call__(self) -> FastConnection:  # type: ignore[override]
        return FastConnection(self, self.routes, None)

    def connection(self, client: str) -> FastConnection:
        """A connection of `client` that `hold` counted already (TLS: at TCP accept)."""
        return FastConnection(self, self.routes, client)

    def aiohttp_connection(self, client: str | None) -> _ApiConnection:
        """aiohttp's handler for a connection the fast path hands over: counted for `client`
        already (None: not counted yet)."""
        return _ApiConnection(self, client=client, loop=self._loop, **self._kwargs)

    def hold(self, client: str) -> bool:
        """Count one more connection of `client`, unless it holds its cap already."""
        held = self.clients.get(client, 0)
        if held >= self.limits.max_connections_per_client:
            return False
        self.clients[client] = held + 1
        return True

    def release(self, client: str | None) -> bool:
        """Count one connection of `client` less (None: one not counted; False)."""
        if client is None:
            return False
        held = self.clients.get(client, 1) - 1
        if held > 0:
            self.clients[client] = held
        else:
            self.clients.pop(client, None)
        return True


class _ApiConnection(web.RequestHandler):
    """One HTTP connection. On top of aiohttp's handler: a connection over its client's
    cap is answered 429 and closed at once; a request head (line and headers) that has not
    arrived within the header timeout is answered 408 and the connection closed (the idle
    time between requests is aiohttp's keep-alive timeout); and errors aiohttp answers
    itself (a request it cannot parse: 400) are the API's JSON error."""

    def __init__(self, server: _ApiServer, *, client: str | None = None, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self._api_server = server
        #: the client address this connection is counted for (None: not counted, or released)
        self._client = client
        self._head_timer: asyncio.TimerHandle | None = None
        #: the body of the last request parsed (until it ends, bytes received are body bytes)
        self._last_body: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._client is None:  # plain HTTP: counted now (TLS: at TCP accept, by ApiSite)
            peer = transport.get_extra_info("peername")
            client = source_key(str(peer[0]) if isinstance(peer, tuple) and peer else str(peer))
            if not self._api_server.hold(client):
                self._api_server.refused += 1
                limit = self._api_server.limits.max_connections_per_client
                self._answer_and_close(
                    raw_error(
                        429,
                        "overloaded",
                        f"{client} has {limit} connections open to this broker already, as "
                        "many as one client address may (--max-connections-per-client); retry "
                        "later",
                        retry_after=True,
                        headers=((CONNECTION_LIMIT_HEADER, str(limit)),),
                    )
                )
                return
            self._client = client
        self._arm_head_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_head_timer()
        self.release()
        super().connection_lost(exc)

    def release(self) -> bool:
        """Stop counting this connection against its client's cap (once; later calls do
        nothing). True if this call released it."""
        client, self._client = self._client, None
        return self._api_server.release(client)

    def data_received(self, data: bytes) -> None:
        if self._force_close or self._close:
            return  # closing: aiohttp drops what arrives now
        if self._upgraded:  # a WebSocket (a streaming append): frames, no request heads
            super().data_received(data)
            return
        if self._last_body is None or self._last_body.is_eof():
            self._arm_head_timer()  # bytes of a request head: it has to be complete in time
        parsed = len(self._messages)
        super().data_received(data)
        if len(self._messages) > parsed:  # a head arrived (or the parser gave up on it)
            self._cancel_head_timer()
            self._last_body = self._messages[-1][1]

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self._loop.call_later(
                self._api_server.limits.header_timeout_s, self._head_timed_out
            )

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        timeout_s = self._api_server.limits.header_timeout_s
        if self._request_in_progress:  # pipelined behind a request: no answer can go in between
            self.force_close()
            return
        self._answer_and_close(
            raw_error(
                408,
                "request_timeout",
                f"the request line and headers did not arrive within {timeout_s:g} s",
            )
        )

    def _answer_and_close(self, answer: bytes) -> None:
        """Send `answer` (`raw_error`'s) without a request (none was read, or ever will be)
        and close."""
        if self.transport is not None:
            self.transport.write(answer)
        self.force_close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's own error answers (a request it cannot parse: 400; an exception past the
        API's middleware, which should never happen: 500) as the API's JSON error."""
        if status >= 500 and not isinstance(exc, ConnectionError):
            self.logger.error("error handling a request from %s", request.remote, exc_info=exc)
        else:
            self.logger.debug("bad request from %s: %s", request.remote, message or exc)
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was being sent already; it cannot become an error")
        if status >= 500:
            code, text = "internal", INTERNAL_MESSAGE
        else:
            words = str(message or HTTPStatus(status).phrase).split()
            code = "bad_request"
            text = "malformed HTTP request: " + " ".join(w for w in words if w != "^")
        body = ErrorBody(code, text[:MAX_ECHO_CHARS]).to_json()
        response = json_response(body, status=status)
        response.force_close()
        return response
