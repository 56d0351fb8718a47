"""The XDP router on a real kernel: a veth pair between two namespaces the test made, the
program loaded on the receiving end by `laminar-xdp`, traffic of every class sent across, and
what reached the receiver's sockets compared with what the counters say."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from laminar import xdp
from laminar.server import steering
from laminar.swim.codec import HEADER_BYTES
from laminar.xdp import CLASSES

from ..netns import Host, veth_pair
from ..privileges import in_a_child_as
from .conftest import bpffs, gossip_datagram, laminar_xdp, send_udp

GOSSIP, API, PEER, OTHER_UDP, OTHER_TCP = 7072, 7070, 7071, 9999, 8080
ETH_IPV4_UDP_BYTES = 14 + 20 + 8
CLUSTER = "prod.demo"

RECEIVER = """
import json, socket, sys
socks = {}
for port in map(int, sys.argv[1:]):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    s.setblocking(False)
    socks[port] = s
print("ready", flush=True)
sys.stdin.readline()
got = []
for port, s in socks.items():
    while True:
        try:
            got.append([port, s.recv(65535).hex()])
        except BlockingIOError:
            break
print(json.dumps(got), flush=True)
"""


class Listening:
    """UDP sockets bound in the receiver's namespace; `received()` is what reached them."""

    def __init__(self, host: Host, *ports: int) -> None:
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, sys.executable, "-c", RECEIVER, *map(str, ports)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "ready"

    def received(self) -> list[tuple[int, bytes]]:
        out, _ = self.process.communicate("done\n", timeout=30)
        return [(port, bytes.fromhex(data)) for port, data in json.loads(out)]


def connect(host: Host, address: str, port: int) -> str:
    """One TCP SYN (nothing listens: the receiver answers with a reset)."""
    script = (
        "import socket, sys\n"
        "try:\n"
        "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
        "except OSError as e:\n"
        "    print(type(e).__name__)\n"
    )
    return host.run(sys.executable, "-c", script, address, str(port)).stdout.strip()


@pytest.fixture()
def wire(router_object: Path, tmp_path: Path) -> Iterator[tuple[Host, Host, Path]]:
    with veth_pair() as (sender, receiver), bpffs(tmp_path / "bpf") as fs:
        pins = fs / "laminar"
        out = laminar_xdp(
            receiver, pins, "load", "--iface", receiver.iface, "--object", str(router_object),
            "--cluster-id", CLUSTER, "--gossip-port", str(GOSSIP), "--api-port", str(API),
            "--peer-port", str(PEER),
        )  # fmt: skip
        assert f"attached to {receiver.iface}" in out
        yield sender, receiver, pins


def stats(receiver: Host, pins: Path) -> dict[str, dict[str, int]]:
    shown: dict[str, dict[str, int]] = json.loads(laminar_xdp(receiver, pins, "stats"))
    return shown


def test_foreign_gossip_is_dropped_in_the_kernel_and_every_class_is_counted(
    wire: tuple[Host, Host, Path],
) -> None:
    sender, receiver, pins = wire
    ours = gossip_datagram(CLUSTER)
    theirs = gossip_datagram("someone.else")
    garbage = b"GET / HTTP/1.1\r\n\r\n"
    short = ours[: HEADER_BYTES - 1]  # magic and most of the hash, but not all of it
    other = b"not for laminar"
    listening = Listening(receiver, GOSSIP, OTHER_UDP)
    for payload in (ours, theirs, garbage, short):
        send_udp(sender, receiver.address, GOSSIP, payload)
    send_udp(sender, receiver.address, OTHER_UDP, other)
    for port in (API, PEER, OTHER_TCP):
        assert connect(sender, receiver.address, port) == "ConnectionRefusedError"

    assert sorted(listening.received()) == [(GOSSIP, ours), (OTHER_UDP, other)]
    counted = stats(receiver, pins)
    gossip_bytes = sum(ETH_IPV4_UDP_BYTES + len(p) for p in (ours, theirs, garbage, short))
    assert counted["membership"] == {"packets": 4, "bytes": gossip_bytes, "drops": 3}
    for name in ("api", "peer"):
        assert counted[name]["packets"] == 1 and counted[name]["drops"] == 0, counted
    assert counted["other"]["packets"] == 2 and counted["other"]["drops"] == 0, counted
    syn_bytes = counted["api"]["bytes"]
    assert syn_bytes > 14 + 20 + 20  # a SYN with options
    assert counted["other"]["bytes"] == ETH_IPV4_UDP_BYTES + len(other) + syn_bytes


def test_loading_twice_replaces_and_unloading_lets_everything_through(
    wire: tuple[Host, Host, Path], router_object: Path
) -> None:
    sender, receiver, pins = wire
    send_udp(sender, receiver.address, GOSSIP, b"garbage")
    assert stats(receiver, pins)["membership"]["drops"] == 1
    said = laminar_xdp(receiver, pins, "load", "--iface", receiver.iface,
                       "--object", str(router_object), "--cluster-id", CLUSTER,
                       "--steer-workers", "2")  # fmt: skip
    assert "steer port's program pinned for 2 workers" in said
    shown = receiver.run("ip", "link", "show", receiver.iface).stdout
    assert shown.count("prog/xdp") == 1
    assert stats(receiver, pins)["membership"]["drops"] == 0  # a fresh program and maps

    laminar_xdp(receiver, pins, "unload", "--iface", receiver.iface)
    assert not (pins / steering.PINNED_PROGRAM).exists()
    assert not (pins / steering.PINNED_MAP).exists()
    assert laminar_xdp(receiver, pins, "stats").strip() == "{}"
    assert "xdp" not in receiver.run("ip", "link", "show", receiver.iface).stdout
    laminar_xdp(receiver, pins, "unload", "--iface", receiver.iface)  # nothing loaded: fine
    listening = Listening(receiver, GOSSIP)
    send_udp(sender, receiver.address, GOSSIP, b"garbage")
    assert listening.received() == [(GOSSIP, b"garbage")]


def test_bad_configuration_is_refused_and_changes_nothing(
    wire: tuple[Host, Host, Path], router_object: Path, tmp_path: Path
) -> None:
    _, receiver, pins = wire
    before = receiver.run("ip", "link", "show", receiver.iface).stdout
    config = tmp_path / "xdp.json"
    for content, message in [
        ('{"cluster_id": "a", "gossip_port": 70000}', "gossip_port must be 1..65535"),
        ('{"gossip_port": 7072}', "cluster_id is required"),
        ('{"cluster_id": "a", "colour": "blue"}', "unknown keys ['colour']"),
        ("[1, 2", "cannot read the config"),
    ]:
        config.write_text(content)
        failed = receiver.run(
            sys.executable, "-m", "laminar.xdp", "--pin-dir", str(pins), "load",
            "--iface", receiver.iface, "--object", str(router_object), "--config", str(config),
            check=False,
        )  # fmt: skip
        assert failed.returncode == 1 and message in failed.stderr, failed.stderr
    missing = receiver.run(
        sys.executable, "-m", "laminar.xdp", "--pin-dir", str(pins), "load",
        "--iface", "no-such-if", "--object", str(router_object), check=False,
    )  # fmt: skip
    assert missing.returncode == 1 and "no interface 'no-such-if'" in missing.stderr
    assert receiver.run("ip", "link", "show", receiver.iface).stdout == before
    assert stats(receiver, pins)["membership"]["packets"] == 0


def test_the_unprivileged_broker_may_read_the_counters_and_nothing_else(
    router_object: Path,
) -> None:
    if tuple(int(x) for x in os.uname().release.split(".")[:2]) < (6, 5):
        pytest.skip("before Linux 6.5 reading a pinned map needs CAP_BPF")
    with tempfile.TemporaryDirectory() as tmp, veth_pair() as (sender, receiver):
        Path(tmp).chmod(0o755)  # the broker's uid must reach the pins
        with bpffs(Path(tmp) / "bpf") as fs:
            pins = fs / "laminar"
            laminar_xdp(receiver, pins, "load", "--iface", receiver.iface,
                        "--object", str(router_object), "--cluster-id", CLUSTER,
                        "--steer-workers", "2", "--steer-owner", "10001")  # fmt: skip
            send_udp(sender, receiver.address, GOSSIP, b"garbage")
            counted = in_a_child_as(10001, lambda: xdp.stats(pins))
            assert isinstance(counted, dict), counted  # (else: what the child raised)
            garbage_bytes = ETH_IPV4_UDP_BYTES + len(b"garbage")
            assert counted["membership"] == {"packets": 1, "bytes": garbage_bytes, "drops": 1}
            assert oct((pins / "config").stat().st_mode & 0o777) == "0o600"
            assert oct((pins / "prog").stat().st_mode & 0o777) == "0o600"
            # the steer port's program and map are the broker's (tests/server/test_steering.py
            # attaches them as that uid)
            for name in (steering.PINNED_PROGRAM, steering.PINNED_MAP):
                status = (pins / name).stat()
                assert (status.st_uid, oct(status.st_mode & 0o777)) == (10001, "0o600")


# ---- frames built by hand (AF_PACKET): VLAN tags, IPv6, fragments, truncation ------------

SEND_FRAMES = """
import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
for frame in sys.argv[2:]:
    s.send(bytes.fromhex(frame))
"""


def mac_of(host: Host) -> bytes:
    text = host.run("cat", f"/sys/class/net/{host.iface}/address").stdout.strip()
    return bytes.fromhex(text.replace(":", ""))


def ipv4(protocol: int, payload: bytes, fragment_offset: int = 0) -> bytes:
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 1, fragment_offset, 64, protocol, 0,
        bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]),
    )  # fmt: skip
    return header + payload


def ipv6(next_header: int, payload: bytes) -> bytes:
    addresses = bytes(15) + b"\x01" + bytes(15) + b"\x02"  # ::1 -> ::2
    return struct.pack("!IHBB", 6 << 28, len(payload), next_header, 64) + addresses + payload


def udp(port: int, payload: bytes) -> bytes:
    return struct.pack("!HHHH", 40000, port, 8 + len(payload), 0) + payload


def tcp_syn(port: int) -> bytes:
    return struct.pack("!HHIIBBHHH", 40000, port, 1, 0, 5 << 4, 0x02, 65535, 0, 0)


def test_vlan_tags_ipv6_fragments_and_truncation(wire: tuple[Host, Host, Path]) -> None:
    sender, receiver, pins = wire

    def frame(ethertype: int, body: bytes, tags: tuple[tuple[int, int], ...] = ()) -> bytes:
        header = mac_of(receiver) + mac_of(sender)
        for tpid, vid in tags:
            header += struct.pack("!HH", tpid, vid)
        return header + struct.pack("!H", ethertype) + body

    ip4, ip6, dot1q, dot1ad = 0x0800, 0x86DD, 0x8100, 0x88A8
    ours, theirs = gossip_datagram(CLUSTER), gossip_datagram("someone.else")
    frames = {
        # (class, dropped)
        ("membership", False): [frame(ip4, ipv4(17, udp(GOSSIP, ours)), ((dot1q, 10),))],
        ("membership", True): [
            frame(ip4, ipv4(17, udp(GOSSIP, theirs)), ((dot1ad, 20), (dot1q, 10))),  # QinQ
            frame(ip6, ipv6(17, udp(GOSSIP, theirs))),
        ],
        ("peer", False): [frame(ip6, ipv6(6, tcp_syn(PEER)))],
        ("api", False): [frame(ip6, ipv6(6, tcp_syn(API)), ((dot1q, 10),))],
        ("other", False): [
            # a non-first fragment: no UDP header where one would be
            frame(ip4, ipv4(17, udp(GOSSIP, theirs), fragment_offset=100)),
            # three tags: more than the router looks through
            frame(ip4, ipv4(17, udp(GOSSIP, theirs)), ((dot1q, 1), (dot1q, 2), (dot1q, 3))),
            # an IPv4 header cut short
            frame(ip4, ipv4(17, udp(GOSSIP, theirs))[:10]),
        ],
    }
    every = [f for group in frames.values() for f in group]
    sender.run(sys.executable, "-c", SEND_FRAMES, sender.iface, *(f.hex() for f in every))

    counted = stats(receiver, pins)
    for name in CLASSES:
        sent = [(f, dropped) for (c, dropped), group in frames.items() if c == name for f in group]
        assert counted[name] == {
            "packets": len(sent),
            "bytes": sum(len(f) for f, _ in sent),
            "drops": sum(1 for _, dropped in sent if dropped),
        }, (name, counted)
