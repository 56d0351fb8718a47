"""A broker's configuration: BrokerConfig, and the `laminar serve` flags (each with a LAMINAR_*
variable) that make it. Both come from the one table of settings, laminar/settings.py: the
fields' defaults, the flags, their variables and help; the fields are checked against it here.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import os
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from .. import settings
from ..credentials import CredentialsError, token_problem
from ..credentials import load as load_credentials
from ..log.config import FsyncPolicy
from ..log.journal import MAX_JOURNAL_BYTES, MIN_JOURNAL_BYTES
from ..metadata.state import NODE_ID
from ..node.core import CoreConfig
from ..swim.member import MAX_WORKERS
from ..tls import TlsFiles
from ..workers import PORT_STRIDE, usable_cores, worker_id
from .logs import LogFormat, LogLevel

#: The ports and defaults are the settings table's (laminar/settings.py); these names stay
#: for their importers.
DEFAULT_API_PORT = settings.API_PORT.default
DEFAULT_PEER_PORT = settings.PEER_PORT.default
DEFAULT_GOSSIP_PORT = settings.GOSSIP_PORT.default
DEFAULT_XDP_PIN_DIR = settings.XDP_PIN_DIR.default
MIB = settings.MIB
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


#: What --otel-endpoint takes: an http(s) URL with a host (the exporter's own checks come later).
OTLP_URL = re.compile(r"https?://[^\s/?#]+(?:[/?][^\s]*)?")


class ConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    node_id: str
    data_dir: Path
    host: str = settings.HOST.default  # bind address for all three ports
    #: what peers and clients use; default: host
    advertise_host: str | None = settings.ADVERTISE_HOST.default
    api_port: int = settings.API_PORT.default
    peer_port: int = settings.PEER_PORT.default
    gossip_port: int = settings.GOSSIP_PORT.default
    #: gossip addresses ("host:port") of nodes to join through
    seeds: tuple[str, ...] = settings.SEEDS.default
    #: node ids that form the cluster at its first start (the metadata group's first voters
    #: are chosen among them); give every node the same list
    initial_nodes: tuple[str, ...] = settings.INITIAL_NODES.default
    cluster_id: str = settings.CLUSTER_ID.default
    #: the cluster secret: brokers authenticate each other with it (peer handshake, SWIM
    #: MACs); required, see `secret_problem`
    secret: bytes = field(default=settings.SECRET.default, repr=False)
    #: client credentials (docs/security.md, "Clients: authentication and authorization"):
    #: the credentials file (principals, their token hashes, roles and topics; re-read on
    #: SIGHUP and when it changes), one admin token (`--token-file`, for compatibility), or
    #: neither with `allow_anonymous` (an open API: requests without a token act as an admin);
    #: one of the three is required
    credentials_file: Path | None = settings.CREDENTIALS_FILE.default
    token: str | None = field(default=settings.TOKEN.default, repr=False)
    allow_anonymous: bool = settings.ALLOW_ANONYMOUS.default
    #: TLS (docs/security.md, "TLS"): this broker's certificate and key, and the CA bundle its
    #: peers' certificates are verified against; all three, or none (plain HTTP and TCP). With
    #: them the API is HTTPS only and the peer transport mutual TLS; the files are re-read
    #: when they change
    tls_cert_file: Path | None = settings.TLS_CERT_FILE.default
    tls_key_file: Path | None = settings.TLS_KEY_FILE.default
    tls_ca_file: Path | None = settings.TLS_CA_FILE.default
    fsync: FsyncPolicy = settings.FSYNC.default
    fsync_interval_ms: int = settings.FSYNC_INTERVAL_MS.default
    journal_bytes: int = settings.JOURNAL_BYTES.default
    tick_ms: int = settings.TICK_MS.default
    election_ticks: int = settings.ELECTION_TICKS.default
    max_request_bytes: int = settings.MAX_REQUEST_BYTES.default
    request_timeout_ms: int = settings.REQUEST_TIMEOUT_MS.default
    #: HTTP API connections (docs/api.md, "Limits"): a request's line and headers must arrive
    #: within header_timeout_ms, its body within body_timeout_ms once the broker reads it (else
    #: 408 and the connection is closed); a keep-alive connection idle for idle_timeout_ms is
    #: closed; one client address holds at most max_connections_per_client connections (more
    #: are answered 429 and closed)
    header_timeout_ms: int = settings.HEADER_TIMEOUT_MS.default
    body_timeout_ms: int = settings.BODY_TIMEOUT_MS.default
    idle_timeout_ms: int = settings.IDLE_TIMEOUT_MS.default
    max_connections_per_client: int = settings.MAX_CONNECTIONS_PER_CLIENT.default
    max_pending_bytes_per_partition: int = settings.MAX_PENDING_BYTES_PER_PARTITION.default
    #: a broker SWIM reports dead keeps its place in placement this long (a restart after a
    #: crash moves nothing); one that left keeps it until it is back (`counts_for_placement`)
    dead_grace_ms: int = settings.DEAD_GRACE_MS.default
    #: a handoff alone (a pod's preStop) leaves the broker leaving this long (docs/api.md)
    leaving_hold_ms: int = settings.LEAVING_HOLD_MS.default
    default_replication_factor: int = settings.DEFAULT_REPLICATION_FACTOR.default
    segment_bytes: int = settings.SEGMENT_BYTES.default
    #: Kubernetes status reporting (docs/kubernetes.md): the LaminarCluster object this broker
    #: belongs to and its namespace (both, or neither: no reporting), and a kubeconfig (None:
    #: KUBECONFIG, ~/.kube/config, else the pod's ServiceAccount)
    kube_namespace: str | None = settings.KUBE_NAMESPACE.default
    kube_cluster: str | None = settings.KUBE_CLUSTER.default
    kube_config: str | None = settings.KUBE_CONFIG.default
    #: where `laminar-xdp` pinned the XDP router's maps; its counters are exported as metrics
    #: when they are there and readable (without CAP_BPF: Linux >= 6.5)
    xdp_pin_dir: Path = settings.XDP_PIN_DIR.default
    #: worker processes (docs/workers.md; 0: one per usable core, or one with an ephemeral API
    #: or peer port, whose workers' ports could not be derived; resolved here), and which
    #: of them this process is (None: the supervisor of several, or the only one)
    workers: int = settings.WORKERS.default
    #: the port the workers share, where the kernel steers connections (0: none)
    steer_port: int = settings.STEER_PORT.default
    worker_index: int | None = settings.WORKER_INDEX.default
    #: the broker's own log lines (docs/logging.md): the lowest level written, and text or
    #: JSON lines
    log_level: LogLevel = settings.LOG_LEVEL.default
    log_format: LogFormat = settings.LOG_FORMAT.default
    #: where OpenTelemetry traces go (an OTLP/HTTP traces URL; None: no tracing)
    otel_endpoint: str | None = settings.OTEL_ENDPOINT.default

    def __post_init__(self) -> None:
        if not NODE_ID.fullmatch(self.node_id):
            raise ConfigError(f"node id {self.node_id!r} must match {NODE_ID.pattern}")
        if self.workers == 0:
            fixed_ports = bool(self.api_port and self.peer_port)
            object.__setattr__(self, "workers", usable_cores() if fixed_ports else 1)
        self._check_workers()
        for name in ("api_port", "peer_port", "gossip_port", "steer_port"):
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
        if (
            self.journal_bytes != 0
            and not MIN_JOURNAL_BYTES <= self.journal_bytes <= MAX_JOURNAL_BYTES
        ):
            raise ConfigError(
                f"--journal-bytes must be 0 (no journal) or in [{MIN_JOURNAL_BYTES}, "
                f"{MAX_JOURNAL_BYTES}]"
            )
        if not 0 <= self.leaving_hold_ms <= 86_400_000:
            raise ConfigError("--leaving-hold-ms must be in [0, 86400000] (a day)")
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
        if self.otel_endpoint is not None and not OTLP_URL.fullmatch(self.otel_endpoint):
            raise ConfigError(
                f"--otel-endpoint {self.otel_endpoint[:100]!r} must be an http:// or https:// "
                "URL of an OTLP/HTTP traces endpoint, e.g. http://collector:4318/v1/traces"
            )

    def _check_workers(self) -> None:
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ConfigError(f"--workers {self.workers} must be in [0, {MAX_WORKERS}]")
        index = self.worker_index
        if index is not None and not 0 <= index < self.workers:
            raise ConfigError(f"--worker-index {index} must be in [0, --workers {self.workers})")
        if self.steer_port and self.workers == 1:
            raise ConfigError("--steer-port steers connections to workers: it needs --workers > 1")
        if self.workers == 1:
            return
        if not (self.api_port and self.peer_port):
            raise ConfigError(
                "--workers above 1 needs fixed --api-port and --peer-port (worker w listens "
                f"on each plus {PORT_STRIDE}*w; peers find them so), not 0"
            )
        ports = [self.gossip_port, *([self.steer_port] if self.steer_port else [])]
        for w in range(self.workers):
            ports += [self.api_port + PORT_STRIDE * w, self.peer_port + PORT_STRIDE * w]
        if max(ports) >= 65_536 or len(set(ports)) != len(ports):
            raise ConfigError(
                f"--workers {self.workers}: worker w listens on the API port {self.api_port} "
                f"and the peer port {self.peer_port} plus {PORT_STRIDE}*w; those ports must "
                f"all differ from each other and from the gossip port {self.gossip_port} "
                "(and the steer port), and stay below 65536"
            )

    @property
    def supervises(self) -> bool:
        """This process starts and watches the workers (`laminar.server.supervisor`)."""
        return self.workers > 1 and self.worker_index is None

    @property
    def worker(self) -> int:
        return self.worker_index or 0

    @property
    def raft_id(self) -> str:
        """This worker's node id in the Raft groups (`laminar.workers`)."""
        return worker_id(self.node_id, self.worker)

    @property
    def worker_api_port(self) -> int:
        return self.api_port + PORT_STRIDE * self.worker if self.api_port else 0

    @property
    def worker_peer_port(self) -> int:
        return self.peer_port + PORT_STRIDE * self.worker if self.peer_port else 0

    @property
    def worker_data_dir(self) -> Path:
        """Worker 0's data is the data directory; worker w's, its workers/<w>."""
        return self.data_dir / "workers" / str(self.worker) if self.worker else self.data_dir

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


#: Settings whose flag names a file holding the value (read by `from_arguments`).
FROM_FILES = (settings.SECRET, settings.TOKEN)


def _check_against_the_table() -> None:
    """BrokerConfig has a field per setting of the table (laminar/settings.py), in its order,
    with its default; a required setting is a field without one."""
    fields = dataclasses.fields(BrokerConfig)
    if [f.name for f in fields] != [setting.name for setting in settings.SETTINGS]:
        raise TypeError("BrokerConfig's fields are not laminar/settings.py's settings")
    for f, setting in zip(fields, settings.SETTINGS, strict=True):
        missing = f.default is dataclasses.MISSING
        if setting.required != missing or (not missing and f.default != setting.default):
            raise TypeError(f"BrokerConfig.{f.name}'s default is not laminar/settings.py's")


_check_against_the_table()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`laminar serve` flags: one per setting of the table that has a flag; each defaults to
    its LAMINAR_* environment variable (an empty one is as unset), else the table's default."""
    for setting in settings.SETTINGS:
        if setting.flag is None or setting.env is None:
            continue
        raw = os.environ.get(setting.env) or None
        options: dict[str, Any] = {"help": _help(setting)}
        if setting.type is bool:
            truth = raw.strip().lower() in settings.TRUE_WORDS if raw else setting.default
            options.update(action="store_true", default=truth)
        elif issubclass(setting.type, Enum):
            options.update(default=raw or setting.default.value)
            options.update(choices=[member.value for member in setting.type])
        elif setting.type is int:
            # a variable's text is parsed as the flag's would be (a bad one: a usage error)
            options.update(type=int, default=raw or setting.default)
        elif raw is not None or setting in FROM_FILES or setting.default is None:
            options.update(default=raw)
        else:
            options.update(default=settings.text(setting.default))
        parser.add_argument(setting.flag, **options)


def _help(setting: settings.Setting[Any]) -> str:
    """The flag's help: the table's, then its variable and its default (when it has one)."""
    notes = ["required"] if setting.required else []
    if setting.type is bool:
        notes.append(f"env {setting.env}={'|'.join(settings.TRUE_WORDS)}")
    else:
        notes.append(f"env {setting.env}")
    if setting.default not in (None, (), b"") and setting.type is not bool:
        notes.append("default %(default)s")
    return f"{setting.help.replace('%', '%%')} [{'; '.join(notes)}]"


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


def _value(setting: settings.Setting[Any], parsed: Any) -> Any:
    """A setting's value from what argparse parsed for its flag (ints and booleans are
    parsed, the rest is text; empty text is the default)."""
    if not isinstance(parsed, str):
        return parsed
    if not parsed:
        return setting.default
    if setting.type is tuple:
        return _split(parsed)
    try:
        return setting.type(parsed)
    except ValueError as e:
        where = f"{setting.flag} (or {setting.env}) {parsed!r}"
        if issubclass(setting.type, Enum):  # (a variable's value: argparse checks the flag's)
            choices = ", ".join(member.value for member in setting.type)
            raise ConfigError(f"{where} is not one of {choices}") from None
        raise ConfigError(f"{where}: {e}") from None


def from_arguments(args: argparse.Namespace) -> BrokerConfig:
    for setting in settings.SETTINGS:
        if setting.required and not getattr(args, settings.dest(setting)):
            raise ConfigError(f"{setting.flag} (or {setting.env}) is required")
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
    values = {
        setting.name: _value(setting, getattr(args, settings.dest(setting)))
        for setting in settings.SETTINGS
        if setting.flag is not None and setting not in FROM_FILES
    }
    credentials_file = values["credentials_file"]
    if credentials_file is not None:
        try:
            load_credentials(credentials_file)  # refused now, with the reason, if unusable
        except CredentialsError as e:
            raise ConfigError(str(e)) from None
    return BrokerConfig(**values, secret=secret, token=token)


def core_config(config: BrokerConfig) -> CoreConfig:
    """What the node core takes of a broker's settings."""
    return CoreConfig(
        config.raft_id,
        election_ticks=config.election_ticks,
        segment_bytes=config.segment_bytes,
        fsync=config.fsync,
        fsync_interval_ms=config.fsync_interval_ms,
        journal_bytes=config.journal_bytes,
        max_pending_bytes_per_partition=config.max_pending_bytes_per_partition,
        dead_grace_ms=config.dead_grace_ms,
        initial_nodes=tuple(config.initial_nodes),
        joins=bool(config.seeds),
    )
