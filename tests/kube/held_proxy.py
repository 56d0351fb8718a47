"""A TCP forwarder in front of one broker that can hold what clients send, as a stalled
network would, so that a test knows a call is in flight while it acts (TLS passes through it
untouched: it forwards bytes)."""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit

BUFFER_BYTES = 65536


class HeldProxy:
    """Listens on the broker's own address (another port: the broker's certificate names the
    address), forwards every connection to the broker, and, between `hold()` and `release()`,
    keeps the bytes clients send until the release (`arrived` is set when some came)."""

    def __init__(self, broker_url: str) -> None:
        parts = urlsplit(broker_url)
        assert parts.hostname is not None and parts.port is not None
        self._scheme = parts.scheme
        self._target = (parts.hostname, parts.port)
        self._listener = socket.create_server((parts.hostname, 0))
        self._released = threading.Event()
        self._released.set()
        #: set once a client sent bytes while held
        self.arrived = threading.Event()
        self._closed = False
        self._sockets: list[socket.socket] = [self._listener]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="held-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"{self._scheme}://{host}:{port}"

    def hold(self) -> None:
        self.arrived.clear()
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self._closed = True
        self._released.set()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _keep(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                broker = socket.create_connection(self._target)
            except OSError:
                client.close()
                continue
            self._keep(client)
            self._keep(broker)
            threading.Thread(target=self._pump, args=(client, broker, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(broker, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, held: bool) -> None:
        try:
            while data := source.recv(BUFFER_BYTES):
                if held and not self._released.is_set():
                    self.arrived.set()
                    self._released.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)
