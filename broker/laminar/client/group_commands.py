"""The `laminar` commands of consumer group admin and offsets for times (docs/api.md,
"Consumer group admin" and "Offsets for times"), as Kafka's `kafka-consumer-groups` and
`kafka-get-offsets` do them:

* `laminar queue list TOPIC`: the groups of a topic, their partitions and lag;
* `laminar queue reset TOPIC GROUP --to-earliest | --to-latest | --to-index N |
  --to-timestamp TIME [--partition P ...] [--force]`: move the group's cursor (it executes:
  there is no dry run; `queue describe` shows where the group is);
* `laminar queue delete TOPIC GROUP [--force]`;
* `laminar topic offsets TOPIC [--timestamp TIME]`: each partition's log start and end, and
  the first record at or after a time.

A TIME is milliseconds since the Unix epoch, or ISO-8601 (`2026-01-31T12:00:00Z`, with an
offset, or without one: local time, as Kafka's tools read it). `laminar consume
--from-timestamp TIME` (laminar.client.commands) reads it the same way.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Callable
from typing import Any

from laminar.contract import ISOLATIONS, MAX_INDEX, MAX_PARTITIONS
from laminar.log.records import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS
from laminar.models.group_admin import GroupReset, PartitionOffsets

from .client import AsyncClient
from .commands import CommandError, _check_ids, _print_json, table

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
ONE_MS = datetime.timedelta(milliseconds=1)


def parse_time(text: str) -> int:
    """An argparse type: a TIME (see the module doc) as ms since the epoch."""
    if text.isascii() and text.isdigit():
        value = int(text)
    else:
        try:
            moment = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a time: ms since the epoch, or ISO-8601 such as "
                "2026-01-31T12:00:00Z"
            ) from None
        if moment.tzinfo is None:
            moment = moment.astimezone()  # local time, as Kafka's tools take it
        value = (moment - EPOCH) // ONE_MS
    if not MIN_TIMESTAMP_MS <= value <= MAX_TIMESTAMP_MS:
        raise argparse.ArgumentTypeError(f"{text!r} is not between 1970 and the year 9999")
    return value


def _index(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_INDEX:
        raise argparse.ArgumentTypeError(f"{text!r} is not a record index")
    return int(text)


def _partition(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) >= MAX_PARTITIONS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a partition")
    return int(text)


def shown_time(ms: int | None) -> str:
    if ms is None:
        return "-"
    moment = EPOCH + ms * ONE_MS
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---------------------------------------------------------------------------- the parsers


def add_queue_admin_commands(
    queues: argparse._SubParsersAction[argparse.ArgumentParser],
    leaf: Callable[..., argparse.ArgumentParser],
) -> None:
    """`queue list`, `queue reset`, `queue delete`."""
    listed = leaf(queues, "list", _queue_list, "list a topic's consumer groups: partitions, lag")
    listed.add_argument("topic", help="the topic")

    reset = leaf(
        queues,
        "reset",
        _queue_reset,
        "move a consumer group's cursor: every message from there on is delivered (again), "
        "everything before it counts as done; refused while the group holds messages, unless "
        "--force",
    )
    reset.add_argument("topic", help="the topic")
    reset.add_argument("group", help="the consumer group (made if it does not exist)")
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-earliest", action="store_true", help="to each partition's log start")
    where.add_argument(
        "--to-latest", action="store_true", help="to each partition's end (only new messages)"
    )
    where.add_argument(
        "--to-index",
        type=_index,
        metavar="N",
        help="to index N (moved to the log start if below it, to the end if past it)",
    )
    where.add_argument(
        "--to-timestamp",
        type=parse_time,
        metavar="TIME",
        help="to each partition's first record at or after TIME (ms since the epoch, or "
        "ISO-8601: 2026-01-31T12:00:00Z; no offset: local time), else its end",
    )
    reset.add_argument(
        "--partition",
        "-p",
        type=_partition,
        nargs="+",
        action="extend",
        metavar="P",
        help="only these partitions (default: all)",
    )
    reset.add_argument(
        "--force",
        action="store_true",
        help="also while messages are held or dead letters are moving: those are dropped "
        "(their consumers' settles are refused)",
    )

    delete = leaf(
        queues,
        "delete",
        _queue_delete,
        "delete a consumer group on every partition; refused while it holds messages, unless "
        "--force",
    )
    delete.add_argument("topic", help="the topic")
    delete.add_argument("group", help="the consumer group")
    delete.add_argument(
        "--force", action="store_true", help="also while messages are held (they are dropped)"
    )


def add_offsets_command(
    topics: argparse._SubParsersAction[argparse.ArgumentParser],
    leaf: Callable[..., argparse.ArgumentParser],
) -> None:
    """`topic offsets`."""
    offsets = leaf(
        topics,
        "offsets",
        _topic_offsets,
        "each partition's log start and end, and with --timestamp the first record at or "
        "after that time (Kafka's offsets for times)",
    )
    offsets.add_argument("name", help="the topic")
    offsets.add_argument(
        "--timestamp",
        type=parse_time,
        metavar="TIME",
        help="a time: ms since the epoch, or ISO-8601 (2026-01-31T12:00:00Z; no offset: local "
        "time)",
    )
    offsets.add_argument(
        "--isolation",
        choices=ISOLATIONS,
        default=ISOLATIONS[0],
        help="read_committed ends at the first open transaction (default: %(default)s)",
    )


# ---------------------------------------------------------------------------- the commands


async def _queue_list(client: AsyncClient, args: argparse.Namespace) -> int:
    listed = await client.list_groups(args.topic)
    if args.json:
        _print_json(listed.to_json())
        return 0
    if not listed.groups:
        print(f"no consumer groups on topic {args.topic}")
        return 0
    rows: list[list[object]] = [
        [g.group, ",".join(map(str, g.partitions)), g.lag] for g in listed.groups
    ]
    print(table(("GROUP", "PARTITIONS", "LAG"), rows))
    return 0


async def _queue_reset(client: AsyncClient, args: argparse.Namespace) -> int:
    _check_ids(args.group)
    target: dict[str, Any]
    if args.to_earliest:
        target = {"to": "earliest"}
    elif args.to_latest:
        target = {"to": "latest"}
    elif args.to_index is not None:
        target = {"index": args.to_index}
    else:
        target = {"timestamp_ms": args.to_timestamp}
    if args.partition:
        count = (await client.describe_topic(args.topic)).partitions
        beyond = sorted(p for p in set(args.partition) if p >= count)
        if beyond:
            raise CommandError(f"topic {args.topic} has no partition {beyond[0]} (0..{count - 1})")
    reset = await client.reset_group(
        args.topic,
        args.group,
        force=args.force,
        partitions=sorted(set(args.partition)) if args.partition else None,
        **target,
    )
    if args.json:
        _print_json(reset.to_json())
        return 0
    print(f"group {args.group} on topic {args.topic}: cursor moved")
    rows = [_reset_row(r) for r in reset.partitions]
    print(table(("PARTITION", "FROM", "TO", "END"), rows))
    return 0


def _reset_row(reset: GroupReset) -> list[object]:
    """FROM: the cursor before ("new": the reset made the group there)."""
    previous = "new" if reset.previous_cursor is None else reset.previous_cursor
    return [reset.partition, previous, reset.cursor, reset.end_index]


async def _queue_delete(client: AsyncClient, args: argparse.Namespace) -> int:
    _check_ids(args.group)
    await client.delete_group(args.topic, args.group, force=args.force)
    if args.json:
        _print_json({"topic": args.topic, "group": args.group, "deleted": True})
    else:
        print(f"deleted consumer group {args.group} of topic {args.topic}")
    return 0


async def _topic_offsets(client: AsyncClient, args: argparse.Namespace) -> int:
    offsets = await client.topic_offsets(
        args.name, timestamp_ms=args.timestamp, isolation=args.isolation
    )
    if args.json:
        _print_json(offsets.to_json())
        return 0
    headers = ["PARTITION", "LOG START", "END"]
    if args.timestamp is not None:
        print(f"topic {args.name}: the first record at or after {shown_time(args.timestamp)}")
        headers += ["INDEX", "TIMESTAMP"]
    print(table(headers, [_offsets_row(p, args.timestamp is not None) for p in offsets.partitions]))
    return 0


def _offsets_row(offsets: PartitionOffsets, timed: bool) -> list[object]:
    row: list[object] = [offsets.partition, offsets.log_start, offsets.end_index]
    if timed:
        row += ["-" if offsets.index is None else offsets.index]
        row += [shown_time(offsets.record_timestamp_ms)]
    return row
