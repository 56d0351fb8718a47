"""Client-side `laminar` commands: topic administration, produce, consume, shared queues,
cluster status and node administration, all through `AsyncClient` (docs/api.md).

`add_commands(subparsers)` adds `topic`, `produce`, `consume`, `queue`, `cluster`, `node` and
`txn` to the `laminar` parser; `run(args)` runs one of them and returns its exit status (None when
`args.command` is not one of these). Every command takes `--brokers URL,...` (any one that answers
will do; default `$LAMINAR_BROKERS`, else the context's, else DEFAULT_BROKERS of
laminar.client.config: local-cluster's three, https://127.0.0.11-13:7070), `--token-file` (default
`$LAMINAR_TOKEN`, `$LAMINAR_TOKEN_FILE`, else the context's), `--context NAME` (of the client
configuration file, laminar.client.config, which says the precedence),
`--ca-file` (for https:// brokers; default `$LAMINAR_CA_FILE`, else the system's CAs),
`--timeout` and, when it prints data, `--json`.

Exit status: 0 done; 1 the cluster answered with an error or could not be reached (one line on
stderr: `laminar: ...`), or a local file could not be read, or `queue accept|release|reject`
had indexes refused; 2 usage (bad arguments); 130 Ctrl-C (`consume` and `queue consume` exit 0
on Ctrl-C: stopping them is how they end).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import random
import sys
import threading
from collections import Counter, deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from laminar.contract import (
    DEFAULT_LEASE_MS,
    MAX_LEASE_MS,
    MAX_REASON_CHARS,
    MAX_WAIT_MS,
    MAX_WEIGHT,
)
from laminar.log.batch import StoredRecord
from laminar.log.compression import CODEC_NAMES
from laminar.metadata.state import config_type_problem
from laminar.models import AcquiredMessage, Handoff, TopicList, TxnDescription, record_to_json
from laminar.tls import TlsError, client_context
from laminar.txn.producer import TxnProducer

from .client import AsyncClient, check_consumer, check_group
from .config import DEFAULT_BROKERS, ClientConfigError, resolve
from .errors import Forbidden, LaminarError, NotFound, OutOfRange, Unauthorized
from .group import Delivery, GroupConsumer
from .models import (
    GroupDescription,
    NodeAdminState,
    PartitionState,
    RecordMetadata,
    Settled,
    TopicDescription,
    TopicInfo,
)
from .producer import Producer
from .until_empty import EmptyWatch, until_end

BROKERS_ENV = "LAMINAR_BROKERS"
TOKEN_ENV = "LAMINAR_TOKEN"
TOKEN_FILE_ENV = "LAMINAR_TOKEN_FILE"
CONTEXT_ENV = "LAMINAR_CONTEXT"
CA_FILE_ENV = "LAMINAR_CA_FILE"
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_WAIT_MS = 1000
READ_MAX_RECORDS = 1000
INPUT_CHUNK_BYTES = 1 << 16
IDLE_POLL_S = 0.1
RETRY_BACKOFF_S = 0.1
MAX_RETRY_BACKOFF_S = 2.0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

QUEUE_MAX_IN_FLIGHT = 100  # messages `queue consume` holds ahead of printing them
QUEUE_PEEK_LIMIT = 1000  # what `queue consume --release` holds at most (all until it ends)

COMMANDS = frozenset({"topic", "produce", "consume", "queue", "cluster", "node", "txn"})
_HANDLER = "laminar_client_handler"
_PARSER = "laminar_client_parser"

Handler = Callable[[AsyncClient, argparse.Namespace], Awaitable[int]]


class UsageError(Exception):
    """Arguments the parser could not check itself (exit 2)."""


class CommandError(Exception):
    """A failure on this side (a file that cannot be read, a partition that does not exist):
    one line on stderr and exit 1."""


# ---------------------------------------------------------------------------- argument types


def _positive_int(text: str) -> int:
    value = _non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def _weight(text: str) -> int:
    value = _non_negative_int(text)
    if value > MAX_WEIGHT:
        raise argparse.ArgumentTypeError(f"{text!r} is over {MAX_WEIGHT}")
    return value


def _wait_ms(text: str) -> int:
    value = _non_negative_int(text)
    if value > MAX_WAIT_MS:
        raise argparse.ArgumentTypeError(f"{text!r} is over {MAX_WAIT_MS}")
    return value


def _lease_ms(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_LEASE_MS:
        raise argparse.ArgumentTypeError(f"{text!r} is over {MAX_LEASE_MS}")
    return value


def _reason(text: str) -> str:
    if not 1 <= len(text) <= MAX_REASON_CHARS:
        raise argparse.ArgumentTypeError(f"a reason has 1..{MAX_REASON_CHARS} characters")
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not positive")
    return value


def _linger(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative")
    return value


def _start(text: str) -> str | int:
    if text in ("earliest", "latest"):
        return text
    try:
        return _non_negative_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not 'earliest', 'latest' or an index"
        ) from None


def _time(text: str) -> int:
    from .group_commands import parse_time

    return parse_time(text)


def _config_item(text: str) -> tuple[str, Any]:
    """`key=value`: the value as JSON when it parses (numbers, null, true), else a string,
    checked to be of the key's type (as the broker checks it: a usage error here, before
    anything is sent)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value")
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = raw
    problem = config_type_problem(key.strip(), value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return key.strip(), value


# ---------------------------------------------------------------------------- the parsers


def add_connection_arguments(parser: argparse.ArgumentParser, *, timeout: bool = True) -> None:
    """--brokers, --token-file, --context, --ca-file and (`timeout`) --timeout: how a command
    finds the cluster (`connection` reads them)."""
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--brokers",
        metavar="URL,...",
        help=f"broker API URLs, comma-separated; any one that answers will do (default: "
        f"${BROKERS_ENV}, else the context's, else local-cluster's three: "
        "https://127.0.0.{11,12,13}:7070)",
    )
    group.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"file holding the API bearer token (default: ${TOKEN_ENV}, ${TOKEN_FILE_ENV}, "
        "else the context's)",
    )
    group.add_argument(
        "--context",
        metavar="NAME",
        help=f"a context of the client configuration file (default: ${CONTEXT_ENV}, else its "
        "current-context): brokers, token, CA file",
    )
    group.add_argument(
        "--ca-file",
        metavar="FILE",
        help="CA bundle (PEM) that https:// brokers' certificates are verified against "
        f"(default: ${CA_FILE_ENV}, else the system's CAs)",
    )
    if timeout:
        group.add_argument(
            "--timeout",
            type=_seconds,
            default=DEFAULT_TIMEOUT_S,
            metavar="S",
            help="give up on the cluster after this many seconds (default: %(default)s)",
        )


def add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the client commands to the `laminar` command's subparsers."""
    connection = argparse.ArgumentParser(add_help=False)
    add_connection_arguments(connection)

    def leaf(
        parent: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        handler: Handler,
        help_text: str,
        json_help: str = "print one JSON object",
    ) -> argparse.ArgumentParser:
        parser = parent.add_parser(
            name, parents=[connection], help=help_text, description=help_text
        )
        parser.add_argument("--json", action="store_true", help=json_help)
        parser.set_defaults(**{_HANDLER: handler, _PARSER: parser})
        return parser

    topic = subparsers.add_parser("topic", help="create, list, describe, alter, delete topics")
    topics = topic.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    create = leaf(topics, "create", _topic_create, "create a topic")
    create.add_argument("name", help="the topic")
    create.add_argument(
        "--partitions", type=_positive_int, default=1, metavar="N", help="partitions"
    )
    create.add_argument(
        "--replication-factor",
        type=_positive_int,
        metavar="R",
        help="replicas per partition (default: the broker's, min(3, alive brokers))",
    )
    create.add_argument(
        "--config",
        type=_config_item,
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="log settings, e.g. retention_ms=3600000 segment_bytes=1048576",
    )
    no_wait_for_leaders(create, "the topic is created")
    leaf(topics, "list", _topic_list, "list the topics")
    from .group_commands import add_offsets_command

    add_offsets_command(topics, leaf)
    describe = leaf(topics, "describe", _topic_describe, "show a topic's partitions")
    describe.add_argument("name", help="the topic")
    alter = leaf(topics, "alter", _topic_alter, "add partitions or change the config")
    alter.add_argument("name", help="the topic")
    alter.add_argument("--partitions", type=_positive_int, metavar="N", help="new count (grow)")
    alter.add_argument(
        "--config",
        type=_config_item,
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="log settings to change (KEY=null: back to the default)",
    )
    no_wait_for_leaders(alter, "the partitions are added")
    delete = leaf(topics, "delete", _topic_delete, "delete a topic and its records")
    delete.add_argument("name", help="the topic")

    produce = leaf(
        subparsers,
        "produce",
        _produce,
        "produce one record per input line (the newline stripped), idempotently",
        "print one JSON line per record: its input line, partition and index (or error)",
    )
    produce.add_argument("topic", help="the topic")
    produce.add_argument(
        "--file", metavar="F", help="read the lines from F (default: stdin; '-' is stdin)"
    )
    keys = produce.add_mutually_exclusive_group()
    keys.add_argument("--key", metavar="K", help="the key of every record")
    keys.add_argument(
        "--key-separator",
        metavar="SEP",
        help="each line is KEY<SEP>VALUE (split at the first SEP; a line without SEP: no key)",
    )
    produce.add_argument(
        "--partition", type=_non_negative_int, metavar="P", help="all records to partition P"
    )
    produce.add_argument(
        "--linger-ms",
        type=_linger,
        default=5.0,
        metavar="MS",
        help="how long a batch waits for more records (default: %(default)s)",
    )
    produce.add_argument(
        "--compression",
        choices=CODEC_NAMES,
        default="none",
        help="compress each batch's records (the broker stores them compressed; consumers "
        "decompress) (default: %(default)s)",
    )

    consume = leaf(
        subparsers,
        "consume",
        _consume,
        "print records: 'partition index key value' lines ('-' for no key), or JSON lines",
        "print one JSON object per record (as the API's JSON reads, plus its partition)",
    )
    consume.add_argument("topic", help="the topic")
    consume.add_argument(
        "--partition",
        type=_non_negative_int,
        nargs="+",
        action="extend",
        metavar="P",
        help="only these partitions (default: all)",
    )
    consume.add_argument(
        "--from",
        dest="start",
        type=_start,
        default="earliest",
        metavar="earliest|latest|INDEX",
        help="where to start in each partition (default: %(default)s)",
    )
    consume.add_argument(
        "--from-timestamp",
        type=_time,
        metavar="TIME",
        help="instead of --from: start each partition at its first record at or after TIME "
        "(ms since the epoch, or ISO-8601: 2026-01-31T12:00:00Z; no offset: local time), or "
        "at its end when none is that late",
    )
    consume.add_argument(
        "--to",
        type=_non_negative_int,
        metavar="INDEX",
        help="stop before INDEX in each partition (exclusive)",
    )
    consume.add_argument(
        "--max-records", type=_positive_int, metavar="N", help="stop after N records in all"
    )
    consume.add_argument(
        "--follow",
        action="store_true",
        help="keep waiting for new records until Ctrl-C (default: stop at the commit index)",
    )
    consume.add_argument(
        "--wait-ms",
        type=_wait_ms,
        default=DEFAULT_WAIT_MS,
        metavar="MS",
        help="long-poll wait of each read (default: %(default)s)",
    )

    _add_queue_commands(subparsers, leaf)

    txn = subparsers.add_parser("txn", help="transactional ids: describe, fence")
    txns = txn.add_subparsers(dest="txn_command", required=True, metavar="ACTION")
    describe_txn = leaf(
        txns, "describe", _txn_describe, "a transactional id's producer, phase and partitions"
    )
    describe_txn.add_argument("id", help="the transactional id")
    fence = leaf(
        txns,
        "fence",
        _txn_fence,
        "start the id anew: every running instance is fenced, the transaction it left open aborted",
    )
    fence.add_argument("id", help="the transactional id")

    cluster = subparsers.add_parser("cluster", help="cluster status")
    clusters = cluster.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    leaf(clusters, "status", _cluster_status, "members, partition leadership, topics")

    node = subparsers.add_parser("node", help="drain, undrain, weigh a broker")
    nodes = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    drain = leaf(
        nodes, "drain", _node_drain, "move every replica off the broker (or worker: <broker>~<w>)"
    )
    drain.add_argument("id", help="the broker's node id (a worker: <broker>~<w>)")
    undrain = leaf(nodes, "undrain", _node_undrain, "let the broker host replicas again")
    undrain.add_argument("id", help="the broker's node id")
    handoff = leaf(
        nodes, "handoff", _node_handoff, "the broker hands its leaderships over (before it stops)"
    )
    handoff.add_argument(
        "id", nargs="?", default=os.environ.get("LAMINAR_NODE_ID"),
        help="the broker's node id (default: $LAMINAR_NODE_ID)",
    )  # fmt: skip
    weight = leaf(nodes, "weight", _node_weight, "set the broker's placement weight")
    weight.add_argument("id", help="the broker's node id")
    weight.add_argument("weight", type=_weight, help="0..1000000 (0: hosts nothing)")


def _add_queue_commands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    leaf: Callable[..., argparse.ArgumentParser],
) -> None:
    queue = subparsers.add_parser(
        "queue", help="shared queues: consumer groups acquiring and settling messages"
    )
    queues = queue.add_subparsers(dest="queue_command", required=True, metavar="ACTION")
    from .group_commands import add_queue_admin_commands

    add_queue_admin_commands(queues, leaf)
    describe = leaf(queues, "describe", _queue_describe, "show a consumer group per partition")
    describe.add_argument("topic", help="the topic")
    describe.add_argument("group", help="the consumer group")
    describe.add_argument(
        "--partition",
        "-p",
        type=_non_negative_int,
        nargs="+",
        action="extend",
        metavar="P",
        help="only these partitions (default: all)",
    )

    consume = leaf(
        queues,
        "consume",
        _queue_consume,
        "acquire messages of a group, print them ('partition index deliveries key value' lines)"
        " and accept them (or --reject / --release them); until --count, or until every message"
        " that existed when it started is taken or settled, or with --follow until Ctrl-C",
        "print one JSON object per message (as the API's acquire shows it, plus its partition)",
    )
    consume.add_argument("topic", help="the topic")
    consume.add_argument("group", help="the consumer group")
    consume.add_argument(
        "--count",
        type=_positive_int,
        metavar="N",
        help="stop after N messages (default: at the end; with --follow: never)",
    )
    consume.add_argument(
        "--follow",
        action="store_true",
        help="keep waiting for new messages until --count or Ctrl-C (default: stop at the "
        "end: once every message that existed when it started is taken or settled)",
    )
    consume.add_argument(
        "--lease-ms",
        type=_lease_ms,
        default=DEFAULT_LEASE_MS,
        metavar="MS",
        help="lease of each message, renewed while held (default: %(default)s)",
    )
    consume.add_argument(
        "--wait-ms",
        type=_wait_ms,
        default=DEFAULT_WAIT_MS,
        metavar="MS",
        help="long-poll wait of each acquire with --follow (default: %(default)s; without "
        "--follow an acquire answers at once)",
    )
    consume.add_argument(
        "--consumer", metavar="ID", help="consumer id (default: <host>-<pid>-<random>)"
    )
    settle = consume.add_mutually_exclusive_group()
    settle.add_argument(
        "--reject", action="store_true", help="dead-letter each message instead of accepting it"
    )
    settle.add_argument(
        "--release",
        action="store_true",
        help=(
            "only look: hold the messages printed and release them all at the end (at most "
            f"{QUEUE_PEEK_LIMIT} without --count); each release counts as a delivery"
        ),
    )
    consume.add_argument(
        "--reason", type=_reason, metavar="TEXT", help="dead-letter reason with --reject"
    )

    for action, help_text in (
        ("accept", "accept held messages: done, never delivered again"),
        ("release", "release held messages: delivered again"),
        ("reject", "reject held messages: dead-lettered to <topic>.dlq"),
    ):
        command = leaf(
            queues,
            action,
            _queue_settle,
            help_text,
            'print {"done": [...], "refused": [...]}',
        )
        command.add_argument("topic", help="the topic")
        command.add_argument("group", help="the consumer group")
        command.add_argument(
            "--partition",
            "-p",
            type=_non_negative_int,
            required=True,
            metavar="P",
            help="the partition of the messages",
        )
        command.add_argument(
            "--consumer", required=True, metavar="ID", help="the consumer holding them"
        )
        command.add_argument(
            "indexes", type=_non_negative_int, nargs="+", metavar="INDEX", help="their indexes"
        )
        if action == "reject":
            command.add_argument(
                "--reason", type=_reason, metavar="TEXT", help="(default: rejected)"
            )
        command.set_defaults(queue_action=action)


# ---------------------------------------------------------------------------- running


def run(args: argparse.Namespace) -> int | None:
    """Run the client command `args` describes; None when it is not one of ours."""
    handler: Handler | None = getattr(args, _HANDLER, None)
    if getattr(args, "command", None) not in COMMANDS or handler is None:
        return None
    parser: argparse.ArgumentParser = getattr(args, _PARSER)
    brokers: list[str] = []
    try:
        brokers, token = connection(args)
        return asyncio.run(_main(handler, args, brokers, token))
    except UsageError as e:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except LaminarError as e:
        if e.status == 0 and e.code in ("unreachable", "connection_lost", "timeout"):
            _error(
                f"no answer from the brokers ({','.join(brokers)}) within {args.timeout:g} s; "
                f"last error: {describe_error(e)}"
            )
        else:
            _error(describe_error(e))
        return EXIT_ERROR
    except CommandError as e:
        _error(str(e))
        return EXIT_ERROR
    except KeyboardInterrupt:
        if _ends_by_interrupt(args):
            return 0
        _error("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of our output went away (`| head`): stop quietly, and keep the
        # interpreter's final flush of stdout from failing again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0 if _ends_by_interrupt(args) else EXIT_ERROR


def connection(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """The brokers and the token of the options `add_connection_arguments` added: each from
    the options, else the environment, else a context (laminar.client.config), the brokers
    else DEFAULT_BROKERS; `args.ca_file` becomes the CA file found. Raises UsageError (a bad
    URL) or CommandError (an unreadable token, CA or configuration file)."""
    try:
        settings = resolve(
            brokers=args.brokers,
            token_file=args.token_file,
            context=args.context,
            ca_file=getattr(args, "ca_file", None),
        )
    except ClientConfigError as e:
        raise CommandError(str(e)) from None
    brokers = parse_brokers(",".join(settings.brokers or DEFAULT_BROKERS))
    args.ca_file = settings.ca_file
    ca_file_of(args)  # (a clear error now for a CA file that cannot be used)
    return brokers, settings.token


def _ends_by_interrupt(args: argparse.Namespace) -> bool:
    """Commands that run until Ctrl-C: that is how they end, not a failure."""
    command = args.command
    return command == "consume" or (
        command == "queue" and getattr(args, "queue_command", None) == "consume"
    )


async def _main(
    handler: Handler, args: argparse.Namespace, brokers: list[str], token: str | None
) -> int:
    ca_file = ca_file_of(args)
    async with AsyncClient(brokers, token=token, timeout_s=args.timeout, ca_file=ca_file) as client:
        return await handler(client, args)


def parse_brokers(text: str) -> list[str]:
    """`URL,...` → base URLs; `host:port` gets `http://`. Raises UsageError."""
    urls: list[str] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        url = part if "://" in part else f"http://{part}"
        try:
            split = urlsplit(url)
            split.port  # noqa: B018 -- raises ValueError on a bad port
        except ValueError as e:
            raise UsageError(f"bad broker URL {part!r}: {e}") from None
        if split.scheme not in ("http", "https") or not split.hostname:
            raise UsageError(f"bad broker URL {part!r}: want http://HOST:PORT")
        urls.append(url.rstrip("/"))
    if not urls:
        raise UsageError("no broker URL given (--brokers URL,...)")
    return urls


def ca_file_of(args: argparse.Namespace) -> str | None:
    """--ca-file, else $LAMINAR_CA_FILE (None: neither). Raises CommandError if unreadable."""
    path: str | None = getattr(args, "ca_file", None) or os.environ.get(CA_FILE_ENV) or None
    if path is not None:
        try:
            client_context(path)
        except TlsError as e:
            raise CommandError(f"the CA file {path}: {e}") from None
    return path


def describe_error(error: LaminarError) -> str:
    """One line for an error of the client."""
    message = " ".join(str(error.message or error.code).split())
    if error.status == 0:
        return message
    text = f"{message} ({error.status} {error.code})"
    if isinstance(error, Unauthorized):
        text += f"; give the token with --token-file, ${TOKEN_ENV} or ${TOKEN_FILE_ENV}"
    elif isinstance(error, Forbidden):
        text += "; the token's principal lacks the role, or the topic is not in its scope"
    return text


def _error(message: str) -> None:
    print(f"laminar: {message}", file=sys.stderr, flush=True)


_warn = _error


def _print_json(value: Any) -> None:
    print(json.dumps(value))


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns two spaces apart."""
    cells = [list(headers), *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _nodes(nodes: Sequence[str]) -> str:
    return ",".join(nodes) if nodes else "-"


def _config_text(config: Mapping[str, Any]) -> str:
    return (
        ",".join(
            f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in sorted(config.items())
        )
        or "-"
    )


def _config(items: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    return dict(items)


def _topic_line(description: TopicDescription | TopicInfo) -> str:
    return (
        f"{description.name}: {description.partitions} partition"
        f"{'s' if description.partitions != 1 else ''}, replication factor "
        f"{description.replication_factor}, config {_config_text(description.config)}"
    )


# ---------------------------------------------------------------------------- topics


async def _topic_create(client: AsyncClient, args: argparse.Namespace) -> int:
    description = await client.create_topic(
        args.name,
        partitions=args.partitions,
        replication_factor=args.replication_factor,
        config=_config(args.config) if args.config else None,
        wait_for_leaders=args.wait_for_leaders,
    )
    if args.json:
        _print_json(description.to_json())
    else:
        print(f"created topic {_topic_line(description)}")
    return 0


async def _topic_list(client: AsyncClient, args: argparse.Namespace) -> int:
    topics = sorted(await client.topics(), key=lambda t: t.name)
    if args.json:
        _print_json(TopicList(tuple(topics)).to_json())
    elif topics:
        rows = [
            (t.name, t.partitions, t.replication_factor, _config_text(t.config)) for t in topics
        ]
        print(table(("TOPIC", "PARTITIONS", "RF", "CONFIG"), rows))
    else:
        print("no topics")
    return 0


def _partition_rows(states: Sequence[PartitionState]) -> tuple[list[str], list[list[object]]]:
    headers = ["PARTITION", "LEADER", "REPLICAS", "IN-SYNC", "LOG START", "COMMIT", "LOG END"]
    learners = any(s.learners for s in states)
    if learners:
        headers.insert(3, "LEARNERS")
    rows: list[list[object]] = []
    for s in sorted(states, key=lambda s: s.partition):
        row: list[object] = [
            s.partition,
            s.leader or "-",
            _nodes(s.replicas),
            _nodes(s.in_sync),
            s.log_start,
            s.commit_index,
            s.log_end,
        ]
        if learners:
            row.insert(3, _nodes(s.learners))
        rows.append(row)
    return headers, rows


async def _topic_describe(client: AsyncClient, args: argparse.Namespace) -> int:
    description = await client.describe_topic(args.name)
    if args.json:
        _print_json(description.to_json())
        return 0
    print(f"topic {_topic_line(description)}")
    headers, rows = _partition_rows(description.partition_states)
    print(table(headers, rows))
    return 0


def no_wait_for_leaders(parser: argparse.ArgumentParser, done: str) -> None:
    """`--no-wait-for-leaders` of a command that may make partitions."""
    parser.add_argument(
        "--no-wait-for-leaders",
        dest="wait_for_leaders",
        action="store_false",
        help=f"answer once {done}, before the new partitions have leaders (default: once "
        "each has one, up to the broker's request timeout)",
    )


async def _topic_alter(client: AsyncClient, args: argparse.Namespace) -> int:
    if args.partitions is None and not args.config:
        raise UsageError("nothing to alter: give --partitions and/or --config")
    description = await client.alter_topic(
        args.name,
        partitions=args.partitions,
        config=_config(args.config) if args.config else None,
        wait_for_leaders=args.wait_for_leaders,
    )
    if args.json:
        _print_json(description.to_json())
    else:
        print(f"altered topic {_topic_line(description)}")
    return 0


async def _topic_delete(client: AsyncClient, args: argparse.Namespace) -> int:
    await client.delete_topic(args.name)
    if args.json:
        _print_json({"deleted": args.name})
    else:
        print(f"deleted topic {args.name}")
    return 0


# ---------------------------------------------------------------------------- produce


def _strip_cr(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\r") else line


async def read_lines(fd: int, name: str) -> AsyncGenerator[bytes, None]:
    """The lines of file descriptor `fd` (without "\\n" or "\\r\\n"), as they arrive.

    A daemon thread reads with `os.read` (no Python I/O lock held, so a read blocked on a
    terminal or a pipe never holds up the exit) into a small bounded queue (so a fast file
    does not run ahead of a slow cluster). A last line without a newline counts too.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | OSError] = asyncio.Queue(maxsize=8)

    def pump() -> None:
        while True:
            chunk: bytes | OSError
            try:
                chunk = os.read(fd, INPUT_CHUNK_BYTES)
            except OSError as e:
                chunk = e
            try:
                asyncio.run_coroutine_threadsafe(queue.put(chunk), loop).result()
            except (RuntimeError, concurrent.futures.CancelledError):
                return  # the loop is gone: nobody reads anymore
            if not isinstance(chunk, bytes) or not chunk:
                return

    threading.Thread(target=pump, name="laminar-input", daemon=True).start()
    partial: list[bytes] = []
    while True:
        chunk = await queue.get()
        if isinstance(chunk, OSError):
            raise CommandError(f"cannot read {name}: {chunk.strerror or chunk}")
        if not chunk:
            if partial:
                yield _strip_cr(b"".join(partial))
            return
        if b"\n" not in chunk:
            partial.append(chunk)
            continue
        lines = chunk.split(b"\n")
        partial.append(lines[0])
        yield _strip_cr(b"".join(partial))
        for line in lines[1:-1]:
            yield _strip_cr(line)
        partial = [lines[-1]] if lines[-1] else []


def _open_input(path: str | None) -> tuple[int, str, bool]:
    """(fd, name for messages, whether to close it)."""
    if path is None or path == "-":
        return sys.stdin.fileno(), "stdin", False
    try:
        return os.open(path, os.O_RDONLY), path, True
    except OSError as e:
        raise CommandError(f"cannot open {path}: {e.strerror}") from None


@dataclass(slots=True)
class _ProduceTally:
    json: bool
    produced: int = 0
    failed: int = 0
    maybe_written: int = 0  # failed, but the outcome of their append is unknown
    first_error: BaseException | None = None
    partitions: Counter[int] = field(default_factory=Counter)

    def settle(self, line: int, future: asyncio.Future[RecordMetadata]) -> None:
        error = future.exception()
        if error is not None:
            self.failed += 1
            ambiguous = isinstance(error, LaminarError) and error.ambiguous
            self.maybe_written += ambiguous
            if self.first_error is None:
                self.first_error = error
            if self.json:
                failure = {"line": line, "error": _error_text(error)}
                _print_json({**failure, "maybe_written": True} if ambiguous else failure)
            return
        meta = future.result()
        self.produced += 1
        self.partitions[meta.partition] += 1
        if self.json:
            _print_json({"line": line, "partition": meta.partition, "index": meta.index})


def _error_text(error: BaseException) -> str:
    if isinstance(error, LaminarError):
        return describe_error(error)
    return str(error) or type(error).__name__


async def _produce(client: AsyncClient, args: argparse.Namespace) -> int:
    if args.key_separator == "":
        raise UsageError("--key-separator must not be empty")
    description = await client.describe_topic(args.topic)  # a clear error before any input
    count = description.partitions
    if args.partition is not None and args.partition >= count:
        raise CommandError(f"topic {args.topic} has no partition {args.partition} (0..{count - 1})")
    fixed_key: bytes | None = None if args.key is None else args.key.encode()
    separator: bytes | None = None if args.key_separator is None else args.key_separator.encode()
    fd, name, close_fd = _open_input(args.file)
    tally = _ProduceTally(args.json)
    pending: deque[tuple[int, asyncio.Future[RecordMetadata]]] = deque()
    producer = Producer(
        client,
        args.topic,
        linger_ms=args.linger_ms,
        partitions=count,
        delivery_timeout_s=args.timeout,
        compression=args.compression,
    )
    line_no = 0
    stopped = False  # by a failure, before the end of the input
    try:
        lines = read_lines(fd, name)
        try:
            async for line in lines:
                line_no += 1
                key, value = fixed_key, line
                if separator is not None:
                    head, sep, tail = line.partition(separator)
                    if sep:
                        key, value = head, tail
                future = await producer.send(value, key=key, partition=args.partition)
                pending.append((line_no, future))
                while pending and pending[0][1].done():
                    tally.settle(*pending.popleft())
                if tally.failed:
                    stopped = True  # stop reading: the cluster refuses this topic's records
                    break
        finally:
            await lines.aclose()
    finally:
        await producer.close()
        if close_fd and not stopped:  # (else the reading thread may still use it)
            os.close(fd)
    while pending:
        tally.settle(*pending.popleft())
    if not args.json:
        used = ", ".join(f"{p} ({n})" for p, n in sorted(tally.partitions.items()))
        print(
            f"produced {tally.produced} record{'s' if tally.produced != 1 else ''} to "
            f"{args.topic}" + (f": partitions {used}" if used else "")
        )
    sys.stdout.flush()
    if tally.first_error is not None:
        unknown = tally.maybe_written
        _error(
            f"{tally.failed} record{'s' if tally.failed != 1 else ''} not produced"
            f"{f' ({unknown} of them may have been written all the same)' if unknown else ''}"
            f"{f' (stopped reading at line {line_no})' if stopped else ''}"
            f": {_error_text(tally.first_error)}"
        )
        return EXIT_ERROR
    return 0


# ---------------------------------------------------------------------------- consume


def _text(data: bytes | None) -> str:
    if data is None:
        return "-"
    text = data.decode("utf-8", errors="backslashreplace")
    return text.replace("\r", "\\r").replace("\n", "\\n")


def record_json(partition: int, record: StoredRecord) -> dict[str, Any]:
    """The record as the API's JSON read shows it (laminar.models), plus its partition: key,
    value and header values as text, or all base64 (`"encoding": "base64"`) when one of them
    is not UTF-8."""
    return {"partition": partition, **record_to_json(record)}


@dataclass(slots=True)
class _Cursor:
    """Where one partition's reading stands."""

    partition: int
    position: int | None  # the next index to read; None: the log start
    to: int | None  # stop before this index (--to)
    end: int | None  # stop here too (the commit index + 1 at the start; None with --follow)
    first: bool = True  # no read yet

    @property
    def stop(self) -> int | None:
        bounds = [b for b in (self.to, self.end) if b is not None]
        return min(bounds) if bounds else None

    @property
    def done(self) -> bool:
        if self.position is None:
            return False
        if self.to is not None and self.position >= self.to:
            return True
        # `end` is checked again after the first read, which may move it (see _read_step)
        return self.end is not None and not self.first and self.position >= self.end


class _Printer:
    def __init__(self, as_json: bool, limit: int | None) -> None:
        self.as_json = as_json
        self.limit = limit
        self.printed = 0

    @property
    def full(self) -> bool:
        return self.limit is not None and self.printed >= self.limit

    def print(self, partition: int, records: Sequence[StoredRecord]) -> None:
        out = sys.stdout
        for record in records:
            if self.full:
                break
            if self.as_json:
                out.write(json.dumps(record_json(partition, record)) + "\n")
            else:
                out.write(f"{partition} {record.index} {_text(record.key)} {_text(record.value)}\n")
            self.printed += 1
        out.flush()


async def _read_step(
    client: AsyncClient, topic: str, cursor: _Cursor, wait_ms: int, limit: int
) -> list[StoredRecord]:
    """One read of `cursor`'s partition: the records below its stop, the cursor moved on."""
    if cursor.first and cursor.end is not None:
        wait_ms = 0  # up to the end: never wait for records after it
    stop = cursor.stop
    max_records = min(limit, READ_MAX_RECORDS)
    if cursor.position is not None and stop is not None:
        max_records = min(max_records, stop - cursor.position)
    try:
        result = await client.read(
            topic,
            cursor.partition,
            cursor.position,
            max_records=max(1, max_records),
            wait_ms=wait_ms,
        )
    except OutOfRange as e:
        if e.log_start is None or (cursor.position is not None and e.log_start <= cursor.position):
            raise
        if cursor.position is not None:
            _warn(
                f"partition {cursor.partition}: records {cursor.position}..{e.log_start - 1} "
                f"are gone (retention); continuing at {e.log_start}"
            )
        cursor.position = e.log_start
        return []
    if cursor.first and cursor.end is not None:
        # The describe that set `end` may have missed the partition's hosts: trust the
        # serving replica's commit index too (only the first time: then `end` stays put).
        cursor.end = max(cursor.end, result.commit_index + 1)
        stop = cursor.stop
    cursor.first = False
    start = cursor.position
    records = [
        r
        for r in result.records
        if (start is None or r.index >= start) and (stop is None or r.index < stop)
    ]
    position = result.next_index
    if result.records:
        position = max(position, result.records[-1].index + 1)
    if start is not None:
        position = max(position, start)
    if not result.records and position == start and wait_ms == 0 and not cursor.done:
        await asyncio.sleep(IDLE_POLL_S)
    cursor.position = position
    return records


async def _follow(
    client: AsyncClient, topic: str, cursor: _Cursor, wait_ms: int, out: asyncio.Queue[Any]
) -> None:
    """Read `cursor`'s partition until its stop (forever without one) into `out`; waits out
    retryable errors (leader elections, restarts)."""
    attempt = 0
    warned = False
    while not cursor.done:
        try:
            records = await _read_step(client, topic, cursor, wait_ms, READ_MAX_RECORDS)
        except LaminarError as e:
            if not e.retryable:
                raise
            if not warned:
                _warn(f"partition {cursor.partition}: {describe_error(e)}; retrying")
                warned = True
            delay = min(MAX_RETRY_BACKOFF_S, RETRY_BACKOFF_S * 2**attempt)
            await asyncio.sleep(delay * random.uniform(0.5, 1))
            attempt += 1
            continue
        attempt = 0
        warned = False
        if records:
            await out.put((cursor.partition, records))


async def _consume(client: AsyncClient, args: argparse.Namespace) -> int:
    if args.from_timestamp is not None and args.start != "earliest":
        raise UsageError("give --from or --from-timestamp, not both")
    description = await client.describe_topic(args.topic)
    count = description.partitions
    partitions = sorted(set(args.partition)) if args.partition else list(range(count))
    for p in partitions:
        if p >= count:
            raise CommandError(f"topic {args.topic} has no partition {p} (0..{count - 1})")
    cursors: list[_Cursor] = []
    for p in partitions:
        state = description.partition(p)
        position: int | None
        if args.from_timestamp is not None:
            # the partition's first record at or after the time, else its end (as Kafka)
            found = await client.partition_offsets(args.topic, p, timestamp_ms=args.from_timestamp)
            position = found.end_index if found.index is None else found.index
        elif args.start == "earliest":
            position = None if state is None else state.log_start
        elif args.start == "latest":
            if state is None:
                probe = await client.read(args.topic, p, None, max_records=1)
                position = probe.commit_index + 1
            else:
                position = state.commit_index + 1
        else:
            position = int(args.start)
        end = None
        if not args.follow:
            end = state.commit_index + 1 if state is not None else 0
        cursors.append(_Cursor(p, position, args.to, end))
    printer = _Printer(args.json, args.max_records)
    if not args.follow:
        for cursor in cursors:  # one partition after the other: the output is grouped
            while not cursor.done and not printer.full:
                limit = (
                    READ_MAX_RECORDS if printer.limit is None else printer.limit - printer.printed
                )
                records = await _read_step(client, args.topic, cursor, args.wait_ms, limit)
                printer.print(cursor.partition, records)
        return 0
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=2 * len(cursors))
    tasks = {
        asyncio.create_task(_follow(client, args.topic, c, args.wait_ms, queue)) for c in cursors
    }
    try:
        while not printer.full:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, *tasks}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
            else:
                partition, records = getter.result()
                printer.print(partition, records)
            for task in done - {getter}:
                tasks.discard(task)
                task.result()  # raises the partition's error
            if not tasks and queue.empty():
                break  # every partition reached --to
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return 0


# ---------------------------------------------------------------------------- shared queues


def _check_ids(group: str, consumer: str | None = None) -> None:
    try:
        check_group(group)
        if consumer is not None:
            check_consumer(consumer)
    except ValueError as e:
        raise UsageError(str(e)) from None


_GROUP_COLUMNS = (
    ("cursor", "CURSOR"),
    ("pending", "PENDING"),
    ("acquired", "ACQUIRED"),
    ("dead_letter_pending", "DLQ PENDING"),
    ("accepted", "ACCEPTED"),
    ("dead_lettered", "DEAD-LETTERED"),
    ("lag", "LAG"),
)


async def _queue_describe(client: AsyncClient, args: argparse.Namespace) -> int:
    _check_ids(args.group)
    count = (await client.describe_topic(args.topic)).partitions
    partitions = sorted(set(args.partition)) if args.partition else list(range(count))
    for p in partitions:
        if p >= count:
            raise CommandError(f"topic {args.topic} has no partition {p} (0..{count - 1})")

    async def describe(p: int) -> GroupDescription | None:
        try:
            return await client.describe_group(args.topic, p, args.group)
        except NotFound:
            return None  # the group never used this partition

    described = await asyncio.gather(*map(describe, partitions))
    # (`exists` False: a partition the group is not on; None: a broker older than it)
    found = [d for d in described if d is not None and d.exists is not False]
    if not found:
        raise CommandError(f"no group {args.group} on topic {args.topic}")
    rows = [
        {"partition": d.partition, **{name: getattr(d, name) or 0 for name, _ in _GROUP_COLUMNS}}
        for d in found
    ]
    if args.json:
        _print_json({"topic": args.topic, "group": args.group, "partitions": rows})
        return 0
    print(f"group {args.group} on topic {args.topic}")
    lines: list[list[object]] = [[r["partition"], *(r[n] for n, _ in _GROUP_COLUMNS)] for r in rows]
    if len(rows) > 1:
        totals = [sum(r[n] for r in rows) for n, _ in _GROUP_COLUMNS[1:]]
        lines.append(["all", "-", *totals])
    print(table(("PARTITION", *(h for _, h in _GROUP_COLUMNS)), lines))
    return 0


def delivery_json(delivery: Delivery) -> dict[str, Any]:
    """A message as the API's acquire shows it, plus its partition."""
    m = delivery.message
    record = StoredRecord(m.index, m.timestamp_ms, m.key, m.value, m.headers)
    message = AcquiredMessage(record, m.deliveries, delivery.lease_deadline_ms)
    return {"partition": m.partition, **message.to_json()}


async def _queue_consume(client: AsyncClient, args: argparse.Namespace) -> int:
    _check_ids(args.group, args.consumer)
    if args.reason is not None and not args.reject:
        raise UsageError("--reason goes with --reject")
    description = await client.describe_topic(args.topic)  # (a clear error first)
    if args.release:  # hold everything printed: nothing comes twice
        limit = args.count or QUEUE_PEEK_LIMIT
        max_in_flight = limit
    else:
        limit = args.count
        max_in_flight = min(args.count or QUEUE_MAX_IN_FLIGHT, QUEUE_MAX_IN_FLIGHT)
    # Without --follow: until the end (laminar.client.until_empty), each acquire answering
    # at once, as `consume` reads up to the commit indexes it started at.
    watch = None
    if not args.follow:
        ends = {}
        for p in range(description.partitions):
            state = description.partition(p)
            if state is None:  # (no leader reported): ask the partition itself
                commit_index = (await client.read(args.topic, p, None, max_records=1)).commit_index
            else:
                commit_index = state.commit_index
            ends[p] = commit_index + 1
        watch = EmptyWatch(client, ends)
    consumer = GroupConsumer(
        client if watch is None else watch,
        args.topic,
        args.group,
        consumer=args.consumer,
        lease_ms=args.lease_ms,
        wait_ms=args.wait_ms if watch is None else 0,
        max_in_flight=max_in_flight,
        batch=min(max_in_flight, 1000),
        limit=limit,
    )
    settling: list[asyncio.Task[bool]] = []
    refused = 0
    async with consumer, contextlib.aclosing(until_end(consumer, watch)) as deliveries:
        async for delivery in deliveries:
            if args.json:
                line = json.dumps(delivery_json(delivery))
            else:
                line = (
                    f"{delivery.partition} {delivery.index} {delivery.deliveries} "
                    f"{_text(delivery.key)} {_text(delivery.value)}"
                )
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            if args.reject:
                settling.append(asyncio.ensure_future(delivery.reject(args.reason)))
            elif not args.release:
                settling.append(asyncio.ensure_future(delivery.accept()))
            if len(settling) >= QUEUE_MAX_IN_FLIGHT:
                refused += sum(not ok for ok in await asyncio.gather(*settling))
                settling.clear()
        refused += sum(not ok for ok in await asyncio.gather(*settling))
    if refused:
        verb = "reject" if args.reject else "accept"
        _warn(f"could not {verb} {refused} message(s): their lease ran out (they come again)")
    return 0


async def _queue_settle(client: AsyncClient, args: argparse.Namespace) -> int:
    _check_ids(args.group, args.consumer)
    action = args.queue_action
    call = (args.topic, args.partition, args.group, args.consumer, args.indexes)
    settled: Settled
    if action == "accept":
        settled = await client.accept(*call)
    elif action == "release":
        settled = await client.release(*call)
    else:
        settled = await client.reject(*call, reason=args.reason)
    if args.json:
        _print_json(settled.to_json())
    else:
        past = {"accept": "accepted", "release": "released", "reject": "rejected"}[action]
        print(f"{past} {len(settled.done)}" + "".join(f" {i}" for i in settled.done))
    if settled.refused:
        _warn(
            f"refused {len(settled.refused)} (not held by {args.consumer}):"
            + "".join(f" {i}" for i in settled.refused)
        )
        return EXIT_ERROR
    return 0


# ---------------------------------------------------------------------------- cluster, nodes


async def _cluster_status(client: AsyncClient, args: argparse.Namespace) -> int:
    info = await client.cluster()
    descriptions: list[TopicDescription] = []
    for topic in sorted(await client.topics(), key=lambda t: t.name):
        try:
            descriptions.append(await client.describe_topic(topic.name))
        except NotFound:
            continue  # deleted meanwhile
    led: Counter[str] = Counter()
    hosted: Counter[str] = Counter()
    topics: list[dict[str, Any]] = []
    for description in descriptions:
        leaders: Counter[str] = Counter()
        leaderless = 0
        for state in description.partition_states:
            if state.leader:
                leaders[state.leader] += 1
            else:
                leaderless += 1
            for node in {*state.replicas, *state.learners}:
                hosted[node] += 1
        led.update(leaders)
        topics.append(
            {
                "name": description.name,
                "partitions": description.partitions,
                "replication_factor": description.replication_factor,
                "leaders": dict(sorted(leaders.items())),
                "leaderless": leaderless,
                # fewer in sync than the topic's replication factor (also a partition whose
                # replica set shrank, or without a leader), as the metric and the console count
                "under_replicated": len(description.under_replicated()),
            }
        )
    members = [
        {**m.to_json(), "partitions_led": led[m.id], "replicas_hosted": hosted[m.id]}
        for m in sorted(info.members, key=lambda m: m.id)
    ]
    if args.json:
        _print_json(
            {
                "cluster_id": info.cluster_id,
                "node_id": info.node_id,
                "metadata_leader": info.metadata_leader,
                "members": members,
                "topics": topics,
            }
        )
        return 0
    print(
        f"cluster {info.cluster_id or '-'}: {len(members)} members, metadata leader "
        f"{info.metadata_leader or '-'} (answered by {info.node_id or '-'})"
    )
    print(
        table(
            ("ID", "API URL", "STATE", "WEIGHT", "DRAINING", "LEADS", "REPLICAS"),
            [
                (
                    m["id"],
                    m["api_url"] or "-",
                    m["state"],
                    m["weight"],
                    "yes" if m["draining"] else "no",
                    m["partitions_led"],
                    m["replicas_hosted"],
                )
                for m in members
            ],
        )
    )
    print()
    if not topics:
        print("no topics")
        return 0
    print(
        table(
            ("TOPIC", "PARTITIONS", "RF", "LEADERS", "NO LEADER", "UNDER-REPLICATED"),
            [
                (
                    t["name"],
                    t["partitions"],
                    t["replication_factor"],
                    " ".join(f"{n}:{c}" for n, c in t["leaders"].items()) or "-",
                    t["leaderless"],
                    t["under_replicated"],
                )
                for t in topics
            ],
        )
    )
    return 0


def _print_txn(state: TxnDescription, as_json: bool) -> None:
    if as_json:
        _print_json(state.to_json())
        return
    producer = TxnProducer.of(state.producer_id)
    parts = ", ".join(f"{t}/{p}" for t, p in state.partitions) or "none"
    last = {None: "none yet", True: "committed", False: "aborted"}[state.last_committed]
    if state.last_tag is not None:
        last += f" (tag {state.last_tag!r})"
    print(
        f"{state.transactional_id}: {state.phase}, producer {producer.number} epoch "
        f"{producer.epoch}, timeout {state.timeout_ms} ms, partitions: {parts}; last "
        f"transaction: {last}; forgotten after {state.expiry_ms} ms unused"
    )


async def _txn_describe(client: AsyncClient, args: argparse.Namespace) -> int:
    _print_txn(await client.describe_transaction(args.id), args.json)
    return 0


async def _txn_fence(client: AsyncClient, args: argparse.Namespace) -> int:
    await client.init_transactions(args.id)
    _print_txn(await client.describe_transaction(args.id), args.json)
    return 0


def _print_node(state: NodeAdminState, as_json: bool) -> None:
    if as_json:
        _print_json(state.to_json())
    else:
        draining = "draining" if state.draining else "not draining"
        print(f"{state.node}: {draining}, weight {state.weight}")


async def _node_drain(client: AsyncClient, args: argparse.Namespace) -> int:
    _print_node(await client.drain(args.id), args.json)
    return 0


async def _node_undrain(client: AsyncClient, args: argparse.Namespace) -> int:
    _print_node(await client.undrain(args.id), args.json)
    return 0


async def _node_handoff(client: AsyncClient, args: argparse.Namespace) -> int:
    if not args.id:
        raise SystemExit("laminar node handoff: give the node id (or set LAMINAR_NODE_ID)")
    # (a broker's id hands over for every one of its workers: docs/workers.md)
    leading = await client.handoff(args.id)
    if args.json:
        _print_json(Handoff(args.id, leading).to_json())
    else:
        print(f"{args.id}: leads {leading} groups")
    return 0


async def _node_weight(client: AsyncClient, args: argparse.Namespace) -> int:
    _print_node(await client.set_weight(args.id, args.weight), args.json)
    return 0
