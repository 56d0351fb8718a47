"""`host:port` addresses: formatting, parsing and comparing them, without any I/O.

The core uses `sender_matches` to check that a datagram came from the gossip address its
sender declares under the MAC (docs/security.md, "Peer traffic"); host names are looked up
through a function its driver gives it, so the core itself never resolves anything.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

#: Does host name `host` resolve to IP address `ip` (as far as the driver knows now)? True,
#: False, or None when it does not know yet.
HostCheck = Callable[[str, str], bool | None]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def format_address(host: str, port: int) -> str:
    """ "host:port", with IPv6 literals in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(address: str) -> tuple[str, int]:
    """The inverse of `format_address`; raises ValueError on anything else."""
    if address.startswith("["):
        host, sep, port = address[1:].partition("]:")
    else:
        host, sep, port = address.rpartition(":")
    if not sep or not host or not _ascii_digits(port) or not 0 < int(port) < 65_536:
        raise ValueError(f"not a host:port address: {address!r}")
    return host, int(port)


def ip_of(host: str) -> IPAddress | None:
    """`host` as an IP address (an IPv4-mapped IPv6 one as IPv4, a zone id dropped), or None
    if it is not an IP literal."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def sender_matches(declared: str, source: str, check_host: HostCheck | None) -> bool | None:
    """Whether a datagram that arrived from `source` (the UDP source "ip:port") may come from
    the member whose gossip address is `declared`: same port, and the same IP address, or
    (for a declared host name) an address `check_host` says the name resolves to. None when
    that cannot be told yet (a name the driver has not resolved)."""
    if declared == source:
        return True
    try:
        declared_host, declared_port = parse_address(declared)
        source_host, source_port = parse_address(source)
    except ValueError:
        return False
    source_ip = ip_of(source_host)
    if declared_port != source_port or source_ip is None:
        return False
    declared_ip = ip_of(declared_host)
    if declared_ip is not None:
        return declared_ip == source_ip
    if check_host is None:
        return False
    return check_host(declared_host.lower().rstrip("."), str(source_ip))


def _ascii_digits(text: str) -> bool:
    """ASCII digits only (str.isdigit also takes "²" or "٣", which int() refuses or reads)."""
    return text.isascii() and text.isdigit()


def source_key(host: str) -> str:
    """What a broker bounds per client (API connections, pending peer handshakes): an IPv4
    address, or the /64 of an IPv6 one (one machine commonly has a whole /64); an
    IPv4-mapped IPv6 address counts as IPv4."""
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)
