"""A broker's configuration: every knob is a `laminar serve` flag and a LAMINAR_* variable."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from ..log.config import FsyncPolicy
from ..metadata.state import NODE_ID

DEFAULT_API_PORT = 7070
DEFAULT_PEER_PORT = 7071
DEFAULT_GOSSIP_PORT = 7072
DEFAULT_XDP_PIN_DIR = Path("/sys/fs/bpf/laminar")
MIB = 1 << 20
#: for a laptop cluster only: real clusters pass --secret-file
DEFAULT_SECRET = b"laminar-insecure-default-secret"


class ConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    node_id: str
    data_dir: Path
    host: str = "127.0.0.1"  # bind address for all three ports
    advertise_host: str | None = None  # what peers and clients use; default: host
    api_port: int = DEFAULT_API_PORT
    peer_port: int = DEFAULT_PEER_PORT
    gossip_port: int = DEFAULT_GOSSIP_PORT
    #: gossip addresses ("host:port") of nodes to join through
    seeds: tuple[str, ...] = ()
    #: node ids that form the cluster at its first start (the metadata group's first voters
    #: are chosen among them); give every node the same list
    initial_nodes: tuple[str, ...] = ()
    cluster_id: str = "laminar"
    secret: bytes = DEFAULT_SECRET
    token: str | None = None
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = 100
    tick_ms: int = 100
    election_ticks: int = 10
    max_request_bytes: int = 8 * MIB
    request_timeout_ms: int = 10_000
    max_pending_bytes_per_partition: int = 64 * MIB
    #: a member SWIM reports dead or left still counts for placement this long (restarts
    #: should not move partitions)
    dead_grace_ms: int = 30_000
    default_replication_factor: int = 3
    segment_bytes: int = 64 * MIB
    #: Kubernetes status reporting (docs/kubernetes.md): the LaminarCluster object this broker
    #: belongs to and its namespace (both, or neither: no reporting), and a kubeconfig (None:
    #: the pod's ServiceAccount)
    kube_namespace: str | None = None
    kube_cluster: str | None = None
    kube_config: str | None = None
    #: where `laminar-xdp` pinned the XDP router's maps; its counters are exported as metrics
    #: when they are there and readable (without CAP_BPF: Linux >= 6.5)
    xdp_pin_dir: Path = DEFAULT_XDP_PIN_DIR

    def __post_init__(self) -> None:
        if not NODE_ID.fullmatch(self.node_id):
            raise ConfigError(f"node id {self.node_id!r} must match {NODE_ID.pattern}")
        for name in ("api_port", "peer_port", "gossip_port"):
            port = getattr(self, name)
            if not 0 <= port < 65_536:
                raise ConfigError(f"{name}={port} is not a port")
        if self.max_pending_bytes_per_partition < 1:
            raise ConfigError("max_pending_bytes must be positive")
        if self.fsync_interval_ms < 1:
            raise ConfigError("fsync_interval_ms must be positive")
        if self.tick_ms < 5 or self.election_ticks < 3:
            raise ConfigError("tick_ms must be >= 5 and election_ticks >= 3")
        if (self.kube_namespace is None) != (self.kube_cluster is None):
            raise ConfigError("--kube-namespace and --kube-cluster go together")
        if len(self.secret) < 16:
            raise ConfigError("the cluster secret must be at least 16 bytes")

    @property
    def public_host(self) -> str:
        return self.advertise_host or self.host


ENV = "LAMINAR_"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`laminar serve` flags; each defaults to its LAMINAR_<NAME> environment variable."""

    def env(name: str, default: str | None = None) -> str | None:
        return os.environ.get(ENV + name.upper().replace("-", "_"), default)

    add = parser.add_argument
    add("--node-id", default=env("node-id"), help="this node's id (env LAMINAR_NODE_ID)")
    add("--data-dir", default=env("data-dir"), help="where logs live (env LAMINAR_DATA_DIR)")
    add("--host", default=env("host", "127.0.0.1"), help="bind address")
    add("--advertise-host", default=env("advertise-host"), help="address peers/clients use")
    add("--api-port", type=int, default=int(env("api-port", str(DEFAULT_API_PORT)) or 0))
    add("--peer-port", type=int, default=int(env("peer-port", str(DEFAULT_PEER_PORT)) or 0))
    add("--gossip-port", type=int, default=int(env("gossip-port", str(DEFAULT_GOSSIP_PORT)) or 0))
    add("--seeds", default=env("seeds", ""), help="comma-separated gossip host:port of peers")
    add(
        "--initial-nodes",
        default=env("initial-nodes", ""),
        help="comma-separated node ids forming the cluster at first start (same on every node)",
    )
    add("--cluster-id", default=env("cluster-id", "laminar"))
    add("--secret-file", default=env("secret-file"), help="file with the cluster HMAC secret")
    add("--token-file", default=env("token-file"), help="file with the client API bearer token")
    add("--fsync", default=env("fsync", "always"), choices=[p.value for p in FsyncPolicy])
    add("--fsync-interval-ms", type=int, default=int(env("fsync-interval-ms", "100") or 100))
    add("--tick-ms", type=int, default=int(env("tick-ms", "100") or 100))
    add("--max-request-bytes", type=int, default=int(env("max-request-bytes", str(8 * MIB)) or 0))
    add("--request-timeout-ms", type=int, default=int(env("request-timeout-ms", "10000") or 0))
    add(
        "--max-pending-bytes",
        type=int,
        default=int(env("max-pending-bytes", str(64 * MIB)) or 0),
        help="per partition: bytes of appends awaiting commit before 429",
    )
    add("--dead-grace-ms", type=int, default=int(env("dead-grace-ms", "30000") or 0))
    add("--segment-bytes", type=int, default=int(env("segment-bytes", str(64 * MIB)) or 0))
    add("--kube-namespace", default=env("kube-namespace"), help="report status to Kubernetes")
    add("--kube-cluster", default=env("kube-cluster"), help="the LaminarCluster object's name")
    add("--kube-config", default=env("kube-config"), help="kubeconfig (default: in-cluster)")
    add(
        "--xdp-pin-dir",
        default=env("xdp-pin-dir", str(DEFAULT_XDP_PIN_DIR)),
        help="the XDP router's pinned maps (laminar-xdp --pin-dir), exported as metrics",
    )


def _read_secret(path: str, what: str) -> bytes:
    try:
        data = Path(path).read_bytes().strip()
    except OSError as e:
        raise ConfigError(f"cannot read the {what} file {path}: {e.strerror}") from e
    if not data:
        raise ConfigError(f"the {what} file {path} is empty")
    return data


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (value or "").split(",") if part.strip())


def from_arguments(args: argparse.Namespace) -> BrokerConfig:
    if not args.node_id:
        raise ConfigError("--node-id (or LAMINAR_NODE_ID) is required")
    if not args.data_dir:
        raise ConfigError("--data-dir (or LAMINAR_DATA_DIR) is required")
    secret = DEFAULT_SECRET
    if args.secret_file:
        secret = _read_secret(args.secret_file, "secret")
    token = _read_secret(args.token_file, "token").decode() if args.token_file else None
    return BrokerConfig(
        node_id=args.node_id,
        data_dir=Path(args.data_dir),
        host=args.host,
        advertise_host=args.advertise_host,
        api_port=args.api_port,
        peer_port=args.peer_port,
        gossip_port=args.gossip_port,
        seeds=_split(args.seeds),
        initial_nodes=_split(args.initial_nodes),
        cluster_id=args.cluster_id,
        secret=secret,
        token=token,
        fsync=FsyncPolicy(args.fsync),
        fsync_interval_ms=args.fsync_interval_ms,
        tick_ms=args.tick_ms,
        max_request_bytes=args.max_request_bytes,
        request_timeout_ms=args.request_timeout_ms,
        dead_grace_ms=args.dead_grace_ms,
        max_pending_bytes_per_partition=args.max_pending_bytes,
        segment_bytes=args.segment_bytes,
        kube_namespace=args.kube_namespace or None,
        kube_cluster=args.kube_cluster or None,
        kube_config=args.kube_config or None,
        xdp_pin_dir=Path(args.xdp_pin_dir),
    )
