"""The test's own network: one namespace per broker and one for the clients, joined by a bridge
that lives in a namespace of its own, and nftables partitions inside the broker namespaces.

Nothing is added to the root namespace: each veth pair is created with both ends placed
straight into namespaces made here, so the only addresses in play (10.x.y.0/24 with random
x, y) exist only inside them. Partitions are `drop` rules keyed by peer address in a table of
the broker's own namespace; healing flushes them.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field

CLIENT = "client"
BRIDGE = "br0"
NFT_TABLE = "lmqf"
CLONE_NEWNET = 0x40000000
COMMAND_TIMEOUT_S = 30.0
#: the client's address in the subnet; broker i (1-based) is at 10 + i
CLIENT_HOST_BYTE = 2


class NetError(RuntimeError):
    pass


def missing_tools() -> str | None:
    """Why this machine cannot build the network (None: it can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (Debian: iproute2, nftables)"
    return None


def run(*command: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        list(command), input=stdin, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    if result.returncode != 0:
        raise NetError(f"{' '.join(command)}: {result.stderr.strip() or result.returncode}")
    return result.stdout


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    address: str

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]


@dataclass
class Network:
    """`names` hosts (brokers) and the client, each in its own namespace, on one bridge."""

    names: list[str]
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    hosts: dict[str, Host] = field(default_factory=dict)
    bridge_netns: str = ""
    _made: list[str] = field(default_factory=list)
    #: (from, to) host names whose packets are dropped now
    blocked: set[tuple[str, str]] = field(default_factory=set)

    @property
    def prefix(self) -> str:
        return f"lmqf-{self.tag}"

    def up(self) -> None:
        # a subnet drawn apart from the seeded run: two runs at once must not share addresses,
        # and addresses never leave the namespaces anyway
        subnet = f"10.{secrets.randbelow(200) + 20}.{secrets.randbelow(250) + 1}"
        self.bridge_netns = f"{self.prefix}-br"
        self._add_netns(self.bridge_netns)
        br = ("ip", "-n", self.bridge_netns)
        run(*br, "link", "add", BRIDGE, "type", "bridge")
        run(*br, "link", "set", BRIDGE, "up")
        self._sysctl(self.bridge_netns, "net.ipv6.conf.all.disable_ipv6=1")
        members = [(CLIENT, CLIENT_HOST_BYTE)] + [(n, 10 + i) for i, n in enumerate(self.names, 1)]
        for name, host_byte in members:
            host = Host(name, f"{self.prefix}-{name}", f"{subnet}.{host_byte}")
            self._add_netns(host.netns)
            self._sysctl(host.netns, "net.ipv6.conf.all.disable_ipv6=1")
            outer = f"v{host_byte}"
            run("ip", "link", "add", "eth0", "netns", host.netns, "type", "veth",
                "peer", "name", outer, "netns", self.bridge_netns)  # fmt: skip
            run(*br, "link", "set", outer, "master", BRIDGE)
            run(*br, "link", "set", outer, "up")
            ns = ("ip", "-n", host.netns)
            run(*ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            run(*ns, "link", "set", "lo", "up")
            run(*ns, "link", "set", "eth0", "up")
            self.hosts[name] = host
        for name in self.names:
            self._nft(
                name,
                f"table inet {NFT_TABLE} {{\n"
                "  chain input { type filter hook input priority 0; policy accept; }\n"
                "  chain output { type filter hook output priority 0; policy accept; }\n"
                "}\n",
            )

    def down(self) -> None:
        """Remove every namespace made (its interfaces and rules go with it)."""
        for netns in reversed(self._made):
            subprocess.run(["ip", "netns", "delete", netns], capture_output=True, check=False)
        self._made.clear()

    def _add_netns(self, netns: str) -> None:
        run("ip", "netns", "add", netns)
        self._made.append(netns)

    def _sysctl(self, netns: str, setting: str) -> None:
        run("ip", "netns", "exec", netns, "sysctl", "-q", "-w", setting)

    def _nft(self, name: str, script: str) -> None:
        run(*self.hosts[name].exec_prefix(), "nft", "-f", "-", stdin=script)

    # ---- partitions ---------------------------------------------------------------------

    def block(self, source: str, target: str) -> None:
        """Drop every packet from `source` to `target` (one direction), in both namespaces:
        on the way out of the source and on the way into the target."""
        if (source, target) in self.blocked:
            return
        s, t = self.hosts[source], self.hosts[target]
        self._nft(source, f"add rule inet {NFT_TABLE} output ip daddr {t.address} drop\n")
        self._nft(target, f"add rule inet {NFT_TABLE} input ip saddr {s.address} drop\n")
        self.blocked.add((source, target))

    def cut(self, a: str, b: str) -> None:
        """No packet between `a` and `b`, either way."""
        self.block(a, b)
        self.block(b, a)

    def heal(self) -> None:
        """Every link works again."""
        for name in self.names:
            self._nft(
                name,
                f"flush chain inet {NFT_TABLE} input\nflush chain inet {NFT_TABLE} output\n",
            )
        self.blocked.clear()

    def rules(self, name: str) -> str:
        return run(*self.hosts[name].exec_prefix(), "nft", "list", "table", "inet", NFT_TABLE)


def enter_netns(netns: str) -> None:
    """Move this process (it must not have started threads) into `netns`: every socket it
    opens from now on lives there."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise NetError(f"setns({netns}): {os.strerror(errno)}")
    finally:
        os.close(fd)
