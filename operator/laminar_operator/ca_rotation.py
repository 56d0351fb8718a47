"""A cluster CA and its rotation without downtime (docs/kubernetes.md, "Rotating the CA").

What the CA key Secret (`laminar-ca-<uid>`, the operator's namespace) holds is the state:

* `ca.crt`, `ca.key`: the signing CA first, then any CA still trusted; the key is the signer's;
* `next.crt`, `next.key`: a CA made for a rotation, trusted but not yet signing.

A rotation (asked for with the annotation `laminarmq.io/rotate-ca`, or due once less than a
third of the CA's lifetime is left) goes through three states, each written to the Secret
before anything is published, so an operator that restarts midway carries on:

1. ``Trusting``: a new CA is made (`next.*`). The bundle (old and new) is published in
   `<name>-ca` and `<name>-tls`; the brokers keep their certificate of the old CA. It waits
   until every alive broker reports trusting the new CA (`GET /v1/nodes/{id}/tls`), and at least
   the dwell time, which gives clients that mount `<name>-ca` the bundle too.
2. ``Retiring``: the new CA signs (`ca.crt` = new, old). The brokers get a certificate of the
   new CA; both CAs stay trusted, so every pair of brokers, and every client holding the
   bundle, verifies the other whichever certificate each has loaded. It waits until every alive
   broker serves the new certificate.
3. The old CA is dropped from `ca.crt` and from what is published: ``Idle`` again.

The functions here are pure (the handlers do the I/O): what the Secret holds, the next state,
and which brokers a step still waits for.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from laminar import certs
from laminar.client.models import NodeTls

#: Its value asks for a rotation; a new value, another (status.tls.rotateCaRequest records
#: the last one acted on).
ROTATE_ANNOTATION = "laminarmq.io/rotate-ca"
#: How long the bundle is published before any broker gets a certificate of the new CA.
DEFAULT_DWELL = datetime.timedelta(minutes=10)
IDLE, TRUSTING, RETIRING = "Idle", "Trusting", "Retiring"
CERT_KEY, KEY_KEY = "ca.crt", "ca.key"
NEXT_CERT_KEY, NEXT_KEY_KEY = "next.crt", "next.key"


def split_bundle(pem: bytes) -> tuple[bytes, ...]:
    """Each certificate of a PEM bundle, PEM-encoded (ValueError: none, or unreadable)."""
    found = x509.load_pem_x509_certificates(pem)
    return tuple(c.public_bytes(serialization.Encoding.PEM) for c in found)


@dataclass(frozen=True, slots=True)
class CaState:
    """What a cluster's CA key Secret holds."""

    signer: certs.KeyPair
    #: Every CA still trusted, the signer first (PEM each).
    trusted: tuple[bytes, ...]
    #: A rotation's new CA, not signing yet.
    next: certs.KeyPair | None = None

    @classmethod
    def new(cls, ca: certs.KeyPair) -> CaState:
        return cls(ca, (ca.cert_pem,))

    @classmethod
    def from_data(cls, data: Mapping[str, str]) -> CaState:
        """From a Secret's `data` (base64 values); ValueError if it holds no usable CA."""

        def field(key: str) -> bytes:
            return base64.b64decode(data.get(key, ""))

        trusted = split_bundle(field(CERT_KEY))
        key = field(KEY_KEY)
        if not key:
            raise ValueError(f"no {KEY_KEY}")
        following = None
        if data.get(NEXT_CERT_KEY):
            following = certs.KeyPair(split_bundle(field(NEXT_CERT_KEY))[0], field(NEXT_KEY_KEY))
        return cls(certs.KeyPair(trusted[0], key), trusted, following)

    def to_data(self) -> dict[str, str]:
        def encoded(pem: bytes) -> str:
            return base64.b64encode(pem).decode()

        data = {CERT_KEY: encoded(b"".join(self.trusted)), KEY_KEY: encoded(self.signer.key_pem)}
        if self.next is not None:
            data[NEXT_CERT_KEY] = encoded(self.next.cert_pem)
            data[NEXT_KEY_KEY] = encoded(self.next.key_pem)
        return data

    @property
    def bundle(self) -> bytes:
        """What brokers and clients trust: every CA still trusted and the next one."""
        extra = () if self.next is None else (self.next.cert_pem,)
        return b"".join((*self.trusted, *extra))

    @property
    def fingerprints(self) -> list[str]:
        """The bundle's certificates' fingerprints, in its order."""
        return [certs.fingerprint(pem) for pem in split_bundle(self.bundle)]

    @property
    def phase(self) -> str:
        if self.next is not None:
            return TRUSTING
        return RETIRING if len(self.trusted) > 1 else IDLE

    # ---- the steps --------------------------------------------------------------------------

    def begin(self, common_name: str, lifetime: datetime.timedelta = certs.CA_LIFETIME) -> CaState:
        """Idle -> Trusting: a new CA, trusted from now on."""
        return replace(self, next=certs.make_ca(common_name, lifetime))

    def promote(self) -> CaState:
        """Trusting -> Retiring: the new CA signs; the old ones stay trusted."""
        if self.next is None:
            raise ValueError("no CA to promote")
        return CaState(self.next, (self.next.cert_pem, *self.trusted), None)

    def retire(self) -> CaState:
        """Retiring -> Idle: only the signer is trusted."""
        return CaState.new(self.signer)


def rotation_reason(
    state: CaState,
    request: str | None,
    handled: str | None,
    now: datetime.datetime | None = None,
) -> str | None:
    """Why an idle CA should be rotated now (None: it should not): a new value of the
    annotation, or less than a third of the CA's lifetime left."""
    if state.phase != IDLE:
        return None
    if request and request != handled:
        return f"asked for ({ROTATE_ANNOTATION}={request[:64]})"
    ca = state.signer
    if certs.renewal_due(ca.not_before, ca.not_after, now):
        return f"the CA expires at {ca.not_after:%Y-%m-%dT%H:%M:%SZ}"
    return None


def waiting_for(
    state: CaState, reports: Iterable[NodeTls | str], certificate_fingerprint: str | None
) -> list[str]:
    """What the current step still waits for, one line per broker (empty: it may go on).
    `reports` has each alive broker's TLS state, or why it could not be read;
    `certificate_fingerprint` is the brokers' certificate the operator last issued, or None
    when it is not yet one of the signer."""
    pending = []
    phase = state.phase
    for report in reports:
        if isinstance(report, str):
            pending.append(report)
        elif not report.enabled:
            pending.append(f"{report.node_id}: TLS off")
        elif phase == TRUSTING and state.next is not None:
            if certs.fingerprint(state.next.cert_pem) not in report.trusted_cas:
                pending.append(f"{report.node_id}: does not trust the new CA yet")
        elif phase == RETIRING:
            if certificate_fingerprint is None:
                pending.append(f"{report.node_id}: no certificate of the new CA issued yet")
            elif report.fingerprint != certificate_fingerprint:
                pending.append(f"{report.node_id}: not serving the new CA's certificate yet")
    return pending
