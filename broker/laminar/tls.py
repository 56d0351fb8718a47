"""TLS for the client API and the peer transport (docs/security.md, "TLS"): the contexts, and
their reload when the certificate, key or CA files change.

A broker given `--tls-cert-file`, `--tls-key-file` and `--tls-ca-file` serves its HTTP API over
HTTPS only, and its peer transport over TLS with mutual authentication: both sides present a
certificate that the other verifies against the CA bundle (the HMAC handshake then runs inside
the TLS channel, as the cluster-membership check). TLS 1.2 or later, ECDHE with AES-GCM or
ChaCha20-Poly1305 only (TLS 1.3's suites are all of that kind).

`CertificateStore` holds the contexts made from the three files and re-reads them every
`RELOAD_INTERVAL_S` (and on `reload()`, which SIGHUP calls): when their contents changed and
they load (a certificate that does not match its key, caught halfway through a copy, is
skipped until the next look), fresh contexts replace the old ones for new connections.
Established connections keep the certificate they started with. The listening sockets keep one
context object each (asyncio takes it once): its SNI callback, which OpenSSL calls on every
ClientHello (with or without a server name), switches the connection to the current context
before the certificate is chosen, so a new handshake uses the new certificate and verifies
client certificates against the new CA bundle.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509

log = logging.getLogger(__name__)

#: How often the certificate, key and CA files are looked at for changes.
RELOAD_INTERVAL_S = 5.0
#: TLS 1.2's suites allowed (forward secret AEAD only); TLS 1.3's are all of that kind.
CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2


class TlsError(ValueError):
    """Certificate, key or CA files that cannot be used."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """A broker's certificate (chain), its key, and the CA bundle that peers' and brokers'
    certificates are verified against."""

    cert: Path
    key: Path
    ca: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        try:
            return self.cert.read_bytes(), self.key.read_bytes(), self.ca.read_bytes()
        except OSError as e:
            raise TlsError(f"cannot read {e.filename}: {e.strerror}") from e


def _harden(context: ssl.SSLContext) -> ssl.SSLContext:
    context.minimum_version = MINIMUM_VERSION
    context.set_ciphers(CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION
    return context


def client_context(
    ca_file: str | os.PathLike[str] | None = None,
    *,
    cadata: str | None = None,
    cert_file: str | os.PathLike[str] | None = None,
    key_file: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """A client's context: the server's certificate verified against `ca_file` (or `cadata`,
    PEM text; neither: the system's CAs), its host name checked; with `cert_file` and
    `key_file`, this side's certificate for servers that ask for one (mutual TLS)."""
    try:
        if ca_file is None and cadata is None:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        else:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, checks host names
            context.load_verify_locations(
                cafile=None if ca_file is None else str(ca_file), cadata=cadata
            )
        if cert_file is not None:
            context.load_cert_chain(str(cert_file), None if key_file is None else str(key_file))
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"cannot load the CA or certificate: {e}") from e
    return _harden(context)


def server_context(files: TlsFiles, *, require_client_cert: bool) -> ssl.SSLContext:
    """A server's context from `files` (TlsError if they do not load, or do not match)."""
    context = _harden(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    try:
        context.load_cert_chain(str(files.cert), str(files.key))
        if require_client_cert:
            context.load_verify_locations(cafile=str(files.ca))
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"cannot load {files.cert} / {files.key} / {files.ca}: {e}") from e
    return context


@dataclass(frozen=True, slots=True)
class _Contexts:
    api_server: ssl.SSLContext
    peer_server: ssl.SSLContext
    client: ssl.SSLContext
    digest: bytes
    not_after: float  # Unix time the certificate expires
    fingerprint: str  # SHA-256 of the certificate in use (DER), hex
    trusted: tuple[str, ...]  # the CA bundle's certificates' fingerprints, in its order


def _certificates(pem: bytes, what: str) -> list[x509.Certificate]:
    from cryptography import x509  # only brokers that run TLS need it

    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as e:
        raise TlsError(f"unreadable {what}: {e}") from e


def _fingerprint(cert: x509.Certificate) -> str:
    from cryptography.hazmat.primitives import hashes

    return cert.fingerprint(hashes.SHA256()).hex()


def _load(files: TlsFiles) -> _Contexts:
    cert, key, ca = files.read()
    if not ca.strip():
        raise TlsError(f"the CA file {files.ca} is empty")
    leaf = _certificates(cert, "certificate")[0]
    return _Contexts(
        api_server=server_context(files, require_client_cert=False),
        peer_server=server_context(files, require_client_cert=True),
        client=client_context(files.ca, cert_file=files.cert, key_file=files.key),
        digest=hashlib.sha256(cert + b"\0" + key + b"\0" + ca).digest(),
        not_after=leaf.not_valid_after_utc.timestamp(),
        fingerprint=_fingerprint(leaf),
        trusted=tuple(_fingerprint(c) for c in _certificates(ca, "CA bundle")),
    )


class CertificateStore:
    """The broker's TLS contexts, reloaded when their files change (see the module doc)."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._current = _load(files)  # TlsError at start: the broker does not start
        #: How many times new files were loaded since start.
        self.reloads = 0
        #: The last reload's error ("" when the files in use are the newest that loaded).
        self.error = ""
        self._api_listener = self._listening(self._current.api_server, "api_server")
        self._peer_listener = self._listening(self._current.peer_server, "peer_server")
        self._task: asyncio.Task[None] | None = None

    def _listening(self, base: ssl.SSLContext, which: str) -> ssl.SSLContext:
        """A context for a listening socket whose connections switch to the current one."""
        context = server_context(self.files, require_client_cert=base.verify_mode != 0)

        def switch(connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _: object) -> None:
            connection.context = getattr(self._current, which)

        context.sni_callback = switch
        return context

    # ---- what the servers and clients use ---------------------------------------------------

    @property
    def api_listener(self) -> ssl.SSLContext:
        """For the HTTPS API's listening socket (no client certificate asked for)."""
        return self._api_listener

    @property
    def peer_listener(self) -> ssl.SSLContext:
        """For the peer transport's listening socket (a client certificate required)."""
        return self._peer_listener

    @property
    def not_after(self) -> float:
        """When the certificate in use expires (Unix time)."""
        return self._current.not_after

    @property
    def fingerprint(self) -> str:
        """The certificate in use: SHA-256 of its DER encoding, hex."""
        return self._current.fingerprint

    @property
    def trusted(self) -> tuple[str, ...]:
        """The fingerprints of the CA certificates peers' certificates are verified against."""
        return self._current.trusted

    def client(self) -> ssl.SSLContext:
        """For connections this broker opens (peers: mutual TLS; other brokers' API): the
        current CA bundle and certificate. Ask again for each new connection."""
        return self._current.client

    # ---- reloading --------------------------------------------------------------------------

    def reload(self) -> bool:
        """Re-read the files; True if new ones were loaded. Errors are logged and kept in
        `error`: the contexts in use stay."""
        try:
            cert, key, ca = self.files.read()
            digest = hashlib.sha256(cert + b"\0" + key + b"\0" + ca).digest()
            if digest == self._current.digest:
                return False
            loaded = _load(self.files)
        except TlsError as e:
            if str(e) != self.error:
                log.warning("TLS files not reloaded (the previous ones stay in use): %s", e)
            self.error = str(e)
            return False
        self._current = loaded
        self.reloads += 1
        self.error = ""
        log.info("TLS certificate, key and CA reloaded from %s", self.files.cert.parent)
        return True

    def start(self, interval_s: float = RELOAD_INTERVAL_S) -> None:
        """Look at the files every `interval_s` (until `stop`)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch(interval_s))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            self.reload()
