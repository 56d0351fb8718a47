"""Certificate authorities and certificates for Laminar's TLS (docs/security.md, "TLS"), made
with `cryptography`: `laminar local-cluster` makes a CA and one certificate per broker, the
operator a CA per LaminarCluster and the brokers' certificate, renewed before it expires.

Keys are ECDSA P-256; certificates are X.509 v3, PEM-encoded. A broker's certificate serves
both ends of TLS (extended key usage serverAuth and clientAuth): the HTTPS API and both sides
of the peer transport's mutual TLS.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_LIFETIME = datetime.timedelta(days=3650)
CERT_LIFETIME = datetime.timedelta(days=90)
#: A certificate's validity starts this much before it is made (clocks differ a little).
BACKDATE = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate and its private key, PEM-encoded."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def not_after(self) -> datetime.datetime:
        return self.certificate.not_valid_after_utc

    @property
    def not_before(self) -> datetime.datetime:
        return self.certificate.not_valid_before_utc


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_ca(common_name: str, lifetime: datetime.timedelta = CA_LIFETIME) -> KeyPair:
    """A new self-signed CA (may sign certificates, not other CAs)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])
    now = _now()
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(signs_certificates=True),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Digital signatures (ECDHE with ECDSA), and for a CA certificates and CRLs too."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _san(names: Iterable[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def issue(
    ca: KeyPair,
    common_name: str,
    names: Iterable[str],
    lifetime: datetime.timedelta = CERT_LIFETIME,
) -> KeyPair:
    """A new key and a certificate for it signed by `ca`, valid for `names` (DNS names,
    wildcards such as `*.svc.example` included, and IP addresses), for servers and clients."""
    ca_cert = ca.certificate
    ca_key = serialization.load_pem_private_key(ca.key_pem, None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an ECDSA key")
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    not_after = min(now + lifetime, ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - min(BACKDATE, lifetime / 10))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san(names), critical=False)
        .add_extension(
            _key_usage(signs_certificates=False),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def renewal_due(
    not_before: datetime.datetime,
    not_after: datetime.datetime,
    now: datetime.datetime | None = None,
) -> bool:
    """Whether a certificate valid from `not_before` to `not_after` should be renewed: less
    than a third of its lifetime is left."""
    now = now or datetime.datetime.now(datetime.UTC)
    return (not_after - now) < (not_after - not_before) / 3


def fingerprint(cert_pem: bytes) -> str:
    """SHA-256 of the certificate (DER), hex."""
    return x509.load_pem_x509_certificate(cert_pem).fingerprint(hashes.SHA256()).hex()


def names_of(cert_pem: bytes) -> list[str]:
    """The DNS names and IP addresses a certificate is valid for."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    addresses = san.get_values_for_type(x509.IPAddress)
    return [*san.get_values_for_type(x509.DNSName), *map(str, addresses)]
