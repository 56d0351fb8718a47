"""The `laminar` source and sink options (the Kafka connector's names: docs/spark.md), offsets
and range planning: pure functions, no Spark and no I/O, so they are tested on their own.

Offsets are JSON objects `{"topic": {"0": 23, "1": 7}}`: per topic partition (string keys),
the next index to read. In `startingOffsets` / `endingOffsets`, -2 means earliest and -1
latest, as in Kafka's; the words `earliest` and `latest` mean that for every partition.
Timestamps (`startingTimestamp`, `...OffsetsByTimestamp`) are milliseconds since the epoch;
the source turns them into offsets (the first record at or after them) against the cluster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..contract import MAX_TXN_TIMEOUT_MS
from ..log.records import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS

EARLIEST, LATEST = -2, -1
#: topic -> partition (as a string) -> next index
Offsets = dict[str, dict[str, int]]
#: topic -> partition (as a string) -> a timestamp, ms since the epoch
Timestamps = dict[str, dict[str, int]]
#: Options Spark itself passes, or that belong to the other side (source / sink).
KNOWN = {
    "brokers", "kafka.bootstrap.servers", "topic", "topics", "subscribe", "subscribepattern",
    "assign", "startingoffsets", "endingoffsets", "startingtimestamp", "endingtimestamp",
    "startingoffsetsbytimestamp", "endingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy", "maxoffsetspertrigger", "maxrecordspertrigger",
    "minoffsetspertrigger", "maxtriggerdelay", "minpartitions", "failondataloss",
    "includeheaders", "token", "path", "checkpointlocation", "cafile", "tokenfile", "context",
    "transactiontimeoutms",
}  # fmt: skip
#: The sink's: how long a task's transaction may stay open, from its first write to the
#: driver's commit of the whole (micro-)batch.
DEFAULT_TRANSACTION_TIMEOUT_MS = 300_000
#: Kafka's `maxTriggerDelay` default: how long minOffsetsPerTrigger may hold a batch back.
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
#: What a starting timestamp with no record at or after it does (Kafka's
#: startingOffsetsByTimestampStrategy): fail the query, or start at the latest offset.
TIMESTAMP_STRATEGIES = ("error", "latest")
#: `maxTriggerDelay` units, as Spark's time strings (JavaUtils.timeStringAsMs) spell them.
_TIME_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000,
                  "h": 3_600_000, "d": 86_400_000}  # fmt: skip
_DURATION = re.compile(r"\s*(\d+)\s*([a-z]*)\s*")


class OptionError(ValueError):
    """An option is missing or wrong; the message names it."""


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise OptionError(f"option {name} must be true or false, not {raw!r}")
    return raw.lower() == "true"


def _positive(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name} must be a positive integer, not {raw!r}") from None
    if value < 1:
        raise OptionError(f"option {name} must be a positive integer, not {raw!r}")
    return value


def _one_of(options: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """(name, value) of the one of `names` (aliases) that is given; OptionError for two."""
    given = [name for name in names if name.lower() in options]
    if len(given) > 1:
        raise OptionError(f"give option {' or '.join(given)}, not both (they are aliases)")
    return (given[0], options[given[0].lower()]) if given else None


def _timestamp(raw: str, name: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not MIN_TIMESTAMP_MS <= value <= MAX_TIMESTAMP_MS:
        raise OptionError(
            f"option {name} must be a timestamp in ms since the epoch (an integer in "
            f"[{MIN_TIMESTAMP_MS}, {MAX_TIMESTAMP_MS}]), not {raw!r}"
        )
    return value


def duration_ms(raw: str, name: str) -> int:
    """A Spark time string (`15m`, `30s`, `500ms`; a bare number is ms) in ms."""
    matched = _DURATION.fullmatch(raw.lower())
    if matched is None or matched.group(2) not in (*_TIME_UNITS_MS, ""):
        raise OptionError(
            f"option {name} must be a duration such as 15m, 30s or 500ms, not {raw!r}"
        )
    return int(int(matched.group(1)) * _TIME_UNITS_MS.get(matched.group(2), 1))


def _brokers(options: Mapping[str, str]) -> tuple[str, ...]:
    given = _one_of(options, "brokers", "kafka.bootstrap.servers")
    brokers = tuple(b.strip() for b in (given[1] if given else "").split(",") if b.strip())
    if not brokers:
        raise OptionError(
            "option brokers (or kafka.bootstrap.servers) is required: comma-separated broker "
            "API URLs"
        )
    for broker in brokers:
        if not broker.lower().startswith(("http://", "https://")):
            raise OptionError(
                f"broker {broker!r} is not a URL: give the API URLs, http://host:port or "
                f"https://host:port (option {given[0] if given else 'brokers'})"
            )
    return brokers


def _assignment(raw: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """`assign`: `{"topicA": [0, 1], "topicB": [2]}` as ((topic, partitions), ...)."""
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f'option assign must be JSON such as {{"orders": [0, 1]}}, not {raw!r}')
    out = []
    for topic, partitions in parsed.items():
        if (
            not isinstance(partitions, list)
            or not partitions
            or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                       for p in partitions)
        ):  # fmt: skip
            raise OptionError(
                f"option assign: {topic!r} must map to a list of partition numbers, "
                f"got {partitions!r}"
            )
        out.append((str(topic), tuple(sorted(set(partitions)))))
    return tuple(out)


@dataclass(frozen=True)
class Options:
    brokers: tuple[str, ...]
    #: `subscribe` (or `topic` / `topics`): these topics; the sink's topic is the first
    topics: tuple[str, ...]
    starting: str
    ending: str
    max_records_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    include_headers: bool
    token: str | None = field(repr=False)
    #: CA bundle (PEM) for https:// brokers, at this path on the driver and every executor
    ca_file: str | None = None
    #: where the token comes from when `token` is not given (read on the driver, by
    #: `with_credentials`: the executors get the token itself)
    token_file: str | None = None
    context: str | None = None
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    #: `subscribePattern`: every topic whose whole name matches (Python `re` syntax)
    pattern: str | None = None
    #: `assign`: these partitions of these topics, ((topic, (partition, ...)), ...)
    assigned: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    #: `startingTimestamp` / `endingTimestamp`: for every partition
    starting_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None
    #: `startingOffsetsByTimestamp` / `endingOffsetsByTimestamp`: JSON, validated
    starting_by_timestamp: str | None = None
    ending_by_timestamp: str | None = None
    #: `startingOffsetsByTimestampStrategy`: "error" or "latest"
    timestamp_strategy: str = "error"
    #: `minOffsetsPerTrigger` and `maxTriggerDelay`
    min_records_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS

    def with_credentials(self) -> Options:
        """These options with the token resolved, on the driver: `token`, else `tokenFile`'s,
        else `context`'s, else $LAMINAR_TOKEN, $LAMINAR_TOKEN_FILE, the current context
        (laminar.client.config). OptionError if a file is unreadable."""
        from laminar.client.config import ClientConfigError, resolve

        try:
            settings = resolve(token=self.token, token_file=self.token_file, context=self.context)
        except ClientConfigError as e:
            raise OptionError(str(e)) from None
        ca_file = self.ca_file or (settings.ca_file if self.context else None)
        return replace(self, token=settings.token, ca_file=ca_file)

    @property
    def subscribed(self) -> str:
        """How the source names what it reads, for messages."""
        if self.pattern is not None:
            return f"subscribePattern {self.pattern!r}"
        if self.assigned is not None:
            return f"assign {json.dumps(dict((t, list(p)) for t, p in self.assigned))}"
        return f"subscribe {','.join(self.topics)!r}"

    @classmethod
    def parse(cls, raw: Mapping[str, str], *, stream: bool, sink: bool = False) -> Options:
        """`raw`: Spark's options (case-insensitive keys)."""
        options = {k.lower(): v for k, v in raw.items()}
        unknown = sorted(set(options) - KNOWN)
        if unknown:
            raise OptionError(f"unknown options {unknown} (known: {sorted(KNOWN)})")
        brokers = _brokers(options)
        topics: tuple[str, ...] = ()
        pattern: str | None = None
        assigned = None
        if sink:
            named = _one_of(options, "topic", "topics")
            topics = tuple(t.strip() for t in (named[1] if named else "").split(",") if t.strip())
        else:
            pattern, assigned, topics = _subscription(options)
        ending_options = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
        for name in ending_options:
            if stream and name.lower() in options:
                raise OptionError(f"{name} is for batch reads only")
        starting = options.get("startingoffsets", "latest" if stream else "earliest")
        ending = options.get("endingoffsets", "latest")
        for name, value in (("startingOffsets", starting), ("endingOffsets", ending)):
            spec(value, name)  # validated now, resolved later against the cluster
        if ending == "earliest":
            raise OptionError("endingOffsets may not be earliest")
        starting_ts, ending_ts = (
            _timestamp(options[n.lower()], n) if n.lower() in options else None
            for n in ("startingTimestamp", "endingTimestamp")
        )
        by_timestamp: dict[str, str | None] = {}
        for name in ("startingOffsetsByTimestamp", "endingOffsetsByTimestamp"):
            by_time = by_timestamp[name] = options.get(name.lower())
            if by_time is not None:
                timestamps(by_time, name)
        strategy = options.get("startingoffsetsbytimestampstrategy", "error").lower()
        if strategy not in TIMESTAMP_STRATEGIES:
            raise OptionError(
                f"option startingOffsetsByTimestampStrategy must be error or latest, "
                f"not {strategy!r}"
            )
        max_given = _one_of(options, "maxOffsetsPerTrigger", "maxRecordsPerTrigger")
        max_records = _positive(options, max_given[0]) if max_given else None
        min_records = _positive(options, "minOffsetsPerTrigger")
        if min_records is not None and max_given and max_records and min_records > max_records:
            raise OptionError(
                f"minOffsetsPerTrigger ({min_records}) is higher than {max_given[0]} "
                f"({max_records})"
            )
        delay = options.get("maxtriggerdelay")
        delay_ms = (
            DEFAULT_MAX_TRIGGER_DELAY_MS if delay is None else duration_ms(delay, "maxTriggerDelay")
        )
        timeout_ms = _positive(options, "transactionTimeoutMs") or DEFAULT_TRANSACTION_TIMEOUT_MS
        if timeout_ms > MAX_TXN_TIMEOUT_MS:
            raise OptionError(f"option transactionTimeoutMs may be {MAX_TXN_TIMEOUT_MS} at most")
        return cls(
            brokers=brokers,
            topics=topics,
            starting=starting,
            ending=ending,
            max_records_per_trigger=max_records,
            min_partitions=_positive(options, "minPartitions"),
            fail_on_data_loss=_flag(options, "failOnDataLoss", True),
            include_headers=_flag(options, "includeHeaders", False),
            token=options.get("token") or None,
            token_file=options.get("tokenfile") or None,
            context=options.get("context") or None,
            ca_file=options.get("cafile") or None,
            transaction_timeout_ms=timeout_ms,
            pattern=pattern,
            assigned=assigned,
            starting_timestamp_ms=starting_ts,
            ending_timestamp_ms=ending_ts,
            starting_by_timestamp=by_timestamp["startingOffsetsByTimestamp"],
            ending_by_timestamp=by_timestamp["endingOffsetsByTimestamp"],
            timestamp_strategy=strategy,
            min_records_per_trigger=min_records,
            max_trigger_delay_ms=delay_ms,
        )


def _subscription(
    options: Mapping[str, str],
) -> tuple[str | None, tuple[tuple[str, tuple[int, ...]], ...] | None, tuple[str, ...]]:
    """(pattern, assignment, topics) of the one strategy given, as the Kafka source: exactly
    one of subscribe (its aliases topic, topics), subscribePattern, assign."""
    strategies = [
        name
        for name in ("subscribe", "topic", "topics", "subscribePattern", "assign")
        if name.lower() in options
    ]
    if not strategies:
        raise OptionError(
            "one of the options subscribe (or topic, topics: comma-separated topics), "
            "subscribePattern or assign is required"
        )
    if len(strategies) > 1:
        raise OptionError(
            f"only one of the options subscribe, subscribePattern, assign may be given "
            f"(topic and topics are aliases of subscribe); got {', '.join(strategies)}"
        )
    name = strategies[0]
    value = options[name.lower()]
    if name == "subscribePattern":
        try:
            re.compile(value)
        except re.error as e:
            raise OptionError(
                f"option subscribePattern {value!r} is not a valid pattern: {e}"
            ) from None
        return value, None, ()
    if name == "assign":
        return None, _assignment(value), ()
    topics = tuple(t.strip() for t in value.split(",") if t.strip())
    if not topics:
        raise OptionError(f"option {name} names no topic: give comma-separated topic names")
    return None, None, topics


def spec(value: str, name: str) -> str | Offsets:
    """`earliest`, `latest`, or per-partition JSON offsets (validated)."""
    if value in ("earliest", "latest"):
        return value
    try:
        parsed = json.loads(value)
    except ValueError:
        raise OptionError(f"{name} must be earliest, latest or JSON, not {value!r}") from None
    if not isinstance(parsed, dict):
        raise OptionError(f'{name}: expected {{"topic": {{"0": 23}}}}, got {value!r}')
    return _per_partition(
        parsed, name, lambda index: index >= EARLIEST, "an index (or -2 earliest, -1 latest)"
    )


def timestamps(value: str, name: str) -> Timestamps:
    """`{"topic": {"0": 1700000000000}}`: a timestamp (ms since the epoch) per partition."""
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise OptionError(f'{name} must be JSON such as {{"orders": {{"0": 1700000000000}}}}')
    return _per_partition(
        parsed,
        name,
        lambda stamp: MIN_TIMESTAMP_MS <= stamp <= MAX_TIMESTAMP_MS,
        "a timestamp in ms since the epoch",
    )


def _per_partition(
    parsed: dict[Any, Any], name: str, valid: Callable[[int], bool], what: str
) -> dict[str, dict[str, int]]:
    """`{"topic": {"0": n}}` checked: every topic's value an object, every key a partition
    number, every value an integer (not a bool) that `valid` takes; `what` names it."""
    out: dict[str, dict[str, int]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"{name}: the partitions of {topic!r} must be an object")
        out[topic] = {}
        for partition, value in partitions.items():
            if (
                not str(partition).isdigit()
                or not isinstance(value, int)
                or isinstance(value, bool)
                or not valid(value)
            ):
                raise OptionError(
                    f"{name}: {topic}/{partition} must map a partition number to {what}, "
                    f"got {value!r}"
                )
            out[topic][str(int(partition))] = value
    return out


@dataclass(frozen=True)
class Bounds:
    """What one partition holds now: its first stored index and the next index to commit."""

    log_start: int
    end: int  # commit index + 1


def resolve(
    wanted: str | Offsets, bounds: Mapping[str, Mapping[str, Bounds]], name: str
) -> Offsets:
    """Concrete offsets for every partition of every topic in `bounds`. Partitions that JSON
    offsets leave out start at the earliest (as new partitions do)."""
    out: Offsets = {}
    for topic, partitions in bounds.items():
        given = wanted.get(topic, {}) if isinstance(wanted, dict) else {}
        out[topic] = {}
        for partition, bound in partitions.items():
            choice: int | str = (
                given.get(partition, EARLIEST) if isinstance(wanted, dict) else wanted
            )
            if choice in (EARLIEST, "earliest"):
                out[topic][partition] = bound.log_start
            elif choice in (LATEST, "latest"):
                out[topic][partition] = bound.end
            else:
                out[topic][partition] = int(choice)
    if isinstance(wanted, dict):
        _all_read(wanted, bounds, name)
    return out


def _all_read(named: Mapping[str, Mapping[str, Any]], bounds: Mapping[str, Any], name: str) -> None:
    for topic, partitions in named.items():
        missing = sorted(set(partitions) - set(bounds.get(topic, {})), key=int)
        if topic not in bounds or missing:
            raise OptionError(
                f"{name} names partitions that do not exist or are not read: {topic} {missing}"
            )


def timestamps_wanted(
    every_ms: int | None, by_partition: str | None, bounds: Mapping[str, Mapping[str, Bounds]],
    name: str,
) -> Timestamps:  # fmt: skip
    """The timestamp to look up per partition: `every_ms` for all (it wins, as Kafka's
    starting/endingTimestamp), else those JSON `by_partition` names (every one must be read);
    the partitions left out are placed by the offsets options."""
    if every_ms is not None:
        return {t: {p: every_ms for p in parts} for t, parts in bounds.items()}
    if by_partition is None:
        return {}
    wanted = timestamps(by_partition, name)
    _all_read(wanted, bounds, name)
    return wanted


def place_by_time(
    offsets: Offsets,
    wanted: Timestamps,
    found: Mapping[str, Mapping[str, int | None]],
    bounds: Mapping[str, Mapping[str, Bounds]],
    *,
    starting: bool,
    strategy: str = "error",
) -> Offsets:
    """`offsets` with the partitions of `wanted` at `found`: the index of the first record at
    or after the partition's timestamp, None when it has none that late. Such a partition
    ends at the latest (Kafka's rule for endings); a start fails (OptionError) unless
    `strategy` is "latest", which starts it at the latest."""
    out = {t: dict(parts) for t, parts in offsets.items()}
    for topic, parts in wanted.items():
        for partition, stamp in parts.items():
            index = found.get(topic, {}).get(partition)
            if index is None and starting and strategy == "error":
                raise OptionError(
                    f"{topic}/{partition} has no record at or after timestamp {stamp} "
                    f"(set startingOffsetsByTimestampStrategy=latest to start such partitions "
                    f"at the latest offset)"
                )
            bound = bounds[topic][partition]
            out[topic][partition] = bound.end if index is None else index
    return out


@dataclass(frozen=True)
class Range:
    """Records low <= index < high of one topic partition: one Spark input partition."""

    topic: str
    partition: int
    low: int
    high: int


def plan(start: Offsets, end: Offsets, min_partitions: int | None = None) -> list[Range]:
    """One range per topic partition with records between `start` and `end`; with
    `min_partitions`, the largest ranges are split until there are at least that many."""
    ranges = [
        Range(topic, int(partition), start.get(topic, {}).get(partition, high), high)
        for topic, partitions in sorted(end.items())
        for partition, high in sorted(partitions.items(), key=lambda item: int(item[0]))
    ]
    ranges = [r for r in ranges if r.high > r.low]
    while min_partitions and len(ranges) < min_partitions:
        largest = max(ranges, key=lambda r: r.high - r.low, default=None)
        if largest is None or largest.high - largest.low < 2:
            break
        middle = largest.low + (largest.high - largest.low) // 2
        at = ranges.index(largest)
        ranges[at : at + 1] = [
            Range(largest.topic, largest.partition, largest.low, middle),
            Range(largest.topic, largest.partition, middle, largest.high),
        ]
    return ranges


def waiting(start: Offsets, latest: Offsets) -> int:
    """How many records lie between `start` and `latest` (partitions `start` lacks: none)."""
    return sum(
        max(high - start.get(t, {}).get(p, high), 0)
        for t, parts in latest.items()
        for p, high in parts.items()
    )


def limit(start: Offsets, latest: Offsets, max_records: int) -> Offsets:
    """`latest`, capped so that at most `max_records` records lie between `start` and it:
    shared among partitions in proportion to what each has waiting (Kafka's way), and at least
    one record when anything waits."""
    lag = {
        (t, p): max(high - start.get(t, {}).get(p, high), 0)
        for t, parts in latest.items()
        for p, high in parts.items()
    }
    total = sum(lag.values())
    if total <= max_records:
        return {t: dict(parts) for t, parts in latest.items()}
    share = {key: lag[key] * max_records // total for key in lag}
    left = max_records - sum(share.values())
    for key in sorted(lag, key=lambda k: lag[k] - share[k], reverse=True):
        if left <= 0:
            break
        if share[key] < lag[key]:
            share[key] += 1
            left -= 1
    out: Offsets = {t: {} for t in latest}
    for (t, p), high in ((k, latest[k[0]][k[1]]) for k in lag):
        out[t][p] = start.get(t, {}).get(p, high) + share[(t, p)] if lag[(t, p)] else high
    return out


def as_json(offsets: Offsets) -> dict[str, Any]:
    """Offsets as Spark stores them (plain dicts of primitives)."""
    return {t: {p: int(i) for p, i in parts.items()} for t, parts in offsets.items()}
