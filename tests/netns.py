"""Two network namespaces joined by a veth pair, made (and removed) by the test itself: a
small two-host network for the XDP router and the images. Addresses are 10.x.y.1 / .2 with
random x, y; the neighbours are static and IPv6 is off, so that the only packets on the wire
are the ones a test sends."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Host:
    netns: str
    iface: str
    address: str

    def run(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, *command],
            capture_output=True, text=True, check=check, timeout=60,
        )  # fmt: skip


def skip_unless_netns() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


@contextmanager
def veth_pair() -> Iterator[tuple[Host, Host]]:
    skip_unless_netns()
    tag = secrets.token_hex(3)
    subnet = f"10.{secrets.randbelow(200) + 20}.{secrets.randbelow(250) + 1}"
    a = Host(f"lmq-{tag}-a", f"lmq{tag}a", f"{subnet}.1")
    b = Host(f"lmq-{tag}-b", f"lmq{tag}b", f"{subnet}.2")
    made: list[str] = []
    try:
        for host in (a, b):
            _ip("netns", "add", host.netns)
            made.append(host.netns)
        _ip("link", "add", a.iface, "netns", a.netns, "type", "veth",
            "peer", "name", b.iface, "netns", b.netns)  # fmt: skip
        macs = {}
        for host in (a, b):
            ns = ("-n", host.netns)
            _ip(*ns, "addr", "add", f"{host.address}/24", "dev", host.iface)
            host.run("sysctl", "-q", "-w", f"net.ipv6.conf.{host.iface}.disable_ipv6=1")
            _ip(*ns, "link", "set", "lo", "up")
            _ip(*ns, "link", "set", host.iface, "up")
            macs[host] = _ip(*ns, "-br", "link", "show", host.iface).split()[2]
        for host, peer in ((a, b), (b, a)):
            _ip("-n", host.netns, "neigh", "replace", peer.address, "lladdr", macs[peer],
                "dev", host.iface, "nud", "permanent")  # fmt: skip
        yield a, b
    finally:
        for netns in made:
            subprocess.run(["ip", "netns", "delete", netns], check=False)
