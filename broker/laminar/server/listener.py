"""Listening sockets for TLS servers that admit a connection before any TLS work is done
(docs/security.md, "Limits on unauthenticated connections"): the peer transport and the
HTTPS API.

With `create_server(ssl=...)` a connection reaches the server's protocol only once its TLS
handshake is over, so bounds on connections per source address could only apply after it: a
flood of TCP connections that never send a ClientHello would be held, unbounded in number,
until the handshake timeout. `Listener` hands each accepted socket to its server at once,
with the peer's address; the server counts it against its bounds (or closes it there and
then) and only then runs the TLS handshake on it with `AcceptedSocket.start_tls`
(`loop.connect_accepted_socket`, within a short bound). Nothing reads the socket in between,
so no byte of the ClientHello can be lost (as it would be if a plain protocol were upgraded
with `loop.start_tls`: uvloop starts reading as soon as `connection_made` returns).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: Accepting pauses this long when the process is out of file descriptors or memory.
ACCEPT_RETRY_DELAY_S = 1.0
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

#: Called with each accepted socket (non-blocking) and the peer's address; it owns the socket.
OnAccept = Callable[[socket.socket, Any], None]


class AcceptedSocket:
    """An accepted TCP connection not handed to asyncio yet. `start_tls` hands it over;
    `close` closes it if that never happened (call it when the server is done with it)."""

    __slots__ = ("_sock",)

    def __init__(self, sock: socket.socket) -> None:
        self._sock: socket.socket | None = sock

    async def start_tls(
        self, protocol: asyncio.BaseProtocol, context: ssl.SSLContext, timeout_s: float
    ) -> asyncio.BaseTransport:
        """Run the TLS handshake as the server, within `timeout_s`; then `protocol` gets the
        TLS transport (`connection_made`), as from `create_server(ssl=context)`. Raises
        OSError (ssl.SSLError: the handshake failed; ConnectionError: the peer went away or
        it timed out) or CancelledError; the connection is closed then."""
        sock, self._sock = self._sock, None
        if sock is None:
            raise ConnectionAbortedError("closed before its TLS handshake")
        # From here the transport owns the socket (made before the first suspension).
        transport, _ = await asyncio.get_running_loop().connect_accepted_socket(
            lambda: protocol, sock, ssl=context, ssl_handshake_timeout=timeout_s
        )
        return transport

    def close(self) -> bool:
        """Close the socket unless `start_tls` took it; True if this closed it."""
        sock, self._sock = self._sock, None
        if sock is None:
            return False
        sock.close()
        return True


class Listener(asyncio.AbstractServer):
    """Listening TCP sockets whose connections go to `on_accept` as accepted sockets (at most
    a backlog's worth per wake-up, as asyncio's own servers do). Stands in for the
    `asyncio.Server` of `create_server` where the servers use one (`sockets`, `close`,
    `wait_closed`)."""

    def __init__(self, on_accept: OnAccept) -> None:
        self._on_accept = on_accept
        self._sockets: list[socket.socket] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._backlog = 100
        self._serving = False
        self._retry: asyncio.TimerHandle | None = None

    async def start(self, host: str | None, port: int, *, backlog: int) -> None:
        """Listen on every address `host` resolves to (None or "": all interfaces), port
        `port` (0: an ephemeral one), with SO_REUSEADDR, as `create_server` does."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        try:
            for family, kind, proto, _, address in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                self._sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(address)
                sock.listen(backlog)
                sock.setblocking(False)
        except OSError:
            self.close()
            raise
        self._loop = loop
        self._backlog = backlog
        self._serving = True
        self._watch()

    def adopt(self, sock: socket.socket, *, backlog: int) -> None:
        """Accept on `sock`, a socket already listening (inherited, as a worker's socket of
        the steer port)."""
        sock.setblocking(False)
        self._sockets.append(sock)
        self._loop = asyncio.get_running_loop()
        self._backlog = backlog
        self._serving = True
        self._watch()

    def _watch(self) -> None:
        self._retry = None
        if self._serving and self._loop is not None:
            for sock in self._sockets:
                self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(self._backlog):
            try:
                sock, address = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno not in _OUT_OF_RESOURCES:
                    continue  # that connection is gone already (ECONNABORTED, ...)
                log.error(
                    "cannot accept connections on %s (%s); retrying in %g s",
                    listening.getsockname(),
                    e,
                    ACCEPT_RETRY_DELAY_S,
                )
                assert self._loop is not None
                for each in self._sockets:
                    self._loop.remove_reader(each.fileno())
                self._retry = self._loop.call_later(ACCEPT_RETRY_DELAY_S, self._watch)
                return
            try:
                sock.setblocking(False)
                self._on_accept(sock, address)
            except Exception:
                log.exception("accepting a connection from %s failed", address)
                sock.close()

    # ---- what asyncio.Server offers that the servers use ----------------------------------

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self._sockets)

    def close(self) -> None:
        """Stop accepting and close the listening sockets (accepted connections stay)."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._serving and self._loop is not None:
            for sock in self._sockets:
                self._loop.remove_reader(sock.fileno())
        self._serving = False
        for sock in self._sockets:
            sock.close()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the listener is not started")
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    async def start_serving(self) -> None:
        """Serving starts with `start`."""

    async def serve_forever(self) -> None:
        raise NotImplementedError("a Listener serves from `start` until `close`")

    async def wait_closed(self) -> None:
        """`close` is immediate."""
