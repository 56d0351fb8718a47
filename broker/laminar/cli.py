"""The `laminar` command."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from . import __version__
from .cli_help import COMPLETION_SHELLS, Parser, completion_script
from .log import (
    FileDirectory,
    FsyncPolicy,
    LogConfig,
    LogError,
    Record,
    SegmentedLog,
    StorageError,
    decode_batches,
    encode_batch,
)
from .log.segment import STORE_SUFFIX, parse_segment_name
from .log.snapshot import SnapshotDirectory

if TYPE_CHECKING:
    from .local_cluster import LocalCluster

DEMO_RECORDS_PER_BATCH = 100
DEMO_VALUE_BYTES = 1120


def _demo(data_dir: str, records: int) -> dict[str, object]:
    """Durable appends one at a time, each batch written and then fdatasynced (a broker round
    with a lone producer; concurrent producers' batches share a round's fdatasync), then
    reopen (recovery) and read everything back."""
    config = LogConfig(segment_bytes=8 << 20, fsync=FsyncPolicy.ALWAYS)
    log = SegmentedLog.open(FileDirectory(data_dir), config)
    started_index = log.next_index
    batches = max(1, records // DEMO_RECORDS_PER_BATCH)
    t0 = time.perf_counter()
    for b in range(batches):
        batch = encode_batch(
            [
                Record(
                    value=f"record {b * DEMO_RECORDS_PER_BATCH + i}".encode().ljust(
                        DEMO_VALUE_BYTES, b"."
                    ),
                    key=f"key-{i % 8}".encode(),
                )
                for i in range(DEMO_RECORDS_PER_BATCH)
            ]
        )
        log.append(batch, term=1)
        log.sync()
    produce_s = time.perf_counter() - t0
    written = log.next_index - started_index
    log.close()

    reopened = SegmentedLog.open(FileDirectory(data_dir), config)
    t0 = time.perf_counter()
    read_records = 0
    index = started_index
    while index < reopened.next_index:
        result = reopened.read_range(index, 4 << 20)
        read_records += sum(1 for r in decode_batches(result.data) if r.index >= index)
        index = result.next_index
    read_s = time.perf_counter() - t0
    summary: dict[str, object] = {
        "data_dir": data_dir,
        "records_appended": written,
        "records_read_back": read_records,
        "durable_appends_per_s": round(batches / produce_s, 1),
        "durable_mb_s": round(batches * len(batch) / produce_s / 1e6, 1),
        "read_mb_s": round(reopened.size_bytes / read_s / 1e6, 1) if read_s else None,
        "segments": len(reopened.segment_base_indexes),
        "log": [reopened.start_index, reopened.next_index],
        "recovery_cuts": list(reopened.recovery.cuts),
    }
    reopened.close()
    if read_records != written:
        raise LogError(f"read back {read_records} records, appended {written}")
    return summary


def _inspect(data_dir: str) -> dict[str, object]:
    """Describe the log in `data_dir` without changing anything on disk: recovery runs on
    copies in memory (laminar.log.snapshot), so the report says what opening it would repair.
    A path that is not a directory holding segment files is an error, never made a log."""
    if not os.path.exists(data_dir):
        raise LogError(f"{data_dir}: no such directory")
    if not os.path.isdir(data_dir):
        raise LogError(f"{data_dir}: not a directory (give the log's directory)")
    directory = SnapshotDirectory(data_dir)
    parsed = (parse_segment_name(name) for name in directory.names())
    if not any(p is not None and p[1] == STORE_SUFFIX for p in parsed):
        raise LogError(f"{data_dir}: no log here (no segment files *{STORE_SUFFIX})")
    log = SegmentedLog.open(directory, LogConfig(fsync=FsyncPolicy.NEVER))
    try:
        segments = [
            {
                "base_index": s.base_index,
                "next_index": s.next_index,
                "bytes": s.size,
                "batches": len(s.index),
                "sealed_ms": s.store.sealed_ms,
                "created_ms": s.store.created_ms,
            }
            for s in log._segments
        ]
        return {
            "start_index": log.start_index,
            "next_index": log.next_index,
            "bytes": log.size_bytes,
            "last_term": log.last_term,
            "segments": segments,
            "recovery": {
                "cuts": list(log.recovery.cuts),
                "repairs": list(log.recovery.repairs),
                "cut_bytes": log.recovery.cut_bytes,
                "corrupt_indexes": list(log.recovery.corrupt_indexes),
            },
        }
    finally:
        log.close()


def _local_cluster(args: argparse.Namespace) -> int:
    from .local_cluster import DEFAULT_PREFIX, STATE_FILE, LocalCluster

    data_dir = Path(args.data_dir)
    if args.action == "up":
        stored = None
        if (data_dir / STATE_FILE).exists():
            stored = LocalCluster.load(data_dir, fsync=args.fsync)
            running = [n.id for n in stored.nodes.values() if n.alive()]
            if running:
                return _local_cluster_restart(stored, running, args)
        # what the data directory's cluster was (for a later `up`), or the defaults
        cluster = LocalCluster(
            data_dir,
            _given(args.nodes, len(stored.initial) if stored else 3),
            fsync=args.fsync,
            prefix=_given(args.prefix, stored.prefix if stored else DEFAULT_PREFIX),
            tls=_given(args.tls, stored.tls if stored else True),
            workers=_given(args.workers, stored.workers if stored else 1),
        )
        if args.prefix is None:  # no range asked for: the next free one if this one is taken
            busy = cluster.move_to_free_prefix()
            if busy:
                print(
                    f"laminar: {', '.join(busy)} in use; using {cluster.prefix}.* instead",
                    file=sys.stderr,
                )
        try:
            cluster.start()
        except BaseException:
            cluster.stop()
            raise
        return _local_cluster_serve(cluster, args.detach)
    cluster = LocalCluster.load(data_dir)
    if args.action == "down":
        stopped = cluster.stop()  # only the brokers that were running
        if not stopped:
            print(f"no brokers running in {data_dir}")
        else:
            plural = "s" if len(stopped) != 1 else ""
            print(f"stopped {len(stopped)} broker{plural}: {', '.join(stopped)}")
        return 0
    from .local_cluster import probe

    for node in cluster.nodes.values():
        ready = probe(node.api_url + "/readyz", ca_file=cluster.ca_file) if node.alive() else None
        state = "down" if not node.alive() else ("ready" if ready == 200 else "not ready")
        print(f"{node.id}  {node.api_url}  pid {node.pid}  {state}")
    return 0


_T = TypeVar("_T")


def _given(value: _T | None, otherwise: _T) -> _T:
    """An option's value, or `otherwise` when it was not given."""
    return otherwise if value is None else value


def _local_cluster_restart(
    cluster: LocalCluster, running: list[str], args: argparse.Namespace
) -> int:
    """`up` on a partly running cluster: start its missing brokers as they were (ids,
    addresses, data), leaving the running ones alone; options that would change it refused."""
    asked = {
        "--nodes": (args.nodes, len(cluster.initial)),
        "--prefix": (args.prefix, cluster.prefix),
        "--tls": (args.tls, cluster.tls),
        "--workers": (args.workers, cluster.workers),
    }
    for option, (value, current) in asked.items():
        if value is not None and value != current:
            print(
                f"laminar: {', '.join(running)} running in {cluster.data_dir} with {option} "
                f"{current}; `laminar local-cluster down` first to change it",
                file=sys.stderr,
            )
            return 1
    if len(running) == len(cluster.nodes):
        print(
            f"laminar: {', '.join(running)} already running in {cluster.data_dir}", file=sys.stderr
        )
        return 1
    started = cluster.start_missing()
    print(f"started {', '.join(started)}; {', '.join(running)} already running")
    return _local_cluster_serve(cluster, args.detach)


def _local_cluster_serve(cluster: LocalCluster, detach: bool) -> int:
    """Print where a started cluster answers; unless `detach`, stop it on Ctrl-C or when a
    broker exits."""
    for node in cluster.nodes.values():
        print(f"{node.id}  {node.api_url}  pid {node.pid}")
    print(f"export LAMINAR_BROKERS={','.join(cluster.urls)}")
    # the admin token (the brokers require one): client commands and AsyncClient read it
    print(f"export LAMINAR_TOKEN_FILE={cluster.token_file}")
    if cluster.ca_file is not None:  # what clients verify the brokers' certificates with
        print(f"export LAMINAR_CA_FILE={cluster.ca_file}")
    if detach:
        return 0
    # The handlers are in place before the line that invites Ctrl-C is out, so a signal at
    # any instant after it only sets `stopping`: a KeyboardInterrupt could land between the
    # line's write and a `try`, and escape. SIGTERM stops the brokers the same way.
    stopping = threading.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda *_: stopping.set()) for s in signals}
    try:
        print("running; Ctrl-C stops the cluster", flush=True)
        while not stopping.wait(0.5):
            if not all(n.alive() for n in cluster.nodes.values()):
                print("laminar: a broker exited; stopping the cluster", file=sys.stderr)
                break
    finally:  # a second Ctrl-C while the brokers stop interrupts as usual
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    cluster.stop()
    return 0


def _secret(path: str | None) -> int:
    """`laminar secret [FILE]`: a new random cluster secret, on stdout or in a new file that
    only its owner can read (an existing file is never overwritten)."""
    from .server.config import new_secret

    secret = new_secret()
    if path is None:
        sys.stdout.write(secret.decode())
        return 0
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        print(f"laminar secret: cannot create {path}: {e.strerror}", file=sys.stderr)
        return 1
    with os.fdopen(descriptor, "wb") as file:
        file.write(secret)
    print(f"wrote a new cluster secret to {path}; give every broker the same file", file=sys.stderr)
    return 0


def _credentials(args: argparse.Namespace) -> int:
    """`laminar credentials add|retire|token|hash`: the brokers' credentials file and tokens
    (docs/security.md, "Clients: authentication and authorization")."""
    from . import credentials

    try:
        if args.action == "token":
            token = credentials.new_token()
            if args.file is None:
                print(token)
                return 0
            credentials.write_new_file(args.file, token + "\n")
            print(f"wrote a new token to {args.file}", file=sys.stderr)
            return 0
        if args.action == "hash":
            token = sys.stdin.readline().strip()
            if not token:
                print("laminar credentials hash: give the token on stdin", file=sys.stderr)
                return 1
            print(credentials.token_hash(token))
            return 0
        if args.action == "retire":
            removed = credentials.retire_tokens(args.file, args.name, args.keep)
            print(f"removed {removed} of {args.name}'s tokens from {args.file}", file=sys.stderr)
            return 0
        token = credentials.add_principal(args.file, args.name, args.role or (), args.topic or ())
    except (credentials.CredentialsError, OSError) as e:
        print(f"laminar credentials: {e}", file=sys.stderr)
        return 1
    if args.token_file:
        try:
            credentials.write_new_file(args.token_file, token + "\n")
        except OSError as e:
            print(f"laminar credentials: cannot create {args.token_file}: {e}", file=sys.stderr)
            print(token)  # the hash is in the file already: the token must not be lost
            return 1
        print(f"the token is in {args.token_file} (mode 600)", file=sys.stderr)
    else:
        print(token)
    print(
        f"added a token for {args.name} to {args.file}; running brokers re-read it within "
        "seconds (or at once on SIGHUP)",
        file=sys.stderr,
    )
    return 0


def _add_credentials_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "credentials", help="client tokens and the brokers' credentials file (--credentials-file)"
    )
    actions = parser.add_subparsers(dest="action", required=True)
    add = actions.add_parser(
        "add",
        help="a new token for a principal (made if new), printed once; only its hash is kept",
    )
    add.add_argument("file", help="the credentials file (made, mode 600, when missing)")
    add.add_argument("--name", required=True, help="the principal")
    add.add_argument(
        "--role",
        action="append",
        choices=["admin", "producer", "consumer"],
        help="its role (repeat for producer and consumer); a new principal needs one",
    )
    add.add_argument(
        "--topic",
        action="append",
        metavar="PATTERN",
        help="a topic it may use: a name, a prefix ending in *, or * (repeat)",
    )
    add.add_argument("--token-file", help="write the token to this new file (mode 600)")
    retire = actions.add_parser(
        "retire", help="remove a principal's older tokens (the end of a rotation)"
    )
    retire.add_argument("file", help="the credentials file")
    retire.add_argument("--name", required=True, help="the principal")
    retire.add_argument("--keep", type=int, default=1, help="newest tokens kept")
    token = actions.add_parser(
        "token", help="a new random token, printed or written to a new file (mode 600)"
    )
    token.add_argument("file", nargs="?", help="create this file (default: print the token)")
    actions.add_parser("hash", help="the sha256: hash of the token on stdin")


def build_parser() -> argparse.ArgumentParser:
    """The `laminar` command's parser, every subcommand's included (its help, and the shell
    completion scripts made from it, list every option with its default)."""
    parser: argparse.ArgumentParser = Parser(prog="laminar", description="Laminar message queue")
    parser.add_argument("--version", action="version", version=f"laminar {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    cluster_demo = commands.add_parser(
        "demo", help="3 brokers on loopback: create a topic, produce, consume, show status"
    )
    cluster_demo.add_argument("--messages", type=int, default=12, help="records produced")
    cluster_demo.add_argument(
        "--data-dir", help="keep the brokers' data here (default: a temporary directory)"
    )
    demo = commands.add_parser(
        "log-demo", help="single-node log demo: durable appends (each fdatasynced), reopen, read"
    )
    demo.add_argument("--data-dir", help="log directory (default: a temporary one, removed)")
    demo.add_argument("--records", type=int, default=20_000, help="records to append")
    inspect = commands.add_parser(
        "inspect",
        help="describe a log directory (JSON); read only: what recovery would repair is "
        "reported, not done",
    )
    inspect.add_argument("data_dir", help="a partition's log directory (its *.log segments)")
    serve = commands.add_parser("serve", help="run one broker")
    from .server.config import add_arguments

    add_arguments(serve)
    secret = commands.add_parser(
        "secret", help="print a new random cluster secret, or write it to a new file (mode 600)"
    )
    secret.add_argument("file", nargs="?", help="create this file (never overwritten)")
    _add_credentials_parser(commands)
    local = commands.add_parser("local-cluster", help="brokers on loopback, no Kubernetes")
    # --nodes, --workers, --prefix, --tls: None when not given (the data directory's cluster's,
    # or the default: 3, 1, the first free range from 127.0.0, on)
    local.add_argument(
        "action",
        choices=["up", "down", "status"],
        help="up: start the brokers (those missing, when some run); down: stop them; status: "
        "each broker's address, process and readiness",
    )
    local.add_argument(
        "--nodes", type=int, help="brokers (default: the data directory's cluster's, else 3)"
    )
    local.add_argument(
        "--data-dir",
        default="laminar-data",
        help="the brokers' data, their token, secret and CA; where `down` and `status` look",
    )
    local.add_argument("--detach", action="store_true", help="leave the brokers running and return")
    local.add_argument(
        "--fsync",
        default="always",
        choices=["always", "interval", "never"],
        help="when the brokers fsync their logs (`laminar serve --fsync`)",
    )
    local.add_argument(
        "--workers",
        type=int,
        help="worker processes per broker (docs/workers.md; 0: one per usable core; default 1)",
    )
    local.add_argument(
        "--prefix",
        help="loopback /24 to use: broker i is <prefix>.<10+i> (default: 127.0.0, or the next "
        "free one, 127.0.1, ..., when its addresses are in use)",
    )
    local.add_argument(
        "--tls",
        action=argparse.BooleanOptionalAction,
        help="HTTPS and mutual TLS between brokers, with a CA made in DATA_DIR/tls (default: "
        "on; the CA file is printed as LAMINAR_CA_FILE)",
    )
    bench = commands.add_parser("bench", help="measure a running cluster (produce / consume)")
    from .bench import add_arguments as add_bench_arguments

    add_bench_arguments(bench)
    from .client import commands as client_commands

    client_commands.add_connection_arguments(bench, timeout=False)
    bench.add_argument("--json", action="store_true", help="the figures as JSON, last line")
    client_commands.add_commands(commands)
    completion = commands.add_parser(
        "completion",
        help="print the shell completion script of the laminar command",
        description='Print the completion script for SHELL. bash: `eval "$(laminar completion '
        'bash)"` in ~/.bashrc; zsh: `laminar completion zsh > ~/.zfunc/_laminar` with ~/.zfunc '
        "in $fpath before compinit.",
    )
    completion.add_argument("shell", choices=COMPLETION_SHELLS, help="the shell")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from .client import commands as client_commands

    parser = build_parser()
    args = parser.parse_args(argv)

    try:
        outcome = client_commands.run(args)
        if outcome is not None:
            return outcome
        if args.command == "serve":
            from .server.app import run as run_broker
            from .server.config import ConfigError, from_arguments

            try:
                config = from_arguments(args)
            except ConfigError as e:
                parser.error(str(e))
            if config.supervises:
                from .server.supervisor import supervise

                return supervise(config, list(sys.argv[1:] if argv is None else argv))
            run_broker(config)
            return 0
        if args.command == "bench":
            from . import bench as bench_module

            problem = bench_module.check(args)
            if problem:
                parser.error(problem)
            try:
                brokers, token = client_commands.connection(args)
            except (client_commands.UsageError, client_commands.CommandError) as e:
                parser.error(str(e))
            figures = asyncio.run(bench_module.run(args, brokers, token))
            bench_module.print_result(figures, args.json)
            return 0
        if args.command == "demo":
            from .demo import run_demo

            if not 1 <= args.messages <= 10_000:
                parser.error("--messages must be in 1..10000")
            run_demo(args.messages, args.data_dir)
            return 0
        if args.command == "local-cluster":
            return _local_cluster(args)
        if args.command == "secret":
            return _secret(args.file)
        if args.command == "completion":
            sys.stdout.write(completion_script(parser, args.shell))
            return 0
        if args.command == "credentials":
            return _credentials(args)
        if args.command == "log-demo":
            if args.records < 1:
                parser.error("--records must be at least 1")
            data_dir = args.data_dir or tempfile.mkdtemp(prefix="laminar-demo-")
            try:
                summary = _demo(data_dir, args.records)
            finally:
                if args.data_dir is None:
                    shutil.rmtree(data_dir, ignore_errors=True)
            for key, value in summary.items():
                print(f"{key:>24}: {value}")
            return 0
        print(json.dumps(_inspect(args.data_dir), indent=2))
        return 0
    except _expected_errors() as e:  # (evaluated only when something is raised)
        print(f"laminar: error: {_error_line(e)}", file=sys.stderr)
        return 1


def _expected_errors() -> tuple[type[BaseException], ...]:
    """What a command may fail with for reasons of the world (a path, a cluster that is down
    or not there, a log that cannot be read): one line on stderr, not a traceback. Imported
    here, when needed, so that a command does not pay for the others' modules."""
    from .client.errors import LaminarError
    from .local_cluster import ClusterError

    return (LogError, StorageError, OSError, LaminarError, ClusterError)


def _error_line(error: BaseException) -> str:
    """`error` on one line: the client's errors as the client commands print them, an OSError
    as its path and reason."""
    from .client.commands import describe_error
    from .client.errors import LaminarError

    if isinstance(error, LaminarError):
        return describe_error(error)
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename}: {error.strerror}" if error.filename else error.strerror
    return " ".join(str(error).split()) or type(error).__name__


if __name__ == "__main__":
    sys.exit(main())
