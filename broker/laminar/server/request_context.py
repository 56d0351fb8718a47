"""Each API request's id and context (docs/logging.md "Request ids"): the outermost middleware
of the API, on both of its paths (aiohttp's and the HTTP/1.1 fast path, laminar.server.h1,
which calls the same middlewares).

A request's id is the client's `X-Request-Id` when it is 1 to 64 characters of
[A-Za-z0-9._-], else a new one (32 random hex digits); every answer carries it back in
`X-Request-Id`, errors included. While the request is served, the log context
(laminar.server.logs) holds its id and, when its route names them, its topic and partition, so
every line logged meanwhile carries them; with `--log-level debug` each request ends with a
line saying how it went. With tracing on (laminar.server.tracing) the request is served in its
server span.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from . import tracing
from .logs import REQUEST, RequestContext

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
#: A request id a client may choose (anything else is replaced by a new one).
CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
#: A partition in a path, as the handlers take it (DIGITS, at most 6 of them: laminar.server.api)
PARTITION = re.compile(r"[0-9]{1,6}")
#: A topic name longer than any valid one is cut to this in the log context.
MAX_LOGGED_TOPIC_CHARS = 255
#: A request's path is cut to this in its debug line.
MAX_LOGGED_PATH_CHARS = 200

Handler = Callable[[Any], Awaitable[web.StreamResponse]]


def request_id(client_value: str | None) -> str:
    """The id of a request whose `X-Request-Id` is `client_value` (None: it had none)."""
    if client_value is not None and CLIENT_REQUEST_ID.fullmatch(client_value):
        return client_value
    # 128 random bits in hex, as uuid4().hex looks but several times cheaper (no syscall,
    # no UUID object): an id to find a request by, not a secret (a client may choose its own)
    return random.getrandbits(128).to_bytes(16).hex()


def _context(request: web.Request, rid: str) -> RequestContext:
    match = request.match_info
    topic = match.get("topic")
    partition = match.get("partition")
    return RequestContext(
        rid,
        None if topic is None else topic[:MAX_LOGGED_TOPIC_CHARS],
        int(partition) if partition is not None and PARTITION.fullmatch(partition) else None,
    )


def _printable(text: str) -> str:
    """`text` with its control characters escaped: a decoded path (`%0A`) must not make a
    text log line of its own."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _route(request: web.Request) -> str | None:
    """The template of the request's route (`/v1/topics/{topic}`), None when none matched."""
    resource = request.match_info.route.resource
    return None if resource is None else resource.canonical


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Serve `request` with its id in the log context (and in its server span); its answer
    carries the id."""
    rid = request_id(request.headers.get(REQUEST_ID_HEADER))
    token = REQUEST.set(_context(request, rid))
    debug = log.isEnabledFor(logging.DEBUG)
    started_s = time.perf_counter() if debug else 0.0
    status: int | None = None
    try:
        if tracing.ENABLED:
            response = await tracing.serve(request, handler, _route(request), rid)
        else:
            response = await handler(request)
        status = response.status
        if not response.prepared:  # (prepared by its handler: `on_response_prepare` did it)
            response.headers[REQUEST_ID_HEADER] = rid
        return response
    except web.HTTPException as e:  # passed on by the API's middleware (not an error)
        status = e.status
        e.headers[REQUEST_ID_HEADER] = rid
        raise
    finally:
        if debug:
            log.debug(
                "%s %s: %s in %.1f ms",
                request.method,
                _printable(request.path[:MAX_LOGGED_PATH_CHARS]),
                "no answer" if status is None else status,
                (time.perf_counter() - started_s) * 1000,
            )
        REQUEST.reset(token)


async def on_response_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """aiohttp's signal before an answer's headers go out: the request id on an answer its
    handler sends itself (a WebSocket's upgrade, within the middleware: the context is the
    request's), which the middleware sees only once sent."""
    context = REQUEST.get()
    if context is not None and REQUEST_ID_HEADER not in response.headers:
        response.headers[REQUEST_ID_HEADER] = context.request_id
