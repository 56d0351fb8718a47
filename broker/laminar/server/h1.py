"""The API's HTTP/1.1 fast path: a connection protocol that parses plain requests itself and
calls the application's handlers (through its middlewares) without aiohttp's per-request
machinery (its parser, request and payload objects, task and response writer), which took
about half of a broker's CPU for one-record appends (bench/RESULTS.md, issue 22).

Only requests whose every byte is plainly valid take it: an HTTP/1.1 request line with an
absolute path of printable ASCII (no `%`, no dot segments), headers of token names and
printable values (at most `MAX_FAST_HEADERS`), at most one all-digit Content-Length within the
application's body limit, no Transfer-Encoding, Expect or Upgrade, and a route of the
application other than those kept for aiohttp (a WebSocket's). The first request that is
anything else (malformed, HEAD, a 404 or 405, a chunked or over-long body, a WebSocket) hands
the connection, with every byte of that request unread, to aiohttp's own handler
(`_ApiConnection`), which keeps it from then on: the errors and edge cases stay aiohttp's.

Per connection, the fast path keeps aiohttp's rules: the head timeout (408 and close), the idle
timeout between requests, lingering after an answer sent before its request's body was read,
requests served one at a time (pipelined ones wait, with reading paused past a bound, and the
next one waits for the answers before it to drain), and the handler not cancelled when its
client goes away."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qsl

import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy

from ..models import ErrorBody
from ..swim.address import source_key

if TYPE_CHECKING:
    from .http import _ApiServer

log = logging.getLogger(__name__)

#: After an answer sent before its request's body was read (a 307, a 413, a 408, ...), the
#: server reads and drops the rest of the body for at most this long (aiohttp's default),
#: so that the client gets the answer rather than a reset, then closes the connection.
LINGERING_TIME_S = 10.0
#: a request's line and headers longer than this take aiohttp's path (which refuses a line or
#: header over 8190 bytes with a 400)
MAX_FAST_HEAD_BYTES = 8190
#: more headers than this take aiohttp's path (which refuses over 128)
MAX_FAST_HEADERS = 64
#: while a request is served, bytes of requests pipelined behind it are buffered up to this;
#: then the connection's reading is paused until the request is answered
MAX_PIPELINED_BYTES = 256 << 10

#: paths of routes with parameters whose match is kept (`FastRoutes.find`)
MAX_MATCHED_PATHS = 4096

_REQUEST_LINE = re.compile(rb"([A-Z]{3,7}) (/[!-~]*) HTTP/1\.1")
#: one header line: a token (RFC 9110's tchar), a colon, printable ASCII and tabs
_HEADER_LINE = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t -~]*"
#: header lines, CRLF between them
_HEADERS = re.compile(_HEADER_LINE + rb"(?:\r\n" + _HEADER_LINE + rb")*")
#: a path aiohttp would decode or normalize (percent-encoding, dot segments, a fragment)
_UNPLAIN_PATH = re.compile(r"%|#|/\.\.?(?:/|$)")
_DIGITS = re.compile(r"[0-9]{1,18}")
_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_HANDED_OVER_HEADERS = frozenset(("transfer-encoding", "expect", "upgrade"))

Handler = Callable[[Any], Awaitable[web.StreamResponse]]
#: A route's handler that answers without a task (`NOW_HANDLERS`): given a request whose whole
#: body has arrived, and the body, it either takes the request (True), and answers it later
#: through `FastRequest.answer`, never before it returns, or leaves it, untouched (False), to
#: the route's handler through the middlewares.
NowHandler = Callable[["FastRequest", bytes], bool]
#: a route with parameters, its handler, and the parameters of a path it matched
_Matched = tuple[web.AbstractRoute, Handler, dict[str, str]]
#: the application's handlers that answer without a task, by (method, route template)
NOW_HANDLERS: web.AppKey[dict[tuple[str, str], NowHandler]] = web.AppKey("now_handlers", dict)


class FastMatch(dict[str, str]):
    """The route's path parameters, as aiohttp's `UrlMappingMatchInfo` offers them to the
    handlers and the middleware (`route.resource.canonical`; no HTTP exception)."""

    __slots__ = ("route",)
    http_exception = None

    def __init__(self, route: web.AbstractRoute, params: dict[str, str]) -> None:
        super().__init__(params)
        self.route = route


class FastRequest(dict[Any, Any]):
    """One request of the fast path, with the part of `web.Request`'s interface the API's
    handlers use. Its mapping holds what the middleware stores (`request[KEY]`)."""

    def __init__(
        self,
        connection: FastConnection,
        method: str,
        target: str,
        headers: CIMultiDictProxy[str],
        match: FastMatch,
        content_length: int | None,
    ) -> None:
        super().__init__()
        self._connection = connection
        self.method = method
        self.path_qs = target
        self.path, _, self.query_string = target.partition("?")
        self.headers = headers
        self.match_info = match
        self.content_length = content_length
        self.body_exists = bool(content_length)
        self._query: MultiDictProxy[str] | None = None
        self._answered = False  # (a NowHandler's request: `answer` was called)

    @property
    def query(self) -> MultiDictProxy[str]:
        if self._query is None:
            self._query = MultiDictProxy(
                MultiDict(parse_qsl(self.query_string, keep_blank_values=True))
            )
        return self._query

    @property
    def content_type(self) -> str:
        """The media type of Content-Type, lowercased, without parameters (aiohttp's default
        when there is none)."""
        value = self.headers.get("Content-Type")
        if not value:
            return "application/octet-stream"
        return value.partition(";")[0].strip().lower()

    @property
    def remote(self) -> str | None:
        return self._connection.remote

    @property
    def content(self) -> FastRequest:
        """The body's stream, as far as `read_body` looks at it (`is_eof`)."""
        return self

    def is_eof(self) -> bool:
        return self._connection.body_complete()

    async def read(self) -> bytes:
        """The whole body, once it has arrived (ConnectionResetError if the client goes
        away first)."""
        return await self._connection.body()

    def answer(self, response: web.Response | tuple[str, bytes]) -> None:
        """Answer a request that a `NowHandler` took: with `response`, or with (`head`,
        `body`): the status line and header lines (each ending in CRLF, without Content-Length
        and Connection) and the body. Nothing is sent when the connection has gone, nor for a
        request answered already (one response per request, whatever its handler does)."""
        if self._answered:
            return
        self._answered = True
        self._connection.answer_now(self, response)


class FastRoutes:
    """The application's routes that the fast path serves, each with its handler wrapped in
    the application's middlewares (as aiohttp wraps them)."""

    def __init__(self, app: web.Application, aiohttp_paths: Iterable[str] = ()) -> None:
        kept = set(aiohttp_paths)
        self.max_body_bytes = app._client_max_size
        now_handlers = app.get(NOW_HANDLERS, {})
        #: method → [(path pattern, route, handler through the middlewares)]
        self._routes: dict[str, list[tuple[re.Pattern[str], web.AbstractRoute, Handler]]] = {}
        #: paths without parameters: (method, path) → (route, handler)
        self._plain: dict[tuple[str, str], tuple[web.AbstractRoute, Handler]] = {}
        #: the handlers that answer without a task, by route
        self._now: dict[web.AbstractRoute, NowHandler] = {}
        #: paths that matched a route with parameters: (method, path) → (route, handler,
        #: parameters), cleared when it holds `MAX_MATCHED_PATHS` (an append's path repeats:
        #: trying every route's pattern in turn took 4 % of a broker's loop)
        self._matched: dict[tuple[str, str], _Matched] = {}
        for route in app.router.routes():
            resource = route.resource
            if resource is None or route.method == "HEAD" or resource.canonical in kept:
                continue
            handler: Handler = route.handler
            for middleware in reversed(app.middlewares):
                handler = functools.partial(middleware, handler=handler)
            canonical = resource.canonical
            now = now_handlers.get((route.method, canonical))
            if now is not None:
                self._now[route] = now
            if not _PARAM.search(canonical):
                self._plain[(route.method, canonical)] = (route, handler)
                continue
            parts = _PARAM.split(canonical)  # literal, parameter, literal, ...
            pattern = re.compile(
                "".join(
                    f"(?P<{part}>[^{{}}/]+)" if i % 2 else re.escape(part)
                    for i, part in enumerate(parts)
                )
            )
            self._routes.setdefault(route.method, []).append((pattern, route, handler))

    def find(self, method: str, path: str) -> tuple[FastMatch, Handler] | None:
        plain = self._plain.get((method, path))
        if plain is not None:
            return FastMatch(plain[0], {}), plain[1]
        matched = self._matched.get((method, path))
        if matched is not None:
            return FastMatch(matched[0], matched[2]), matched[1]
        for pattern, route, handler in self._routes.get(method, ()):
            found = pattern.fullmatch(path)
            if found is not None:
                params = found.groupdict()
                if len(self._matched) >= MAX_MATCHED_PATHS:
                    self._matched.clear()
                self._matched[(method, path)] = (route, handler, params)
                return FastMatch(route, params), handler
        return None

    def now(self, route: web.AbstractRoute) -> NowHandler | None:
        """The handler of `route` that answers without a task, if it has one."""
        return self._now.get(route)


class FastConnection(asyncio.Protocol):
    """One API connection, served by the fast path until a request needs aiohttp (see the
    module's docstring); counted against its client address's cap like `_ApiConnection`."""

    def __init__(self, server: _ApiServer, routes: FastRoutes, client: str | None) -> None:
        self._server = server
        self._routes = routes
        self._loop = asyncio.get_running_loop()
        #: the client address this connection is counted for (None: not counted, or released
        #: or handed over with the connection)
        self._client = client
        self.remote: str | None = None
        self._transport: asyncio.Transport | None = None
        #: bytes received and not parsed yet: the start of the next request's head onwards
        self._buffer = bytearray()
        #: one timer for the connection's deadline (head, idle or lingering): moving the
        #: deadline later, as every request does, only changes `_deadline`; the timer, when it
        #: fires early, sets itself again for it
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        #: what to do at the deadline (None: nothing, no deadline)
        self._on_deadline: Callable[[], None] | None = None
        #: the timer is the idle timeout's (not the head timeout's)
        self._timer_idle = False
        #: close once the request being served is answered (Connection: close, shutdown)
        self._closing_after_answer = False
        self._paused = False
        self._closing = False
        #: the request being served (None: waiting for a head)
        self._request: FastRequest | None = None
        self._task: asyncio.Task[None] | None = None
        #: its body as it arrives, and how many of its bytes are still to come
        self._body = bytearray()
        self._body_left = 0
        self._body_waiter: asyncio.Future[None] | None = None
        #: the request was answered; its body's rest is being read and dropped (lingering)
        self._answered = False
        #: set while the transport's write buffer is over its limit: the next request waits
        self._drained: asyncio.Future[None] | None = None
        #: set by `shutdown` while a request a `NowHandler` took is not answered yet: resolved
        #: by its answer
        self._now_answered: asyncio.Future[None] | None = None

    # ---- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's: not a subclass
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, tuple) and peer else None
        self._server._connections[self] = self._transport  # type: ignore[index]  # shutdown
        if self._client is None:  # plain HTTP: counted now (TLS: at TCP accept, by ApiSite)
            client = source_key(self.remote or str(peer))
            if not self._server.hold(client):
                self._hand_over()  # aiohttp's handler counts it again: 429, and it closes
                return
            self._client = client
        self._set_timer(self._server.limits.header_timeout_s, self._head_timed_out)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._body_left:
            taken = data[: self._body_left]
            self._body += taken
            self._body_left -= len(taken)
            if len(data) > len(taken):
                self._buffer += data[len(taken) :]
            if not self._body_left:
                self._body_arrived()  # which goes on to the next request if this one is over
        else:
            self._buffer += data
        if self._request is None:
            self._next_request()
        elif len(self._buffer) > MAX_PIPELINED_BYTES and not self._paused:
            self._paused = True
            self._transport.pause_reading()  # type: ignore[union-attr]

    def connection_lost(self, exc: BaseException | None) -> None:
        self._closing = True
        self._stop_timer()
        self._server._connections.pop(self, None)  # type: ignore[call-overload]
        self.release()
        waiter = self._body_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the client closed the connection"))
        self.resume_writing()

    def pause_writing(self) -> None:
        if self._drained is None:
            self._drained = self._loop.create_future()

    def resume_writing(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    # ---- what aiohttp's server asks of its connections at shutdown ---------------------

    def close(self) -> None:
        """Close once the request being served, if any, is answered."""
        self._closing_after_answer = True
        if self._request is None and self._transport is not None:
            self._close()

    async def shutdown(self, timeout: float | None = None) -> None:
        task = self._task
        if task is not None and not task.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(task), timeout)
        elif self._request is not None and not self._answered:  # a NowHandler's: its answer
            self._now_answered = self._loop.create_future()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._now_answered), timeout)
        self._close()

    # ---- requests ----------------------------------------------------------------------

    def _next_request(self) -> None:
        """Serve the next request whose head is in the buffer, or wait for one."""
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_FAST_HEAD_BYTES:
                self._hand_over()
            elif self._buffer:  # a head is arriving: it has to be complete in time
                if self._on_deadline is None or self._timer_idle:
                    self._set_timer(self._server.limits.header_timeout_s, self._head_timed_out)
            elif self._on_deadline is None:
                self._set_timer(self._server.limits.idle_timeout_s, self._close, idle=True)
            return
        parsed = None if end > MAX_FAST_HEAD_BYTES else self._parse(bytes(self._buffer[:end]))
        if parsed is None:
            self._hand_over()
            return
        self._cancel_timer()
        request, handler = parsed
        del self._buffer[: end + 4]
        length = request.content_length or 0
        self._body = self._buffer[:length]
        del self._buffer[:length]
        self._body_left = length - len(self._body)
        self._answered = False
        self._request = request
        if not self._body_left:
            now = self._routes.now(request.match_info.route)
            if now is not None:
                try:
                    if now(request, bytes(self._body)):
                        return  # answered through `answer_now`
                except Exception:  # a NowHandler leaves or takes a request: this is a bug
                    log.exception("%s %s failed in its NowHandler", request.method, request.path)
                    self._close()
                    return
        self._task = self._loop.create_task(self._serve(request, handler))

    def _parse(self, head: bytes) -> tuple[FastRequest, Handler] | None:
        """The request of `head` and its handler, or None: the request is not for the fast
        path."""
        first, _, rest = head.partition(b"\r\n")
        line = _REQUEST_LINE.fullmatch(first)
        if line is None or (rest and not _HEADERS.fullmatch(rest)):
            return None
        target = line[2].decode("ascii")
        method = line[1].decode("ascii")
        path = target.partition("?")[0]
        if _UNPLAIN_PATH.search(path):
            return None
        found = self._routes.find(method, path)
        if found is None:
            return None
        lines = rest.decode("ascii").split("\r\n") if rest else []
        if len(lines) > MAX_FAST_HEADERS:
            return None
        fields: list[tuple[str, str]] = []
        content_length: int | None = None
        close = False
        for raw in lines:
            name, _, value = raw.partition(":")
            value = value.strip(" \t")
            lowered = name.lower()
            if lowered in _HANDED_OVER_HEADERS:
                return None
            if lowered == "content-length":
                if content_length is not None or not _DIGITS.fullmatch(value):
                    return None
                content_length = int(value)
                if content_length > self._routes.max_body_bytes:
                    return None  # aiohttp's path answers 413 and closes
            elif lowered == "connection":
                tokens = value.lower()
                if "upgrade" in tokens:
                    return None
                close = "close" in tokens
            fields.append((name, value))
        if close:
            self._closing_after_answer = True
        match, handler = found
        headers = CIMultiDictProxy(CIMultiDict(fields))
        return FastRequest(self, method, target, headers, match, content_length), handler

    async def _serve(self, request: FastRequest, handler: Handler) -> None:
        try:
            response = await handler(request)
        except ConnectionError:  # the client is gone: no answer can reach it
            self._close()
            return
        except Exception:  # the middleware answers every error: this is a bug
            log.exception("%s %s failed past the API's middleware", request.method, request.path)
            self._close()
            return
        if self._transport is None or self._transport.is_closing():
            return
        keep = response.keep_alive is not False and not self._closing_after_answer
        # head and body as two buffers: the event loop (uvloop) sends them in one writev and
        # keeps what the socket does not take yet without copying a read's megabytes
        self._transport.writelines(_encode(response, keep))
        if self._drained is not None:  # a client that does not read holds its next request
            await self._drained
        self._after_answer(keep)

    def answer_now(self, request: FastRequest, response: web.Response | tuple[str, bytes]) -> None:
        """`FastRequest.answer`: the answer to the request a `NowHandler` took."""
        waiting, self._now_answered = self._now_answered, None
        if waiting is not None and not waiting.done():
            waiting.set_result(None)
        if request is not self._request or self._transport is None:
            return
        if self._transport.is_closing():
            return
        encoded: tuple[bytes, bytes | bytearray | memoryview]
        if isinstance(response, tuple):
            keep = not self._closing_after_answer
            head, body = response
            ending = "\r\n" if keep else "Connection: close\r\n\r\n"
            encoded = (f"{head}Content-Length: {len(body)}\r\n{ending}".encode(), body)
        else:
            keep = response.keep_alive is not False and not self._closing_after_answer
            encoded = _encode(response, keep)
        self._transport.writelines(encoded)
        if self._drained is not None:  # a client that does not read holds its next request
            self._drained.add_done_callback(lambda _: self._after_answer(keep))
        else:
            self._after_answer(keep)

    def _after_answer(self, keep: bool) -> None:
        """The request's answer is sent (or buffered within the transport's limit): read the
        rest of its body, or go on to the next request."""
        self._answered = True
        if not keep:
            self._closing_after_answer = True
        if self._body_left:
            # read and drop the rest of the body for a while (so that the client gets the
            # answer rather than a reset), then go on, or close
            self._set_timer(LINGERING_TIME_S, self._close)
            return
        self._request_done()

    def _body_arrived(self) -> None:
        waiter = self._body_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self._answered:
            self._cancel_timer()
            self._request_done()

    def body_complete(self) -> bool:
        return self._body_left == 0

    async def body(self) -> bytes:
        if self._body_left:
            self._body_waiter = self._loop.create_future()
            await self._body_waiter
        return bytes(self._body)

    def _request_done(self) -> None:
        self._request = None
        self._task = None
        self._body = bytearray()
        self._body_waiter = None
        if self._closing_after_answer:
            self._close()
            return
        if self._paused:
            self._paused = False
            self._transport.resume_reading()  # type: ignore[union-attr]
        self._next_request()

    # ---- timers, closing and handing over ----------------------------------------------

    def _set_timer(self, delay_s: float, callback: Callable[[], None], idle: bool = False) -> None:
        at = self._loop.time() + delay_s
        self._deadline = at
        self._on_deadline = callback
        self._timer_idle = idle
        if self._timer is None or self._timer.when() > at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(at, self._timer_fired)

    def _cancel_timer(self) -> None:
        self._on_deadline = None

    def _timer_fired(self) -> None:
        self._timer = None
        callback = self._on_deadline
        if callback is None:
            return
        if self._loop.time() < self._deadline:  # moved later since the timer was set
            self._timer = self._loop.call_at(self._deadline, self._timer_fired)
            return
        self._on_deadline = None
        callback()

    def _stop_timer(self) -> None:
        self._on_deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timed_out(self) -> None:
        timeout_s = self._server.limits.header_timeout_s
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(
                raw_error(
                    408,
                    "request_timeout",
                    f"the request line and headers did not arrive within {timeout_s:g} s",
                )
            )
        self._close()

    def _close(self) -> None:
        self._closing = True
        self._stop_timer()
        if self._transport is not None:
            self._transport.close()

    def release(self) -> bool:
        """Stop counting this connection against its client's cap (once; later calls do
        nothing). True if this call released it."""
        client, self._client = self._client, None
        return self._server.release(client)

    def _hand_over(self) -> None:
        """From now on aiohttp's handler serves this connection, starting with the bytes of
        the request at the buffer's start."""
        transport = self._transport
        assert transport is not None
        self._closing = True  # nothing more arrives here
        self._stop_timer()
        self._server._connections.pop(self, None)  # type: ignore[call-overload]
        client, self._client = self._client, None  # counted: the new handler releases it
        connection = self._server.aiohttp_connection(client)
        transport.set_protocol(connection)
        connection.connection_made(transport)
        if self._paused:
            transport.resume_reading()
        if self._buffer:
            connection.data_received(bytes(self._buffer))
        self._buffer = bytearray()


def raw_error(
    status: int,
    code: str,
    message: str,
    *,
    retry_after: bool = False,
    headers: Iterable[tuple[str, str]] = (),
) -> bytes:
    """A whole HTTP/1.1 error answer with the API's JSON body (and `headers`), for writing to
    a connection directly (outside request handling)."""
    body = orjson.dumps(ErrorBody(code, message).to_json())
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "Content-Type: application/json; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if retry_after:
        lines.append("Retry-After: 1")
    lines.extend(f"{name}: {value}" for name, value in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _encode(
    response: web.StreamResponse, keep_alive: bool
) -> tuple[bytes, bytes | bytearray | memoryview]:
    """`response` (a `web.Response` the handlers made) as HTTP/1.1: its head and its body."""
    assert isinstance(response, web.Response), "the fast path serves whole answers only"
    body = response.body
    data: bytes | bytearray | memoryview
    if body is None:
        data = b""
    elif isinstance(body, (bytes, bytearray, memoryview)):
        data = body
    else:  # an aiohttp payload of bytes (a memoryview body)
        data = body._value
    status = response.status
    parts = [f"HTTP/1.1 {status} {response.reason}\r\n"]
    for name, value in response.headers.items():
        if name != "Content-Length":
            parts.append(f"{name}: {value}\r\n")
    if status >= 200 and status not in (204, 304):
        parts.append(f"Content-Length: {len(data)}\r\n")
    if not keep_alive:
        parts.append("Connection: close\r\n")
    parts.append("\r\n")
    return "".join(parts).encode("utf-8"), data
