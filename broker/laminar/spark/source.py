"""The `laminar` source: batch (`spark.read`) and Structured Streaming (`spark.readStream`).

Planning happens on the driver: the partitions read (`subscribe`, `subscribePattern` or
`assign`) and their offsets are resolved against the cluster there, timestamps included, and
cut into ranges (one per topic partition, or more with minPartitions). Each range is read on
an executor by `read_range`, which replays exactly the committed records low <= index < high,
so a micro-batch read twice gives the same rows and the checkpoint's offsets give exactly-once
input. Readers hold only options and offsets (they are pickled to the executors); clients are
made inside `read`.
"""

from __future__ import annotations

import concurrent.futures
import re
import time
from collections.abc import Iterator, Sequence
from typing import Any, cast

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from .. import allocator
from ..client import Client
from ..client.errors import NotFound, OutOfRange
from ..client.models import ReadResult
from ..contract import MAX_READ_BYTES, MAX_READ_RECORDS, MAX_TXN_TIMEOUT_MS
from .arrow import ColumnBuilder
from .fetch import Answer, Fetcher
from .options import (
    Bounds,
    Offsets,
    OptionError,
    Options,
    Range,
    Timestamps,
    as_json,
    limit,
    place_by_time,
    plan,
    resolve,
    spec,
    timestamps_wanted,
    waiting,
)

try:  # Spark >= 4.2: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover (Spark 4.0 / 4.1)
    ReadAllAvailable = ReadMaxRows = ReadMinRows = None  # type: ignore[assignment,misc]
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

#: As much as the broker gives in one answer: fewer round trips, and one Arrow batch each.
READ_MAX_BYTES = MAX_READ_BYTES
READ_MAX_RECORDS = MAX_READ_RECORDS
#: How long a replica may take to learn that the range's records are committed: the range was
#: planned from the leader's commit index, and the replica serving the read may lag it.
READ_WAIT_MS = 10_000


class DataLossError(RuntimeError):
    """Records of a range were removed (retention), or partitions read were deleted, before
    they were read."""


def bounds_of(options: Options) -> dict[str, dict[str, Bounds]]:
    """Every partition read, per topic: its first stored index and next index to commit."""
    out: dict[str, dict[str, Bounds]] = {}
    with Client(list(options.brokers), token=options.token, ca_file=options.ca_file) as client:
        if options.pattern is not None:
            matches = re.compile(options.pattern).fullmatch
            for state in client.partitions():
                if state.topic is not None and matches(state.topic):
                    out.setdefault(state.topic, {})[str(state.partition)] = Bounds(
                        state.log_start, state.commit_index + 1
                    )
            return out
        wanted: Sequence[tuple[str, tuple[int, ...] | None]] = options.assigned or [
            (t, None) for t in options.topics
        ]
        for topic, partitions in wanted:
            try:
                described = client.describe_topic(topic)
            except NotFound:
                raise OptionError(f"topic {topic!r} does not exist") from None
            states = {p.partition: p for p in described.partition_states}
            missing = sorted(set(partitions or ()) - set(states))
            if missing:
                raise OptionError(f"option assign: topic {topic!r} has no partitions {missing}")
            out[topic] = {
                str(p): Bounds(states[p].log_start, states[p].commit_index + 1)
                for p in (partitions if partitions is not None else sorted(states))
            }
        return out


def ends(bounds: dict[str, dict[str, Bounds]]) -> Offsets:
    """The offsets just past every partition's last committed record."""
    return {t: {p: b.end for p, b in parts.items()} for t, parts in bounds.items()}


def with_new_partitions(offsets: Offsets, bounds: dict[str, dict[str, Bounds]]) -> Offsets:
    """`offsets` plus the partitions it lacks (added since it was handed out, or of a topic
    that has come to match subscribePattern), each at its first stored record."""
    out = {t: dict(parts) for t, parts in offsets.items()}
    for topic, parts in bounds.items():
        for partition, bound in parts.items():
            out.setdefault(topic, {}).setdefault(partition, bound.log_start)
    return out


def times_to_offsets(options: Options, wanted: Timestamps) -> dict[str, dict[str, int | None]]:
    """Per partition of `wanted`, the index of its first record whose timestamp is at or after
    the partition's (None: no record that late), from the brokers (Kafka's offsetsForTimes)."""
    found: dict[str, dict[str, int | None]] = {}
    with Client(list(options.brokers), token=options.token, ca_file=options.ca_file) as client:
        for topic, parts in wanted.items():
            stamps = set(parts.values())
            found[topic] = {}
            if len(stamps) == 1:  # one call for the topic
                every = client.offsets_for_times(topic, stamps.pop())
                for partition in parts:
                    hit = every.get(int(partition))
                    found[topic][partition] = None if hit is None else hit[0]
                continue
            for partition, stamp in parts.items():
                offsets = client.partition_offsets(topic, int(partition), timestamp_ms=stamp)
                found[topic][partition] = offsets.index
    return found


def starting_offsets(options: Options, bounds: dict[str, dict[str, Bounds]]) -> Offsets:
    """Where a read starts: `startingTimestamp`, else `startingOffsetsByTimestamp` for the
    partitions it names, else `startingOffsets` (Kafka's precedence)."""
    start = resolve(spec(options.starting, "startingOffsets"), bounds, "startingOffsets")
    wanted = timestamps_wanted(
        options.starting_timestamp_ms, options.starting_by_timestamp, bounds,
        "startingOffsetsByTimestamp",
    )  # fmt: skip
    if not wanted:
        return start
    found = times_to_offsets(options, wanted)
    return place_by_time(
        start, wanted, found, bounds, starting=True, strategy=options.timestamp_strategy
    )


def ending_offsets(options: Options, bounds: dict[str, dict[str, Bounds]]) -> Offsets:
    """Where a batch read ends (exclusive): `endingTimestamp`, else
    `endingOffsetsByTimestamp` for the partitions it names, else `endingOffsets`."""
    end = resolve(spec(options.ending, "endingOffsets"), bounds, "endingOffsets")
    wanted = timestamps_wanted(
        options.ending_timestamp_ms, options.ending_by_timestamp, bounds,
        "endingOffsetsByTimestamp",
    )  # fmt: skip
    if not wanted:
        return end
    return place_by_time(end, wanted, times_to_offsets(options, wanted), bounds, starting=False)


class RangePartition(InputPartition):
    """One Spark input partition: a Range (picklable, no client)."""

    def __init__(self, range_: Range) -> None:
        self.range = range_


def read_range(options: Options, part: Range) -> Iterator[pa.RecordBatch]:
    """The committed records low <= index < high of one partition, as Arrow batches (one per
    read answer, of up to READ_MAX_BYTES).

    A read long-polls (`wait_ms`): a replica that has not yet learned the commit index the
    range was planned from answers once it has. The next read is asked for (from the answer's
    Laminar-Next-Index) before this one is decoded, so the broker works while this process
    builds columns; answers arrive in buffers the fetcher reuses (`fetch.Fetcher`), and the
    columns are megabytes too: this process keeps such buffers mapped (`allocator`)."""
    allocator.keep_read_buffers()
    builder = ColumnBuilder(part.topic, part.partition, options.include_headers)
    with (
        Client(list(options.brokers), token=options.token, ca_file=options.ca_file) as client,
        Fetcher(
            client, part.topic, part.partition, token=options.token, ca_file=options.ca_file,
            wait_ms=READ_WAIT_MS,
        ) as fetcher,
    ):  # fmt: skip

        def fetch(at: int) -> concurrent.futures.Future[Answer]:
            return fetcher.submit(at, min(READ_MAX_RECORDS, part.high - at), READ_MAX_BYTES)

        position = part.low
        pending = fetch(position)
        # records committed but held back by a transaction still open before them (reads
        # are read_committed: docs/transactions.md) are waited for, up to the longest a
        # transaction may stay open
        held_until = time.monotonic() + MAX_TXN_TIMEOUT_MS / 1000 + READ_WAIT_MS / 1000
        while position < part.high:
            try:
                answer: Answer = pending.result()
            except OutOfRange as e:
                log_start = e.log_start if e.log_start is not None else position + 1
                if options.fail_on_data_loss:
                    raise DataLossError(
                        f"{part.topic}/{part.partition}: records {position}..{log_start - 1} "
                        f"were removed (retention) before they were read; set "
                        f"failOnDataLoss=false to skip them"
                    ) from e
                position = log_start
                pending = fetch(position)
                continue
            raw = answer.read
            if isinstance(raw, ReadResult):  # a broker that answered in JSON
                raise RuntimeError(f"{part.topic}/{part.partition}: no binary read answer")
            guess = raw.next_index
            ahead = fetch(guess) if guess is not None and position < guess < part.high else None
            after = builder.add(raw.body, position, part.high)
            if after <= position:  # (no rows were added: nothing refers to the answer)
                if guess is None or guess <= position:
                    if raw.commit_index >= position and time.monotonic() < held_until:
                        fetcher.release(answer)
                        pending = fetch(position)  # a transaction holds it: wait on
                        continue
                    lagging = raw.commit_index < position
                    raise RuntimeError(
                        f"{part.topic}/{part.partition}: no progress reading at {position} "
                        f"(the replica has committed up to {raw.commit_index}"
                        + (f" after waiting {READ_WAIT_MS / 1000:g} s)" if lagging else ")")
                    )
                after = guess  # only control batches, or nothing stored there
            position = after
            if position < part.high:
                if ahead is None or guess != position:
                    if ahead is not None:
                        ahead.cancel()
                    ahead = fetch(position)
                pending = ahead
            elif ahead is not None:
                ahead.cancel()
            batch = builder.take()  # (the rows copied out of the answer's buffer)
            fetcher.release(answer)
            if batch is not None:
                yield batch


class BatchReader(DataSourceReader):
    def __init__(self, options: Options) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        bounds = bounds_of(self.options)
        start = starting_offsets(self.options, bounds)
        end = ending_offsets(self.options, bounds)
        ranges = plan(start, end, self.options.min_partitions)
        return [RangePartition(r) for r in ranges] or [RangePartition(Range("", 0, 0, 0))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        part = cast(RangePartition, partition).range
        if part.high > part.low:
            yield from read_range(self.options, part)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets per topic partition. On Spark >= 4.2 `latestOffset(start, limit)` honours the
    engine's read limit (maxOffsetsPerTrigger, minOffsetsPerTrigger, or everything for
    availableNow); Spark 4.0/4.1 call `latestOffset()` and get the same limits counted from the
    last offset this reader handed out."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self._target: Offsets | None = None  # availableNow: nothing beyond this
        self._last: Offsets | None = None
        #: when the last batch was let through (minOffsetsPerTrigger holds one back at most
        #: maxTriggerDelay after it); None: none yet, the first is never held back
        self._last_trigger_s: float | None = None

    def initialOffset(self) -> dict[str, Any]:
        return as_json(starting_offsets(self.options, bounds_of(self.options)))

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit_: Any = None
    ) -> dict[str, Any]:
        bounds = bounds_of(self.options)
        known = start if start is not None else self._last
        begin = with_new_partitions(known or {}, bounds)
        self._check_gone(begin, bounds)
        latest = ends(bounds)
        if self._target is not None:  # availableNow: nothing beyond what was there at first
            latest = {
                t: {p: min(i, self._target.get(t, {}).get(p, i)) for p, i in parts.items()}
                for t, parts in latest.items()
            }
        everything = ReadAllAvailable is not None and isinstance(limit_, ReadAllAvailable)
        cap = None if everything else self.options.max_records_per_trigger
        if ReadMaxRows is not None and isinstance(limit_, ReadMaxRows):
            cap = limit_.max_rows
        least = None if everything else self.options.min_records_per_trigger
        if ReadMinRows is not None and isinstance(limit_, ReadMinRows):
            least = limit_.min_rows
        # without `start` (Spark < 4.2) the limits count from the last offset handed out; the
        # first batch after a (re)start is not limited, since where it starts is not known here
        if known is not None:
            if least is not None and self._target is None and self._hold(begin, latest, least):
                return as_json(known)  # no new batch yet
            if cap is not None:
                latest = limit(begin, latest, cap)
        self._last = latest
        return as_json(latest)

    def _hold(self, begin: Offsets, latest: Offsets, least: int) -> bool:
        """minOffsetsPerTrigger: hold the batch back while fewer than `least` records wait,
        unless maxTriggerDelay has passed since the last batch (Kafka's rule)."""
        now_s = time.monotonic()
        last_s = self._last_trigger_s
        due = last_s is None or now_s - last_s >= self.options.max_trigger_delay_ms / 1000
        if not due and waiting(begin, latest) < least:
            return True
        self._last_trigger_s = now_s
        return False

    def _check_gone(self, begin: Offsets, bounds: dict[str, dict[str, Bounds]]) -> None:
        """Partitions read so far that no longer exist (a topic deleted since): data loss,
        reported as failOnDataLoss says (as the Kafka source does)."""
        gone = sorted(
            f"{t}/{p}" for t, parts in begin.items() for p in parts if p not in bounds.get(t, {})
        )
        if gone and self.options.fail_on_data_loss:
            raise DataLossError(
                f"partitions {gone} were read by this query and no longer exist (their topic "
                f"was deleted?); set failOnDataLoss=false to go on without them"
            )

    def getDefaultReadLimit(self) -> Any:
        if self.options.max_records_per_trigger is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
        if self.options.min_records_per_trigger is not None:
            return ReadMinRows(self.options.min_records_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = ends(bounds_of(self.options))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin: Offsets = start
        if any(p not in start.get(t, {}) for t, parts in end.items() for p in parts):
            begin = with_new_partitions(start, bounds_of(self.options))
        return [RangePartition(r) for r in plan(begin, end, self.options.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_range(self.options, cast(RangePartition, partition).range)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # the checkpoint holds the offsets; the brokers keep nothing per reader
