"""A multi-broker cluster of real `laminar serve` processes on loopback addresses.

Broker i (1-based) is node `n<i>` on `<prefix>.<10 + i>` with the default ports, its data in
`<data_dir>/n<i>` and its output in `<data_dir>/n<i>/broker.log`. `cluster.json` in the data
directory records the nodes and their process ids so `down` and `status` find them later.
The cluster secret is `<data_dir>/secret` (mode 600): a random one made for each new data
directory and passed to every broker with --secret-file; a later `up` reuses it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .server.config import (
    DEFAULT_API_PORT,
    DEFAULT_GOSSIP_PORT,
    DEFAULT_PEER_PORT,
    ConfigError,
    new_secret,
    read_secret_file,
)

STATE_FILE = "cluster.json"
SECRET_FILE = "secret"
CLUSTER_ID = "local"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


class ClusterError(RuntimeError):
    pass


@dataclass
class LocalNode:
    id: str
    host: str
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None
    pid: int | None = None

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{DEFAULT_API_PORT}"

    @property
    def gossip_addr(self) -> str:
        return f"{self.host}:{DEFAULT_GOSSIP_PORT}"

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return self.pid is not None and pid_alive(self.pid)


class LocalCluster:
    def __init__(
        self,
        data_dir: Path,
        nodes: int = 3,
        *,
        prefix: str = "127.0.0",
        fsync: str = "always",
        token: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        if not 1 <= nodes <= 200:
            raise ClusterError("--nodes must be in 1..200")
        self.data_dir = data_dir.resolve()
        self.prefix = prefix
        self.fsync = fsync
        self.token = token
        self.extra_args = extra_args
        self.initial = [f"n{i}" for i in range(1, nodes + 1)]
        self.nodes: dict[str, LocalNode] = {}
        for node_id in self.initial:
            self._add(node_id)

    def _add(self, node_id: str) -> LocalNode:
        number = int(node_id[1:])
        node = LocalNode(node_id, f"{self.prefix}.{10 + number}", self.data_dir / node_id)
        self.nodes[node_id] = node
        return node

    @property
    def urls(self) -> list[str]:
        return [n.api_url for n in self.nodes.values()]

    # ---- processes -------------------------------------------------------------------------

    def secret_path(self) -> Path:
        """This cluster's secret file: created with a random secret (readable by its owner
        only) if missing, checked if present (ClusterError if unusable)."""
        path = self.data_dir / SECRET_FILE
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(descriptor, "wb") as file:
                file.write(new_secret())
        try:
            read_secret_file(str(path))
        except ConfigError as e:
            raise ClusterError(str(e)) from None
        return path

    def _token_path(self) -> Path | None:
        if self.token is None:
            return None
        path = self.data_dir / "token"
        path.write_text(self.token)
        path.chmod(0o600)
        return path

    def command(self, node: LocalNode) -> list[str]:
        seeds = ",".join(n.gossip_addr for n in self.nodes.values() if n.id != node.id)
        command = [
            sys.executable,
            "-m",
            "laminar",
            "serve",
            "--node-id",
            node.id,
            "--data-dir",
            str(node.data_dir),
            "--host",
            node.host,
            "--api-port",
            str(DEFAULT_API_PORT),
            "--peer-port",
            str(DEFAULT_PEER_PORT),
            "--gossip-port",
            str(DEFAULT_GOSSIP_PORT),
            "--seeds",
            seeds,
            "--initial-nodes",
            ",".join(self.initial),
            "--cluster-id",
            CLUSTER_ID,
            "--secret-file",
            str(self.secret_path()),
            "--fsync",
            self.fsync,
            *self.extra_args,
        ]
        token = self._token_path()
        if token is not None:
            command += ["--token-file", str(token)]
        return command

    def start_node(self, node_id: str) -> LocalNode:
        node = self.nodes.get(node_id) or self._add(node_id)
        if node.alive():
            raise ClusterError(f"{node_id} is already running")
        node.data_dir.mkdir(parents=True, exist_ok=True)
        with open(node.data_dir / "broker.log", "ab") as output:
            node.process = subprocess.Popen(
                self.command(node),
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        node.pid = node.process.pid
        self.save()
        return node

    def start(self, *, wait: bool = True) -> None:
        for node_id in list(self.nodes):
            self.start_node(node_id)
        if wait:
            self.wait_ready()

    def add_node(self) -> LocalNode:
        number = max(int(n[1:]) for n in self.nodes) + 1
        node = self.start_node(f"n{number}")
        self.wait_ready([node.id])
        return node

    def kill(self, node_id: str, sig: int = signal.SIGKILL) -> None:
        node = self.nodes[node_id]
        if node.pid is not None and node.alive():
            os.kill(node.pid, sig)
        if node.process is not None:
            node.process.wait(timeout=STOP_TIMEOUT_S)

    def stop_node(self, node_id: str) -> int | None:
        """SIGTERM, wait for the graceful exit (SIGKILL after STOP_TIMEOUT_S); exit code."""
        node = self.nodes[node_id]
        if node.pid is None or not node.alive():
            return None
        os.kill(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while node.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if node.alive():
            os.kill(node.pid, signal.SIGKILL)
        if node.process is not None:
            return node.process.wait(timeout=STOP_TIMEOUT_S)
        return 0

    def stop(self) -> None:
        for node_id in list(self.nodes):
            node = self.nodes[node_id]
            if node.pid is not None and node.alive():
                os.kill(node.pid, signal.SIGTERM)
        for node_id in list(self.nodes):
            self.stop_node(node_id)
        self.save()

    def wait_ready(
        self, node_ids: list[str] | None = None, timeout_s: float = READY_TIMEOUT_S
    ) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(node_ids or self.nodes)
        while pending:
            node = self.nodes[pending[0]]
            if not node.alive():
                raise ClusterError(
                    f"{node.id} exited; see {node.data_dir / 'broker.log'}:\n{self.tail(node.id)}"
                )
            if probe(node.api_url + "/readyz", self.token) == 200:
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise ClusterError(f"{node.id} not ready after {timeout_s:.0f} s")
            time.sleep(0.1)

    def tail(self, node_id: str, lines: int = 30) -> str:
        path = self.nodes[node_id].data_dir / "broker.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # ---- state file ------------------------------------------------------------------------

    def save(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        document = {
            "prefix": self.prefix,
            "initial": self.initial,
            "nodes": {
                n.id: {"host": n.host, "pid": n.pid, "api_url": n.api_url}
                for n in self.nodes.values()
            },
        }
        (self.data_dir / STATE_FILE).write_text(json.dumps(document, indent=2))

    @classmethod
    def load(cls, data_dir: Path) -> LocalCluster:
        path = data_dir / STATE_FILE
        if not path.exists():
            raise ClusterError(f"no local cluster in {data_dir} ({STATE_FILE} missing)")
        document = json.loads(path.read_text())
        cluster = cls(data_dir, len(document["initial"]), prefix=document["prefix"])
        for node_id, info in document["nodes"].items():
            node = cluster.nodes.get(node_id) or cluster._add(node_id)
            node.pid = info["pid"]
        return cluster


def probe(url: str, token: str | None = None, timeout_s: float = 1.0) -> int | None:
    """HTTP status of a GET, None if unreachable."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Is process `pid` running (a zombie is not)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return True
