"""A broker's configuration: every knob is a `laminar serve` flag and a LAMINAR_* variable."""

from __future__ import annotations

import argparse
import base64
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..credentials import CredentialsError, token_problem
from ..credentials import load as load_credentials
from ..log.config import FsyncPolicy
from ..metadata.state import NODE_ID
from ..tls import TlsFiles

DEFAULT_API_PORT = 7070
DEFAULT_PEER_PORT = 7071
DEFAULT_GOSSIP_PORT = 7072
DEFAULT_XDP_PIN_DIR = Path("/sys/fs/bpf/laminar")
MIB = 1 << 20
#: The cluster secret (docs/security.md, "Peer traffic"): at least this many bytes ...
MIN_SECRET_BYTES = 32
#: ... with at least this many distinct byte values (8, not 16: a hex secret has only 16
#: symbols, and a random 64-character one lacks at least one of them about 1 time in 4) ...
MIN_SECRET_DISTINCT_BYTES = 8
#: ... and not a shorter sequence repeated (a period of at most half its length).
#: Random bytes in a generated secret (`laminar secret` writes them base64-encoded).
GENERATED_SECRET_BYTES = 32
HOW_TO_MAKE_A_SECRET = (
    "make one with `laminar secret FILE` (or `head -c 32 /dev/urandom | base64 > FILE`), give "
    "every broker of the cluster the same file"
)


NO_CREDENTIALS = (
    "no client credentials: every /v1 request needs a bearer token. Give --credentials-file "
    "FILE (or LAMINAR_CREDENTIALS_FILE; make one with `laminar credentials add FILE --name "
    "admin --role admin`, which prints the token), or --token-file FILE (one admin token); "
    "--allow-anonymous serves the API to anyone without a token, as an admin (insecure)"
)


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
    #: the cluster secret: brokers authenticate each other with it (peer handshake, SWIM
    #: MACs); required, see `secret_problem`
    secret: bytes = field(default=b"", repr=False)
    #: client credentials (docs/security.md, "Clients: authentication and authorization"):
    #: the credentials file (principals, their token hashes, roles and topics; re-read on
    #: SIGHUP and when it changes), one admin token (`--token-file`, for compatibility), or
    #: neither with `allow_anonymous` (an open API: requests without a token act as an admin);
    #: one of the three is required
    credentials_file: Path | None = None
    token: str | None = field(default=None, repr=False)
    allow_anonymous: bool = False
    #: TLS (docs/security.md, "TLS"): this broker's certificate and key, and the CA bundle its
    #: peers' certificates are verified against; all three, or none (plain HTTP and TCP). With
    #: them the API is HTTPS only and the peer transport mutual TLS; the files are re-read
    #: when they change
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = None
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = 100
    tick_ms: int = 100
    election_ticks: int = 10
    max_request_bytes: int = 8 * MIB
    request_timeout_ms: int = 10_000
    #: HTTP API connections (docs/api.md, "Limits"): a request's line and headers must arrive
    #: within header_timeout_ms, its body within body_timeout_ms once the broker reads it (else
    #: 408 and the connection is closed); a keep-alive connection idle for idle_timeout_ms is
    #: closed; one client address holds at most max_connections_per_client connections (more
    #: are answered 429 and closed)
    header_timeout_ms: int = 10_000
    body_timeout_ms: int = 30_000
    idle_timeout_ms: int = 60_000
    max_connections_per_client: int = 256
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
        for name in (
            "header_timeout_ms",
            "body_timeout_ms",
            "idle_timeout_ms",
            "max_connections_per_client",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive")
        if self.fsync_interval_ms < 1:
            raise ConfigError("fsync_interval_ms must be positive")
        if self.tick_ms < 5 or self.election_ticks < 3:
            raise ConfigError("tick_ms must be >= 5 and election_ticks >= 3")
        if (self.kube_namespace is None) != (self.kube_cluster is None):
            raise ConfigError("--kube-namespace and --kube-cluster go together")
        tls = (self.tls_cert_file, self.tls_key_file, self.tls_ca_file)
        if any(f is not None for f in tls) and not all(f is not None for f in tls):
            raise ConfigError(
                "--tls-cert-file, --tls-key-file and --tls-ca-file go together (the CA bundle "
                "verifies the other brokers' certificates: mutual TLS between brokers)"
            )
        if not self.secret:
            raise ConfigError(f"no cluster secret: {HOW_TO_MAKE_A_SECRET}")
        problem = secret_problem(self.secret)
        if problem is not None:
            raise ConfigError(f"the cluster secret {problem}; {HOW_TO_MAKE_A_SECRET}")
        if self.credentials_file is None and self.token is None and not self.allow_anonymous:
            raise ConfigError(NO_CREDENTIALS)

    @property
    def public_host(self) -> str:
        return self.advertise_host or self.host

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    @property
    def tls_files(self) -> TlsFiles | None:
        if self.tls_cert_file is None or self.tls_key_file is None or self.tls_ca_file is None:
            return None
        return TlsFiles(self.tls_cert_file, self.tls_key_file, self.tls_ca_file)

    @property
    def api_scheme(self) -> str:
        """The scheme of this cluster's API URLs (redirects, leader_url, api_url)."""
        return "https" if self.tls else "http"


def secret_problem(secret: bytes) -> str | None:
    """Why `secret` is too weak to be a cluster secret, or None. The rules catch accidents (a
    short word, a placeholder, one character repeated), not every weak choice: generate
    secrets randomly (`new_secret`)."""
    if len(secret) < MIN_SECRET_BYTES:
        return f"is {len(secret)} bytes long; at least {MIN_SECRET_BYTES} are required"
    distinct = len(set(secret))
    if distinct < MIN_SECRET_DISTINCT_BYTES:
        return (
            f"uses only {distinct} distinct byte values; at least "
            f"{MIN_SECRET_DISTINCT_BYTES} are required"
        )
    period = _period(secret)
    if period <= len(secret) // 2:
        return f"is a {period}-byte sequence repeated"
    return None


def _period(data: bytes) -> int:
    """The smallest p such that data[i] == data[i - p] for every i >= p (Knuth-Morris-Pratt
    failure function: p = n - the longest proper border)."""
    border = [0] * len(data)
    k = 0
    for i in range(1, len(data)):
        while k and data[i] != data[k]:
            k = border[k - 1]
        if data[i] == data[k]:
            k += 1
        border[i] = k
    return len(data) - (border[-1] if data else 0)


def new_secret() -> bytes:
    """A fresh random cluster secret as one line of text: base64 of 32 random bytes (44
    characters; 256 bits)."""
    return base64.b64encode(os.urandom(GENERATED_SECRET_BYTES)) + b"\n"


def read_secret_file(path: str) -> bytes:
    """The cluster secret in `path`. A text file (valid UTF-8, such as `laminar secret`
    writes) gives its content without surrounding whitespace (the trailing newline); any
    other file (raw random bytes, such as the operator's Secret) gives its bytes exactly."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read the secret file {path}: {e.strerror}") from e
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        data = data.strip()
    if not data:
        raise ConfigError(f"the secret file {path} is empty; {HOW_TO_MAKE_A_SECRET}")
    problem = secret_problem(data)
    if problem is not None:
        raise ConfigError(f"the cluster secret in {path} {problem}; {HOW_TO_MAKE_A_SECRET}")
    return data


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
    add(
        "--secret-file",
        default=env("secret-file"),
        help="file with the cluster secret, the same on every broker (required; make one with "
        "`laminar secret FILE`)",
    )
    add(
        "--credentials-file",
        default=env("credentials-file"),
        help="YAML file of the principals that may use the API: token hashes, roles, topics "
        "(re-read on SIGHUP and when it changes; `laminar credentials add` writes it)",
    )
    add(
        "--token-file",
        # not LAMINAR_TOKEN_FILE: that is the clients' (the `laminar` commands in a broker's
        # pod read it), and must not make a client's token a broker's admin token
        default=env("admin-token-file"),
        help="file with one admin bearer token (compatibility; read once at start; env "
        "LAMINAR_ADMIN_TOKEN_FILE)",
    )
    add(
        "--allow-anonymous",
        action="store_true",
        default=(env("allow-anonymous") or "").strip().lower() in ("1", "true", "yes"),
        help="INSECURE: serve requests without a token, as an admin (env "
        "LAMINAR_ALLOW_ANONYMOUS=true)",
    )
    add(
        "--tls-cert-file",
        default=env("tls-cert-file"),
        help="this broker's certificate (PEM, chain): the API serves HTTPS only, peers use "
        "mutual TLS (with --tls-key-file and --tls-ca-file; re-read when it changes)",
    )
    add("--tls-key-file", default=env("tls-key-file"), help="the certificate's private key (PEM)")
    add(
        "--tls-ca-file",
        default=env("tls-ca-file"),
        help="CA bundle (PEM) the brokers' certificates are verified against",
    )
    add("--fsync", default=env("fsync", "always"), choices=[p.value for p in FsyncPolicy])
    add("--fsync-interval-ms", type=int, default=int(env("fsync-interval-ms", "100") or 100))
    add("--tick-ms", type=int, default=int(env("tick-ms", "100") or 100))
    add("--max-request-bytes", type=int, default=int(env("max-request-bytes", str(8 * MIB)) or 0))
    add("--request-timeout-ms", type=int, default=int(env("request-timeout-ms", "10000") or 0))
    add(
        "--header-timeout-ms",
        type=int,
        default=int(env("header-timeout-ms", "10000") or 0),
        help="a request's line and headers must arrive within this long (else 408)",
    )
    add(
        "--body-timeout-ms",
        type=int,
        default=int(env("body-timeout-ms", "30000") or 0),
        help="a request's body must arrive within this long once read (else 408)",
    )
    add(
        "--idle-timeout-ms",
        type=int,
        default=int(env("idle-timeout-ms", "60000") or 0),
        help="an idle keep-alive API connection is closed after this long",
    )
    add(
        "--max-connections-per-client",
        type=int,
        default=int(env("max-connections-per-client", "256") or 0),
        help="API connections one client address may hold at once (more: 429, closed)",
    )
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


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (value or "").split(",") if part.strip())


def from_arguments(args: argparse.Namespace) -> BrokerConfig:
    if not args.node_id:
        raise ConfigError("--node-id (or LAMINAR_NODE_ID) is required")
    if not args.data_dir:
        raise ConfigError("--data-dir (or LAMINAR_DATA_DIR) is required")
    if not args.secret_file:
        raise ConfigError(
            f"--secret-file (or LAMINAR_SECRET_FILE) is required: the cluster secret "
            f"authenticates the brokers to each other; {HOW_TO_MAKE_A_SECRET}"
        )
    secret = read_secret_file(args.secret_file)
    token = _read_secret(args.token_file, "token").decode() if args.token_file else None
    if token is not None and (problem := token_problem(token)) is not None:
        raise ConfigError(
            f"the token in {args.token_file} {problem}; make one with `laminar credentials "
            "token FILE`"
        )
    credentials_file = _path(args.credentials_file)
    if credentials_file is not None:
        try:
            load_credentials(credentials_file)  # refused now, with the reason, if unusable
        except CredentialsError as e:
            raise ConfigError(str(e)) from None
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
        credentials_file=credentials_file,
        token=token,
        allow_anonymous=bool(args.allow_anonymous),
        tls_cert_file=_path(args.tls_cert_file),
        tls_key_file=_path(args.tls_key_file),
        tls_ca_file=_path(args.tls_ca_file),
        fsync=FsyncPolicy(args.fsync),
        fsync_interval_ms=args.fsync_interval_ms,
        tick_ms=args.tick_ms,
        max_request_bytes=args.max_request_bytes,
        request_timeout_ms=args.request_timeout_ms,
        header_timeout_ms=args.header_timeout_ms,
        body_timeout_ms=args.body_timeout_ms,
        idle_timeout_ms=args.idle_timeout_ms,
        max_connections_per_client=args.max_connections_per_client,
        dead_grace_ms=args.dead_grace_ms,
        max_pending_bytes_per_partition=args.max_pending_bytes,
        segment_bytes=args.segment_bytes,
        kube_namespace=args.kube_namespace or None,
        kube_cluster=args.kube_cluster or None,
        kube_config=args.kube_config or None,
        xdp_pin_dir=Path(args.xdp_pin_dir),
    )
