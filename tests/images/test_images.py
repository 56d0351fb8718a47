"""The broker and operator images (Dockerfile.broker, Dockerfile.operator), built with podman
from the local debootstrap base (e2e/images/build.sh; podman's layer cache keeps rebuilds
quick) and run for real: the broker serves on a read-only root as uid 10001, and the
privileged init container's command loads the XDP router onto a veth in a namespace the test
made."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from laminar.client import AsyncClient
from laminar.credentials import Role, dump, entry, new_token, token_hash
from laminar.log.batch import Record
from laminar.server.config import new_secret

from ..integration.conftest import loopback_prefix
from ..netns import veth_pair
from ..xdp.conftest import bpffs, gossip_datagram, send_udp

ROOT = Path(__file__).resolve().parents[2]
#: this machine's podman: runc, and ulimits within what the sandbox allows
PODMAN = ["podman", "--runtime", "runc"]
RUN = ["run", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
WAIT_S = 60.0


@pytest.fixture(scope="session")
def images() -> tuple[str, str]:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (.ci/run installs it from Debian)")
    if os.geteuid() != 0:
        pytest.skip("building the base image (debootstrap) and running privileged needs root")
    built = subprocess.run(
        [str(ROOT / "e2e" / "images" / "build.sh")],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-4000:]
    broker, operator = built.stdout.split()
    return broker, operator


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PODMAN, *args], capture_output=True, text=True, timeout=120, check=check
    )


@pytest.fixture()
def container() -> Iterator[str]:
    """A container name; the container is removed afterwards."""
    name = f"laminar-test-{secrets.token_hex(4)}"
    yield name
    podman("rm", "-f", "-t", "5", name, check=False)


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except OSError:
        return None


def test_the_broker_image_serves_as_uid_10001_on_a_read_only_root(
    images: tuple[str, str], container: str, tmp_path: Path
) -> None:
    broker, _ = images
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 10001, 10001)  # as a volume's fsGroup would
    secret = tmp_path / "secret"  # the cluster secret, mounted as the operator mounts it
    secret.mkdir()
    (secret / "hmac").write_bytes(new_secret())
    os.chown(secret / "hmac", 10001, 10001)
    credentials = tmp_path / "credentials"  # the client credentials, as the operator mounts them
    credentials.mkdir()
    token = new_token()
    admin = entry("admin", [Role.ADMIN], hashes=[token_hash(token)])
    (credentials / "credentials.yaml").write_text(dump([admin]))
    os.chown(credentials / "credentials.yaml", 10001, 10001)
    host = f"{loopback_prefix()}.1"
    podman(
        *RUN, "-d", "--name", container, "--network", "host", "--read-only",
        "-v", f"{data}:/var/lib/laminar", "-v", f"{secret}:/etc/laminar/secret:ro",
        "-v", f"{credentials}:/etc/laminar/credentials:ro",
        "--tmpfs", "/tmp", "-e", "LAMINAR_SECRET_FILE=/etc/laminar/secret/hmac",
        "-e", "LAMINAR_CREDENTIALS_FILE=/etc/laminar/credentials/credentials.yaml",
        "-e", "LAMINAR_NODE_ID=image-1", "-e", f"LAMINAR_HOST={host}", broker,
    )  # fmt: skip
    url = f"http://{host}:7070"
    deadline = time.monotonic() + WAIT_S
    while http_status(f"{url}/readyz") != 200:
        logs = podman("logs", container, check=False)
        assert time.monotonic() < deadline, logs.stdout + logs.stderr
        time.sleep(0.3)
    assert http_status(f"{url}/healthz") == 200

    async def roundtrip() -> bytes:
        async with AsyncClient([url], token=token) as client:
            await client.create_topic("image", partitions=1, replication_factor=1)
            await client.wait_for_leaders("image")
            await client.append("image", 0, [Record(value=b"from the image")])
            return (await client.read("image", 0)).records[0].value

    assert asyncio.run(roundtrip()) == b"from the image"
    config = json.loads(podman("inspect", broker).stdout)[0]["Config"]
    assert config["User"] == "10001"
    assert all(p.stat().st_uid == 10001 for p in data.rglob("*"))


def test_the_operator_image_runs_the_handlers(images: tuple[str, str]) -> None:
    _, operator = images
    config = json.loads(podman("inspect", operator).stdout)[0]["Config"]
    assert config["Entrypoint"] == ["kopf"] and "laminar_operator.handlers" in config["Cmd"]
    imported = podman(
        *RUN, "--rm", "--entrypoint", "python3", operator, "-c",
        "import laminar_operator.handlers, kopf; print(kopf.__version__)",
    )  # fmt: skip
    assert imported.stdout.strip()


def test_the_init_container_command_loads_the_router_only_when_privileged(
    images: tuple[str, str], tmp_path: Path
) -> None:
    broker, _ = images
    with veth_pair() as (sender, receiver), bpffs(tmp_path / "bpf") as pins:
        init = [
            *RUN, "--rm", "--network", f"ns:/run/netns/{receiver.netns}",
            "-e", "LAMINAR_CLUSTER_ID=prod.demo", "--entrypoint", "laminar-xdp",
        ]  # fmt: skip
        load = ["load", "--iface", receiver.iface]
        # the broker's own user (10001), unprivileged: refused with a clear error ...
        refused = podman(*init, broker, *load, check=False)
        assert refused.returncode == 3, refused.stderr
        assert "not permitted" in refused.stderr
        # ... which --best-effort (the init container's flag) turns into going on without it
        going_on = podman(*init, broker, *load, "--best-effort", check=False)
        assert going_on.returncode == 0 and "continuing without" in going_on.stderr
        assert "xdp" not in receiver.run("ip", "link", "show", receiver.iface).stdout

        # privileged and root, with the node's bpffs mounted, as the LaminarCluster runs it
        loaded = podman(
            *init, "--privileged", "--user", "0", "-v", f"{pins}:/sys/fs/bpf", broker, *load
        )
        assert "router attached" in loaded.stdout
        assert "laminar_router" in receiver.run("ip", "link", "show", receiver.iface).stdout
        port = 7072
        send_udp(sender, receiver.address, port, gossip_datagram("prod.demo"))
        send_udp(sender, receiver.address, port, gossip_datagram("someone.else"))
        shown = subprocess.run(
            ["laminar-xdp", "--pin-dir", str(pins / "laminar"), "stats"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        membership = json.loads(shown.stdout)["membership"]
        assert membership == {"packets": 2, "bytes": membership["bytes"], "drops": 1}
