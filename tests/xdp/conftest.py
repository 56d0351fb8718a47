"""The XDP router under test: compiled from broker/xdp/router.c once per session, loaded by
`laminar-xdp` onto a veth in a namespace the test made (tests/netns.py), maps pinned in a
bpffs the test mounts itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from laminar.swim.codec import Codec, Stamp
from laminar.swim.messages import Ack

from ..netns import Host

ROOT = Path(__file__).resolve().parents[2]
#: A cluster secret as `laminar secret` makes one (base64 of 32 random bytes).
SECRET = b"6v3cLq0eRjYb1W9kT2uXhN8pF4sA7mZdG5oIyHwQ1VE="


@pytest.fixture(scope="session")
def router_object(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.geteuid() != 0:
        pytest.skip("loading BPF programs needs root (or CAP_BPF and CAP_NET_ADMIN)")
    missing = [tool for tool in ("clang", "bpftool") if shutil.which(tool) is None]
    if missing or not Path("/usr/include/bpf/bpf_helpers.h").exists():
        pytest.skip(f"compiling the router needs clang, bpftool and libbpf-dev (.ci/run installs "
                    f"them); missing: {missing or ['libbpf-dev']}")  # fmt: skip
    work = tmp_path_factory.mktemp("xdp")
    out = work / "router.o"
    subprocess.run([str(ROOT / "broker" / "xdp" / "build.sh"), str(out)], check=True)
    with bpffs(work / "probe") as fs:  # root, but is BPF allowed here (a container, LSMs)?
        probe = subprocess.run(
            ["bpftool", "prog", "load", str(out), str(fs / "prog"), "type", "xdp"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    if probe.returncode != 0 and "not permitted" in probe.stderr.lower():
        pytest.skip(f"BPF is not permitted here: {probe.stderr.strip()[-200:]}")
    assert probe.returncode == 0, probe.stderr
    return out


@contextmanager
def bpffs(path: Path) -> Iterator[Path]:
    """A bpffs of the test's own (pins vanish with it)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "bpf", "bpf", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def gossip_datagram(cluster_id: str) -> bytes:
    """A real, sealed SWIM datagram of `cluster_id` (an ack)."""
    codec = Codec(cluster_id, SECRET, 1400, sender="10.0.0.1:7072")
    return codec.encode(Ack(seq=1), stamp=Stamp(time.time_ns() // 1_000_000, 1))


def send_udp(host: Host, address: str, port: int, payload: bytes) -> None:
    script = (
        "import socket, sys; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
        "s.sendto(bytes.fromhex(sys.argv[1]), (sys.argv[2], int(sys.argv[3])))"
    )
    host.run(sys.executable, "-c", script, payload.hex(), address, str(port))


def laminar_xdp(host: Host, pins: Path, *args: str, check: bool = True) -> str:
    return host.run(
        sys.executable, "-m", "laminar.xdp", "--pin-dir", str(pins), *args, check=check
    ).stdout
