"""Every broker setting, once: its `BrokerConfig` field, type, default, unit, `laminar serve`
flag, LAMINAR_* variable, the LaminarCluster field that sets it (if any) and what it does.

The rest is made from or checked against this table: `laminar.server.config` (BrokerConfig's
defaults, the flags, their LAMINAR_* fallbacks and help), the operator's ConfigMap of broker
settings (`laminar_operator.manifests.broker_settings`, from the CRD paths) and its ports; the
test tests/test_settings.py holds it against BrokerConfig, the flags, the CRD and the docs.
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from .log.config import FsyncPolicy
from .server.logs import LogFormat, LogLevel

T = TypeVar("T")

MIB = 1 << 20
#: Every broker setting's variable starts with this.
ENV_PREFIX = "LAMINAR_"
#: The values of a boolean setting's variable that mean true (anything else: false).
TRUE_WORDS = ("1", "true", "yes")


@dataclass(frozen=True, slots=True)
class Setting(Generic[T]):
    """One broker setting: a field of BrokerConfig."""

    #: the BrokerConfig field (its unit, when it has one, ends it or precedes `_per_`)
    name: str
    #: the class of its values besides None: int, str, bool, Path, FsyncPolicy, bytes, or
    #: tuple (of str; a comma-separated list on the command line)
    type: type[Any]
    #: BrokerConfig's default (None for a required setting, which has none)
    default: T
    #: what it does: the flag's help
    help: str
    #: `ms`, `bytes`, `ticks` or None (a count, a name, a path)
    unit: str | None = None
    #: the `laminar serve` flag; None: only BrokerConfig(...) sets it (no flag, no variable)
    flag: str | None = None
    #: the environment variable the flag defaults to
    env: str | None = None
    #: the LaminarCluster field the operator sets it from (the brokers' ConfigMap), if any
    crd_path: str | None = None
    #: no default: `laminar serve` refuses to start without it
    required: bool = False


NODE_ID = Setting(
    "node_id",
    str,
    None,
    "this node's id, unique in the cluster",
    flag="--node-id",
    env="LAMINAR_NODE_ID",
    required=True,
)
DATA_DIR = Setting(
    "data_dir",
    Path,
    None,
    "where logs live",
    flag="--data-dir",
    env="LAMINAR_DATA_DIR",
    required=True,
)
HOST = Setting(
    "host", str, "127.0.0.1", "bind address of all three ports", flag="--host", env="LAMINAR_HOST"
)
ADVERTISE_HOST = Setting(
    "advertise_host",
    str,
    None,
    "address peers/clients use (unset: --host)",
    flag="--advertise-host",
    env="LAMINAR_ADVERTISE_HOST",
)
API_PORT = Setting(
    "api_port",
    int,
    7070,
    "TCP port of the HTTP API (clients, /metrics)",
    flag="--api-port",
    env="LAMINAR_API_PORT",
)
PEER_PORT = Setting(
    "peer_port",
    int,
    7071,
    "TCP port of the peer transport (Raft between brokers)",
    flag="--peer-port",
    env="LAMINAR_PEER_PORT",
)
GOSSIP_PORT = Setting(
    "gossip_port",
    int,
    7072,
    "UDP port of SWIM gossip (membership)",
    flag="--gossip-port",
    env="LAMINAR_GOSSIP_PORT",
)
SEEDS = Setting(
    "seeds",
    tuple,
    (),
    "comma-separated gossip host:port of peers",
    flag="--seeds",
    env="LAMINAR_SEEDS",
)
INITIAL_NODES = Setting(
    "initial_nodes",
    tuple,
    (),
    "comma-separated node ids forming the cluster at first start (same on every node)",
    flag="--initial-nodes",
    env="LAMINAR_INITIAL_NODES",
)
CLUSTER_ID = Setting(
    "cluster_id",
    str,
    "laminar",
    "the cluster's id, the same on every broker (peers of another cluster are refused)",
    flag="--cluster-id",
    env="LAMINAR_CLUSTER_ID",
)
SECRET = Setting(
    "secret",
    bytes,
    b"",
    "file with the cluster secret, the same on every broker (required; make one with "
    "`laminar secret FILE`)",
    flag="--secret-file",
    env="LAMINAR_SECRET_FILE",
)
CREDENTIALS_FILE = Setting(
    "credentials_file",
    Path,
    None,
    "YAML file of the principals that may use the API: token hashes, roles, topics (re-read "
    "on SIGHUP and when it changes; `laminar credentials add` writes it)",
    flag="--credentials-file",
    env="LAMINAR_CREDENTIALS_FILE",
)
TOKEN = Setting(
    "token",
    str,
    None,
    "file with one admin bearer token (compatibility; read once at start)",
    flag="--token-file",
    # not LAMINAR_TOKEN_FILE: that is the clients' (the `laminar` commands in a broker's pod
    # read it), and must not make a client's token a broker's admin token
    env="LAMINAR_ADMIN_TOKEN_FILE",
)
ALLOW_ANONYMOUS = Setting(
    "allow_anonymous",
    bool,
    False,
    "INSECURE: serve requests without a token, as an admin",
    flag="--allow-anonymous",
    env="LAMINAR_ALLOW_ANONYMOUS",
)
TLS_CERT_FILE = Setting(
    "tls_cert_file",
    Path,
    None,
    "this broker's certificate (PEM, chain): the API serves HTTPS only, peers use mutual TLS "
    "(with --tls-key-file and --tls-ca-file; re-read when it changes)",
    flag="--tls-cert-file",
    env="LAMINAR_TLS_CERT_FILE",
)
TLS_KEY_FILE = Setting(
    "tls_key_file",
    Path,
    None,
    "the certificate's private key (PEM)",
    flag="--tls-key-file",
    env="LAMINAR_TLS_KEY_FILE",
)
TLS_CA_FILE = Setting(
    "tls_ca_file",
    Path,
    None,
    "CA bundle (PEM) the brokers' certificates are verified against",
    flag="--tls-ca-file",
    env="LAMINAR_TLS_CA_FILE",
)
FSYNC = Setting(
    "fsync",
    FsyncPolicy,
    FsyncPolicy.ALWAYS,
    "when appends are made durable: always (an append completes after an fdatasync covering "
    "it), interval (every --fsync-interval-ms) or never (benchmarks only)",
    flag="--fsync",
    env="LAMINAR_FSYNC",
    crd_path="spec.config.fsync",
)
FSYNC_INTERVAL_MS = Setting(
    "fsync_interval_ms",
    int,
    100,
    "with --fsync interval: how often the log is fdatasynced",
    unit="ms",
    flag="--fsync-interval-ms",
    env="LAMINAR_FSYNC_INTERVAL_MS",
)
JOURNAL_BYTES = Setting(
    "journal_bytes",
    int,
    64 << 20,
    "with --fsync always: the size of each worker's journal, one file in which a round's log "
    "writes are made durable by one fdatasync instead of one per log (72 KiB to 16 GiB, or 0: "
    "none, each log fdatasyncs itself). It adds throughput to small appends "
    "(docs/reliability.md)",
    unit="bytes",
    flag="--journal-bytes",
    env="LAMINAR_JOURNAL_BYTES",
)
TICK_MS = Setting(
    "tick_ms",
    int,
    100,
    "the Raft clock's tick: heartbeats every tick, elections after election_ticks",
    unit="ms",
    flag="--tick-ms",
    env="LAMINAR_TICK_MS",
)
ELECTION_TICKS = Setting(
    "election_ticks",
    int,
    10,
    "ticks without a leader before a follower campaigns (randomized up to twice this)",
    unit="ticks",
)
MAX_REQUEST_BYTES = Setting(
    "max_request_bytes",
    int,
    8 * MIB,
    "largest API request body accepted (else 413)",
    unit="bytes",
    flag="--max-request-bytes",
    env="LAMINAR_MAX_REQUEST_BYTES",
)
REQUEST_TIMEOUT_MS = Setting(
    "request_timeout_ms",
    int,
    10_000,
    "how long an API request waits for its change to commit",
    unit="ms",
    flag="--request-timeout-ms",
    env="LAMINAR_REQUEST_TIMEOUT_MS",
)
HEADER_TIMEOUT_MS = Setting(
    "header_timeout_ms",
    int,
    10_000,
    "a request's line and headers must arrive within this long (else 408)",
    unit="ms",
    flag="--header-timeout-ms",
    env="LAMINAR_HEADER_TIMEOUT_MS",
)
BODY_TIMEOUT_MS = Setting(
    "body_timeout_ms",
    int,
    30_000,
    "a request's body must arrive within this long once read (else 408)",
    unit="ms",
    flag="--body-timeout-ms",
    env="LAMINAR_BODY_TIMEOUT_MS",
)
IDLE_TIMEOUT_MS = Setting(
    "idle_timeout_ms",
    int,
    60_000,
    "an idle keep-alive API connection is closed after this long",
    unit="ms",
    flag="--idle-timeout-ms",
    env="LAMINAR_IDLE_TIMEOUT_MS",
)
MAX_CONNECTIONS_PER_CLIENT = Setting(
    "max_connections_per_client",
    int,
    256,
    "API connections one client address may hold at once (more: 429, closed)",
    flag="--max-connections-per-client",
    env="LAMINAR_MAX_CONNECTIONS_PER_CLIENT",
)
MAX_PENDING_BYTES_PER_PARTITION = Setting(
    "max_pending_bytes_per_partition",
    int,
    64 * MIB,
    "per partition: bytes of appends awaiting commit before 429",
    unit="bytes",
    flag="--max-pending-bytes",
    env="LAMINAR_MAX_PENDING_BYTES",
)
DEAD_GRACE_MS = Setting(
    "dead_grace_ms",
    int,
    30_000,
    "a broker SWIM reports dead (crashed, unreachable) keeps its replicas this long, then "
    "placement replaces it; one that left (a graceful stop) keeps them until it is back",
    unit="ms",
    flag="--dead-grace-ms",
    env="LAMINAR_DEAD_GRACE_MS",
)
LEAVING_HOLD_MS = Setting(
    "leaving_hold_ms",
    int,
    60_000,
    "after a handoff (POST /v1/nodes/{id}/handoff: a pod's preStop), the broker stays leaving "
    "this long: no leadership is handed to it or back to it (a stopping broker stays leaving "
    "until it is gone)",
    unit="ms",
    flag="--leaving-hold-ms",
    env="LAMINAR_LEAVING_HOLD_MS",
)
DEFAULT_REPLICATION_FACTOR = Setting(
    "default_replication_factor",
    int,
    3,
    "the replication factor of topics created without one (not read yet: the API takes at "
    "most 3, at most the brokers there are)",
)
SEGMENT_BYTES = Setting(
    "segment_bytes",
    int,
    64 * MIB,
    "a log segment rolls once it holds this many bytes",
    unit="bytes",
    flag="--segment-bytes",
    env="LAMINAR_SEGMENT_BYTES",
    crd_path="spec.config.segmentBytes",
)
KUBE_NAMESPACE = Setting(
    "kube_namespace",
    str,
    None,
    "report status to Kubernetes: the LaminarCluster object's namespace (with --kube-cluster)",
    flag="--kube-namespace",
    env="LAMINAR_KUBE_NAMESPACE",
)
KUBE_CLUSTER = Setting(
    "kube_cluster",
    str,
    None,
    "the LaminarCluster object's name (with --kube-namespace)",
    flag="--kube-cluster",
    env="LAMINAR_KUBE_CLUSTER",
)
KUBE_CONFIG = Setting(
    "kube_config",
    str,
    None,
    "kubeconfig for the status reports (unset: KUBECONFIG, ~/.kube/config, else the pod's "
    "ServiceAccount)",
    flag="--kube-config",
    env="LAMINAR_KUBE_CONFIG",
)
XDP_PIN_DIR = Setting(
    "xdp_pin_dir",
    Path,
    Path("/sys/fs/bpf/laminar"),
    "the XDP router's pinned maps (laminar-xdp --pin-dir), exported as metrics",
    flag="--xdp-pin-dir",
    env="LAMINAR_XDP_PIN_DIR",
)

#: The table, in BrokerConfig's order (every Setting above).
WORKERS = Setting(
    "workers",
    int,
    0,
    "worker processes, each owning a share of the partitions (docs/workers.md); 0 (the "
    "default): one per usable core (the CPU affinity, capped by the cgroup's CPU quota), or "
    "one with an ephemeral (0) API or peer port. Worker w listens on the API and peer ports "
    "plus 3*w",
    flag="--workers",
    env="LAMINAR_WORKERS",
    crd_path="spec.workersPerPod",
)
STEER_PORT = Setting(
    "steer_port",
    int,
    0,
    "with --workers above 1: one more API port, shared by the workers, on which the kernel "
    "hands each new connection to worker (its TCP source port mod workers) (docs/workers.md, "
    "routing layer 3); 0: none",
    flag="--steer-port",
    env="LAMINAR_STEER_PORT",
)
WORKER_INDEX = Setting(
    "worker_index",
    int,
    None,
    "internal: which worker this process is (the supervisor `laminar serve --workers N` "
    "starts gives it)",
    flag="--worker-index",
    env="LAMINAR_WORKER_INDEX",
)
LOG_LEVEL = Setting(
    "log_level",
    LogLevel,
    LogLevel.INFO,
    "the lowest level of the broker's log lines, the libraries' info at the lowest "
    "(docs/logging.md)",
    flag="--log-level",
    env="LAMINAR_LOG_LEVEL",
    crd_path="spec.config.logLevel",
)
LOG_FORMAT = Setting(
    "log_format",
    LogFormat,
    LogFormat.TEXT,
    "text, or json: one JSON object per line with the node, and the request id, topic and "
    "partition of the request being served (docs/logging.md)",
    flag="--log-format",
    env="LAMINAR_LOG_FORMAT",
    crd_path="spec.config.logFormat",
)
OTEL_ENDPOINT = Setting(
    "otel_endpoint",
    str,
    None,
    "send OpenTelemetry traces (a span per API request, an append's steps to its commit) to "
    "this OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces; needs the "
    "laminar-mq[tracing] extra (unset: no tracing)",
    flag="--otel-endpoint",
    env="LAMINAR_OTEL_ENDPOINT",
    crd_path="spec.config.otelEndpoint",
)
SETTINGS: tuple[Setting[Any], ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, Setting)
)


def by_name(name: str) -> Setting[Any]:
    """The setting of BrokerConfig's field `name` (KeyError: none)."""
    for setting in SETTINGS:
        if setting.name == name:
            return setting
    raise KeyError(name)


def dest(setting: Setting[Any]) -> str:
    """The attribute argparse stores the setting's flag in (`--max-pending-bytes`:
    max_pending_bytes)."""
    if setting.flag is None:
        raise ValueError(f"{setting.name} has no flag")
    return setting.flag.removeprefix("--").replace("-", "_")


def variable(setting: Setting[Any]) -> str:
    """The setting's LAMINAR_* variable (ValueError: it has none)."""
    if setting.env is None:
        raise ValueError(f"{setting.name} has no variable")
    return setting.env


def text(value: object) -> str:
    """A value as a LAMINAR_* variable or a CRD field gives it: booleans as true/false,
    lists comma-separated."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return ",".join(str(part) for part in value)
    return str(value)
