"""A multi-broker cluster of real `laminar serve` processes on loopback addresses.

Broker i (1-based) is node `n<i>` on `<prefix>.<10 + i>` with the default ports, its data in
`<data_dir>/n<i>` and its output in `<data_dir>/n<i>/broker.log`. `cluster.json` in the data
directory records the nodes and their process ids so `down` and `status` find them later.
The cluster secret is `<data_dir>/secret` (mode 600): a random one made for each new data
directory and passed to every broker with --secret-file; a later `up` reuses it.

Client credentials are made the same way: `<data_dir>/token` (mode 600) holds an admin token
(or the `token` given), and `<data_dir>/credentials.yaml` (mode 600), the brokers'
--credentials-file, lists its hash as principal `admin`. Clients use the token file
(`export LAMINAR_TOKEN_FILE=<data_dir>/token`); more principals go into the credentials file
(`laminar credentials add <data_dir>/credentials.yaml ...`), which the brokers re-read.

With `tls` (`laminar local-cluster up` has it on unless --no-tls), the brokers serve HTTPS and
speak mutual TLS to each other: `<data_dir>/tls/` holds a CA made for the data directory
(`ca.crt`, the file clients are given; `ca.key`, mode 600) and each broker's key and
certificate (`n<i>.key`, `n<i>.crt`, valid for its address and `localhost`), made when missing
and reused by a later `up`.

Addresses: a broker's ports (its API, peer and gossip ports, and each worker's) are checked
free before it starts, and a broker counts as started only when the broker answering on its
URL is it: `GET /v1/cluster` with this cluster's admin token (sent only after the CA check,
with TLS) names its node id and cluster id. Otherwise another cluster holding the addresses
would answer for brokers that failed to listen. `move_to_free_prefix` moves a cluster whose
addresses are taken to the next free /24 (`up` without --prefix); `start_missing` starts the
brokers of a partly running cluster again, at their own addresses.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from . import credentials
from .certs import KeyPair, issue, make_ca, names_of, renewal_due
from .credentials import (
    CredentialsError,
    Role,
    new_token,
    read_token_file,
    replace_file,
    token_hash,
    write_new_file,
)
from .server.config import (
    DEFAULT_API_PORT,
    DEFAULT_GOSSIP_PORT,
    DEFAULT_PEER_PORT,
    ConfigError,
    new_secret,
    read_secret_file,
)
from .tls import client_context
from .workers import PORT_STRIDE, usable_cores, worker_address, worker_id

#: the directory this `laminar` package was imported from
PACKAGE_ROOT = Path(__file__).resolve().parent.parent

STATE_FILE = "cluster.json"
SECRET_FILE = "secret"
TOKEN_FILE = "token"
CREDENTIALS_FILE = "credentials.yaml"
TLS_DIR = "tls"
CLUSTER_ID = "local"
#: the /24 a cluster's brokers are on unless another is asked for (broker i: <prefix>.<10+i>)
DEFAULT_PREFIX = "127.0.0"
#: how many /24s after its own `move_to_free_prefix` tries (127.0.1, 127.0.2, ...)
FREE_PREFIX_TRIES = 50
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
    tls: bool = False

    @property
    def api_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{DEFAULT_API_PORT}"

    def worker_urls(self, workers: int) -> list[str]:
        """Each worker's API (docs/workers.md: worker w listens on the port plus 3*w)."""
        scheme = "https" if self.tls else "http"
        api = f"{self.host}:{DEFAULT_API_PORT}"
        return [f"{scheme}://{worker_address(api, w)}" for w in range(workers)]

    @property
    def gossip_addr(self) -> str:
        return f"{self.host}:{DEFAULT_GOSSIP_PORT}"

    def alive(self) -> bool:
        """Is this broker running: the process this cluster started, or (a cluster loaded
        from its state file) the recorded process, if it still runs this broker (a process id
        can be reused once its process has ended)."""
        if self.process is not None:
            return self.process.poll() is None
        return self.pid is not None and pid_alive(self.pid) and runs_broker(self.pid, self)


class LocalCluster:
    def __init__(
        self,
        data_dir: Path,
        nodes: int = 3,
        *,
        prefix: str = DEFAULT_PREFIX,
        fsync: str = "always",
        token: str | None = None,
        extra_args: tuple[str, ...] = (),
        tls: bool = False,
        workers: int = 1,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not 1 <= nodes <= 200:
            raise ClusterError("--nodes must be in 1..200")
        self.data_dir = data_dir.resolve()
        self.prefix = prefix
        self.fsync = fsync
        self.tls = tls
        self._wanted_token = token
        self.extra_args = extra_args
        self.workers = workers
        #: variables the brokers get on top of this process's environment
        self.env = dict(env or {})
        self.initial = [f"n{i}" for i in range(1, nodes + 1)]
        self.nodes: dict[str, LocalNode] = {}
        for node_id in self.initial:
            self._add(node_id)

    def _add(self, node_id: str) -> LocalNode:
        number = int(node_id[1:])
        node = LocalNode(
            node_id, f"{self.prefix}.{10 + number}", self.data_dir / node_id, tls=self.tls
        )
        self.nodes[node_id] = node
        return node

    @property
    def urls(self) -> list[str]:
        return [n.api_url for n in self.nodes.values()]

    @property
    def cluster_id(self) -> str:
        """The brokers' cluster id: CLUSTER_ID unless `extra_args` give another (the last
        --cluster-id wins, as on the command line)."""
        args = list(self.extra_args)
        indexes = [i for i, arg in enumerate(args[:-1]) if arg == "--cluster-id"]
        return args[indexes[-1] + 1] if indexes else CLUSTER_ID

    # ---- addresses -------------------------------------------------------------------------

    def listen_addresses(self, node_id: str) -> list[tuple[str, int, socket.SocketKind]]:
        """Where broker `node_id` listens: for each of its workers, the API and peer ports
        (TCP) and the gossip port (UDP), each worker's shifted by PORT_STRIDE times its index."""
        host = self.nodes[node_id].host
        workers = self.workers or usable_cores()  # 0: one per usable core, as the broker does
        return [
            (host, port + PORT_STRIDE * worker, kind)
            for worker in range(workers)
            for port, kind in (
                (DEFAULT_API_PORT, socket.SOCK_STREAM),
                (DEFAULT_PEER_PORT, socket.SOCK_STREAM),
                (DEFAULT_GOSSIP_PORT, socket.SOCK_DGRAM),
            )
        ]

    def addresses_in_use(self, node_ids: list[str] | None = None) -> list[str]:
        """The addresses of brokers `node_ids` (default: all) that something else holds now,
        as `host:port` (`host:port/udp` for gossip); ClusterError if one cannot be listened
        on for another reason (an address this machine does not have)."""
        busy = []
        for node_id in self.nodes if node_ids is None else node_ids:
            for host, port, kind in self.listen_addresses(node_id):
                name = f"{host}:{port}" + ("/udp" if kind == socket.SOCK_DGRAM else "")
                with socket.socket(socket.AF_INET, kind) as probe_socket:
                    if kind == socket.SOCK_STREAM:  # as the broker does: TIME_WAIT is no hold
                        probe_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    try:
                        probe_socket.bind((host, port))
                    except OSError as e:
                        if e.errno != errno.EADDRINUSE:
                            raise ClusterError(f"cannot listen on {name}: {e.strerror}") from None
                        busy.append(name)
        return busy

    def check_addresses(self, node_ids: list[str] | None = None) -> None:
        """ClusterError naming the addresses in use, if brokers `node_ids` cannot listen."""
        busy = self.addresses_in_use(node_ids)
        if busy:
            raise ClusterError(
                f"address in use: {', '.join(busy)} (another cluster or program holds it); "
                "stop it, or choose another --prefix"
            )

    def move_to_free_prefix(self, tries: int = FREE_PREFIX_TRIES) -> list[str]:
        """When an address of this (stopped) cluster is in use, move it to the first of the
        next `tries` /24s (127.0.0 -> 127.0.1, 127.0.2, ...) where all are free; the addresses
        found in use at its own prefix ([]: it stays). ClusterError if none is free."""
        busy = self.addresses_in_use()
        if not busy:
            return []
        first = self.prefix
        head, _, third = first.rpartition(".")
        for step in range(1, tries + 1):
            if int(third) + step > 255:
                break
            self._move_to(f"{head}.{int(third) + step}")
            if not self.addresses_in_use():
                return busy
        self._move_to(first)
        raise ClusterError(
            f"address in use: {', '.join(busy)}, and no free range in the {tries} /24s after "
            f"{first}: choose a --prefix"
        )

    def _move_to(self, prefix: str) -> None:
        self.prefix = prefix
        for node_id in list(self.nodes):
            pid = self.nodes[node_id].pid
            self._add(node_id).pid = pid

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

    @property
    def ca_file(self) -> Path | None:
        """The CA bundle clients verify the brokers with (None without TLS)."""
        return self.data_dir / TLS_DIR / "ca.crt" if self.tls else None

    def _ca(self) -> KeyPair:
        """This data directory's CA: made if missing (an existing one is kept)."""
        directory = self.data_dir / TLS_DIR
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / "ca.crt", directory / "ca.key"
        if not (cert.exists() and key.exists()):
            ca = make_ca(f"laminar local cluster {self.data_dir.name}")
            _write(key, ca.key_pem, 0o600)
            _write(cert, ca.cert_pem, 0o644)
        return KeyPair(cert.read_bytes(), key.read_bytes())

    def tls_files(self, node_id: str) -> tuple[Path, Path]:
        """A broker's certificate and key files, made (signed by the CA) when missing, and
        made again when less than a third of their lifetime is left or the broker's address
        is not one they name (another --prefix)."""
        directory = self.data_dir / TLS_DIR
        cert, key = directory / f"{node_id}.crt", directory / f"{node_id}.key"
        if not (cert.exists() and key.exists()) or self._stale(node_id, cert.read_bytes()):
            self.renew_certificate(node_id, self._ca())
        return cert, key

    def _stale(self, node_id: str, cert_pem: bytes) -> bool:
        try:
            pair = KeyPair(cert_pem, b"")
            due = renewal_due(pair.not_before, pair.not_after)
            return due or self.nodes[node_id].host not in names_of(cert_pem)
        except Exception:  # unreadable, or names nothing: make a new one
            return True

    def renew_certificate(self, node_id: str, ca: KeyPair | None = None) -> KeyPair:
        """Give `node_id` a new key and certificate (signed by `ca`, default this data
        directory's CA); a running broker picks them up within seconds (each file is
        replaced at once; a key and certificate that do not match yet are retried)."""
        node = self.nodes[node_id]
        pair = issue(ca or self._ca(), node_id, [node.host, "localhost"])
        directory = self.data_dir / TLS_DIR
        _write(directory / f"{node_id}.key", pair.key_pem, 0o600)
        _write(directory / f"{node_id}.crt", pair.cert_pem, 0o644)
        return pair

    @property
    def token_file(self) -> Path:
        """The admin token's file (made, with the credentials file, by `credentials_path`)."""
        return self.data_dir / TOKEN_FILE

    @property
    def token(self) -> str:
        """The cluster's admin token."""
        self.credentials_path()
        try:
            return read_token_file(self.token_file)
        except CredentialsError as e:
            raise ClusterError(str(e)) from None

    def credentials_path(self) -> Path:
        """The brokers' credentials file: made when missing, with principal `admin` and the
        token of `<data_dir>/token` (made with a new random token when missing, or holding the
        `token` this cluster was given); ClusterError if that token is not an admin's in it."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / CREDENTIALS_FILE
        try:
            wanted = self._wanted_token
            if wanted is not None:
                current = read_token_file(self.token_file) if self.token_file.exists() else None
                if current != wanted:  # a token chosen for this cluster (tests): it alone
                    replace_file(self.token_file, wanted + "\n")
                    path.unlink(missing_ok=True)
            with contextlib.suppress(FileExistsError):
                write_new_file(self.token_file, new_token() + "\n")
            token = read_token_file(self.token_file)
            with contextlib.suppress(FileExistsError):
                admin = credentials.entry("admin", [Role.ADMIN], hashes=[token_hash(token)])
                write_new_file(path, credentials.dump([admin]))
            principals = credentials.load(path)
        except CredentialsError as e:
            raise ClusterError(str(e)) from None
        if not any(p.admin and token_hash(token) in p.hashes for p in principals):
            raise ClusterError(
                f"the token in {self.token_file} is no admin's in {path}: remove both files "
                "for new ones"
            )
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
            "--workers",
            str(self.workers),
            *self.extra_args,
        ]
        command += ["--credentials-file", str(self.credentials_path())]
        if self.tls:
            cert, key = self.tls_files(node.id)
            command += ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
            command += ["--tls-ca-file", str(self.ca_file)]
        return command

    def broker_env(self) -> dict[str, str]:
        """The brokers' environment: this process's, with `env` on top, and its `laminar`
        first on PYTHONPATH when it runs from a source tree (a script that put a checkout on
        sys.path, such as a bench, measures that checkout's brokers, not whichever one an
        editable install points at)."""
        env = {**os.environ, **self.env}
        root = PACKAGE_ROOT
        if root.name not in ("site-packages", "dist-packages"):
            paths = [str(root), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
            env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        return env

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
                env=self.broker_env(),
            )
        node.pid = node.process.pid
        self.save()
        return node

    def worker_pids(self, node_id: str) -> dict[int, int]:
        """The process id of each of a broker's workers (with --workers above 1; its
        supervisor keeps them in <data dir>/workers.json), by worker index."""
        path = self.nodes[node_id].data_dir / "workers.json"
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        return {int(index): int(pid) for index, pid in document["workers"].items()}

    def serving_pids(self) -> dict[str, int]:
        """The process serving each running broker, or each of its workers (with --workers
        above 1, not their supervisor), by node id (n1, n1~1, ...)."""
        out: dict[str, int] = {}
        for node in self.nodes.values():
            if node.pid is None or not node.alive():
                continue
            if self.workers == 1:
                out[node.id] = node.pid
                continue
            for index, pid in sorted(self.worker_pids(node.id).items()):
                out[worker_id(node.id, index)] = pid
        return out

    def start(self, *, wait: bool = True) -> None:
        """Start every broker (ClusterError, before any starts, if an address is in use)."""
        self.check_addresses([n.id for n in self.nodes.values() if not n.alive()])
        for node_id in list(self.nodes):
            self.start_node(node_id)
        if wait:
            self.wait_ready()

    def start_missing(self) -> list[str]:
        """Start the brokers that are not running, with their ids, addresses and data, and
        leave the running ones alone (`up` on a partly running cluster); the ids started.
        ClusterError if one cannot start: those it started are stopped again."""
        missing = [n.id for n in self.nodes.values() if not n.alive()]
        self.check_addresses(missing)
        try:
            for node_id in missing:
                self.start_node(node_id)
            self.wait_ready(missing)
        except BaseException:
            for node_id in missing:
                self.stop_node(node_id)
            self.save()
            raise
        return missing

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

    def stop_node(self, node_id: str, *, signalled: bool = False) -> int | None:
        """SIGTERM (unless `signalled`: sent already), wait for the graceful exit (SIGKILL
        after STOP_TIMEOUT_S); exit code. One SIGTERM only: a second one reaching a broker
        after its shutdown removed its handlers would end it at once (exit -15)."""
        node = self.nodes[node_id]
        if node.pid is None or not node.alive():
            return None
        if not signalled:
            os.kill(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self._stopping(node) and time.monotonic() < deadline:
            time.sleep(0.05)
        if node.alive():
            os.kill(node.pid, signal.SIGKILL)
        if node.process is not None:
            return node.process.wait(timeout=STOP_TIMEOUT_S)
        while self._stopping(node) and time.monotonic() < deadline + STOP_TIMEOUT_S:
            time.sleep(0.05)  # (killed: gone in a moment)
        return 0

    @staticmethod
    def _stopping(node: LocalNode) -> bool:
        """Is `node`'s broker, signalled to stop, still there: running, or still exiting? A
        process that is exiting has released its memory before its files, and its command
        line then reads empty (`runs_broker` cannot tell it), though it still holds them."""
        if node.alive():
            return True
        return node.process is None and node.pid is not None and exiting(node.pid)

    def stop(self) -> list[str]:
        """Stop every running broker (SIGTERM to all, then wait for each); the ids of those
        that were running."""
        signalled = []
        for node_id in list(self.nodes):
            node = self.nodes[node_id]
            if node.pid is not None and node.alive():
                os.kill(node.pid, signal.SIGTERM)
                signalled.append(node_id)
        for node_id in list(self.nodes):
            self.stop_node(node_id, signalled=node_id in signalled)
        self.save()
        return signalled

    def wait_ready(
        self, node_ids: list[str] | None = None, timeout_s: float = READY_TIMEOUT_S
    ) -> None:
        """Wait until every worker of brokers `node_ids` (default: all) is ready and each
        broker's URL is answered by that broker (`identify`). ClusterError if one exits, or
        another answers, or not within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        pending = [
            (node_id, url)
            for node_id in node_ids or self.nodes
            for url in self.nodes[node_id].worker_urls(self.workers)
        ]
        while pending:
            node = self.nodes[pending[0][0]]
            if not node.alive():
                tail = self.tail(node.id)
                why = ": an address it listens on is in use" if "in use" in tail else ""
                raise ClusterError(
                    f"{node.id} exited{self._how(node)}{why}; see "
                    f"{node.data_dir / 'broker.log'}:\n{tail}"
                )
            url = pending[0][1]
            if probe(url + "/readyz", ca_file=self.ca_file) == 200 and (
                url != node.api_url or self.identify(node.id)
            ):
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise ClusterError(f"{node.id} not ready after {timeout_s:.0f} s")
            time.sleep(0.1)

    def identify(self, node_id: str) -> bool:
        """Is the broker answering on `node_id`'s URL that broker of this cluster: True; False
        when it cannot tell yet; ClusterError when another answers (another cluster, on an
        address our broker could not take). The admin token goes to the URL only once TLS
        verified it against this cluster's CA."""
        node = self.nodes[node_id]
        status, body = get_json(node.api_url + "/v1/cluster", self.token, ca_file=self.ca_file)
        if status == 200 and isinstance(body, dict):
            answered = (body.get("node_id"), body.get("cluster_id"))
            if answered == (node.id, self.cluster_id):
                return True
            problem = f"answers as node {answered[0]!r} of cluster {answered[1]!r}"
        elif status in (401, 403):
            problem = f"refuses this cluster's admin token ({status})"
        else:
            return False
        raise ClusterError(
            f"{node.api_url} is not {node.id} of this cluster: it {problem}; another cluster "
            f"holds {node.host}? Stop it, or choose another --prefix"
        )

    @staticmethod
    def _how(node: LocalNode) -> str:
        """How a broker this cluster started ended: its exit code, or the signal that ended it."""
        code = node.process.returncode if node.process is not None else None
        if code is None:
            return ""
        if code < 0:
            return f" (ended by {signal.Signals(-code).name})"
        return f" (exit code {code})"

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
            "tls": self.tls,
            "workers": self.workers,
            "nodes": {
                n.id: {"host": n.host, "pid": n.pid, "api_url": n.api_url}
                for n in self.nodes.values()
            },
        }
        (self.data_dir / STATE_FILE).write_text(json.dumps(document, indent=2))

    @classmethod
    def load(cls, data_dir: Path, *, fsync: str = "always") -> LocalCluster:
        """The cluster `save` recorded in `data_dir` (ClusterError if there is none)."""
        path = data_dir / STATE_FILE
        if not data_dir.is_dir():
            raise ClusterError(f"no local cluster in {data_dir}: no such directory")
        if not path.exists():
            raise ClusterError(f"no local cluster in {data_dir} ({STATE_FILE} missing)")
        try:
            document = json.loads(path.read_text())
            cluster = cls(
                data_dir,
                len(document["initial"]),
                prefix=document["prefix"],
                fsync=fsync,
                tls=bool(document.get("tls", False)),
                workers=int(document.get("workers", 1)),
            )
            pids = {node_id: info["pid"] for node_id, info in document["nodes"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ClusterError(f"{path} is damaged ({e!r}): remove it") from None
        for node_id, pid in pids.items():
            node = cluster.nodes.get(node_id) or cluster._add(node_id)
            node.pid = pid
        return cluster


def probe(
    url: str,
    token: str | None = None,
    timeout_s: float = 1.0,
    *,
    ca_file: str | os.PathLike[str] | None = None,
) -> int | None:
    """HTTP status of a GET, None if unreachable (https: verified against `ca_file`)."""
    return get_json(url, token, timeout_s, ca_file=ca_file)[0]


def get_json(
    url: str,
    token: str | None = None,
    timeout_s: float = 1.0,
    *,
    ca_file: str | os.PathLike[str] | None = None,
) -> tuple[int | None, object]:
    """HTTP status and JSON body of a GET (None, None if unreachable; body None if not JSON)."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    context = client_context(ca_file) if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            status, raw = int(response.status), response.read()
    except urllib.error.HTTPError as e:
        return int(e.code), None
    except (OSError, ValueError):
        return None, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


def _write(path: Path, data: bytes, mode: int) -> None:
    """Replace `path` with `data` at once (a reader sees the old file or the new one)."""
    temporary = path.with_name(path.name + ".new")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    os.chmod(temporary, mode)
    os.replace(temporary, path)


def pid_alive(pid: int) -> bool:
    """Is process `pid` running: any of its threads not yet a zombie? A zombie child of ours is
    not; a process whose main thread is a zombie while another thread still exits (one that
    was in an fdatasync when the process exited, holding its files and ports) still is. Gone
    between the signal and the read of /proc (reaped meanwhile: CI127) is not. Where /proc
    cannot tell (unreadable), the signal's answer stands: alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc/self/task"):
        return True  # no /proc: the signal's word
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    except OSError:
        return True
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/stat") as f:
                state = f.read().rsplit(") ", 1)[1][:1]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue  # that thread is gone
        except OSError:
            return True  # its state cannot be read: the signal's word, as for the list
        if state not in ("Z", "X"):
            return True
    return False


def exiting(pid: int) -> bool:
    """Is process `pid` exiting: not yet a zombie, its command line already gone?"""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read() == b""
    except OSError:
        return False


def runs_broker(pid: int, node: LocalNode) -> bool:
    """Does process `pid` run `node`'s broker (`laminar serve --data-dir <its data dir>`)? True
    when its command line cannot be read (no /proc): it is taken to."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            arguments = f.read().decode(errors="replace").split("\0")
    except OSError:
        return True
    return "serve" in arguments and str(node.data_dir) in arguments
