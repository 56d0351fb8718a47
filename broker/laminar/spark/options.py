"""The `laminar` source and sink options (the Kafka connector's names), offsets and range
planning: pure functions, no Spark and no I/O, so they are tested on their own.

Offsets are JSON objects `{"topic": {"0": 23, "1": 7}}`: per topic partition (string keys),
the next index to read. In `startingOffsets` / `endingOffsets`, -2 means earliest and -1
latest, as in Kafka's; the words `earliest` and `latest` mean that for every partition.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..contract import MAX_TXN_TIMEOUT_MS

EARLIEST, LATEST = -2, -1
#: topic -> partition (as a string) -> next index
Offsets = dict[str, dict[str, int]]
#: Options Spark itself passes, or that belong to the other side (source / sink).
KNOWN = {
    "brokers", "topic", "topics", "startingoffsets", "endingoffsets", "maxrecordspertrigger",
    "minpartitions", "failondataloss", "includeheaders", "token", "path", "checkpointlocation",
    "cafile", "tokenfile", "context", "transactiontimeoutms",
}  # fmt: skip
#: The sink's: how long a task's transaction may stay open, from its first write to the
#: driver's commit of the whole (micro-)batch.
DEFAULT_TRANSACTION_TIMEOUT_MS = 300_000


class OptionError(ValueError):
    """An option is missing or wrong; the message names it."""


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name)
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise OptionError(f"option {name} must be true or false, not {raw!r}")
    return raw.lower() == "true"


def _positive(options: Mapping[str, str], name: str) -> int | None:
    raw = options.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name} must be a positive integer, not {raw!r}") from None
    if value < 1:
        raise OptionError(f"option {name} must be a positive integer, not {raw!r}")
    return value


@dataclass(frozen=True)
class Options:
    brokers: tuple[str, ...]
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

    @classmethod
    def parse(cls, raw: Mapping[str, str], *, stream: bool, sink: bool = False) -> Options:
        """`raw`: Spark's options (case-insensitive keys)."""
        options = {k.lower(): v for k, v in raw.items()}
        unknown = sorted(set(options) - KNOWN)
        if unknown:
            raise OptionError(f"unknown options {unknown} (known: {sorted(KNOWN)})")
        brokers = tuple(b.strip() for b in options.get("brokers", "").split(",") if b.strip())
        if not brokers:
            raise OptionError("option brokers is required: comma-separated broker API URLs")
        if "topic" in options and "topics" in options:
            raise OptionError("give option topic or topics, not both")
        named = options.get("topic") or options.get("topics") or ""
        topics = tuple(t.strip() for t in named.split(",") if t.strip())
        if not topics and not sink:
            raise OptionError("option topic (or topics, comma-separated) is required")
        if stream and "endingoffsets" in options:
            raise OptionError("endingOffsets is for batch reads only")
        starting = options.get("startingoffsets", "latest" if stream else "earliest")
        ending = options.get("endingoffsets", "latest")
        for name, value in (("startingOffsets", starting), ("endingOffsets", ending)):
            spec(value, name)  # validated now, resolved later against the cluster
        if ending == "earliest":
            raise OptionError("endingOffsets may not be earliest")
        timeout_ms = _positive(options, "transactiontimeoutms") or DEFAULT_TRANSACTION_TIMEOUT_MS
        if timeout_ms > MAX_TXN_TIMEOUT_MS:
            raise OptionError(f"option transactionTimeoutMs may be {MAX_TXN_TIMEOUT_MS} at most")
        return cls(
            brokers=brokers,
            topics=topics,
            starting=starting,
            ending=ending,
            max_records_per_trigger=_positive(options, "maxrecordspertrigger"),
            min_partitions=_positive(options, "minpartitions"),
            fail_on_data_loss=_flag(options, "failondataloss", True),
            include_headers=_flag(options, "includeheaders", False),
            token=options.get("token") or None,
            token_file=options.get("tokenfile") or None,
            context=options.get("context") or None,
            ca_file=options.get("cafile") or None,
            transaction_timeout_ms=timeout_ms,
        )


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
    out: Offsets = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"{name}: the partitions of {topic!r} must be an object")
        out[topic] = {}
        for partition, index in partitions.items():
            if not str(partition).isdigit() or not isinstance(index, int) or index < EARLIEST:
                raise OptionError(
                    f"{name}: {topic}/{partition} must map a partition number to an index "
                    f"(or -2 earliest, -1 latest), got {index!r}"
                )
            out[topic][str(int(partition))] = index
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
        for topic, named in wanted.items():
            missing = sorted(set(named) - set(bounds.get(topic, {})), key=int)
            if topic not in bounds or missing:
                raise OptionError(f"{name} names partitions that do not exist: {topic} {missing}")
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
