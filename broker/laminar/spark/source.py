"""The `laminar` source: batch (`spark.read`) and Structured Streaming (`spark.readStream`).

Planning happens on the driver: offsets are resolved against the cluster there and cut into
ranges (one per topic partition, or more with minPartitions). Each range is read on an
executor by `read_range`, which replays exactly the committed records low <= index < high, so
a micro-batch read twice gives the same rows and the checkpoint's offsets give exactly-once
input. Readers hold only options and offsets (they are pickled to the executors); clients are
made inside `read`.
"""

from __future__ import annotations

import concurrent.futures
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
from ..client.models import RawRead, ReadResult
from ..contract import MAX_READ_RECORDS, MAX_TXN_TIMEOUT_MS
from .arrow import ColumnBuilder
from .options import (
    Bounds,
    Offsets,
    OptionError,
    Options,
    Range,
    as_json,
    limit,
    plan,
    resolve,
    spec,
)

try:  # Spark >= 4.2: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover (Spark 4.0 / 4.1)
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]

READ_MAX_BYTES = 8 * 1024 * 1024
READ_MAX_RECORDS = MAX_READ_RECORDS  # as many as the broker gives in one answer
#: How long a replica may take to learn that the range's records are committed: the range was
#: planned from the leader's commit index, and the replica serving the read may lag it.
READ_WAIT_MS = 10_000


class DataLossError(RuntimeError):
    """Records of a range were removed (retention) before they were read."""


def bounds_of(options: Options) -> dict[str, dict[str, Bounds]]:
    """Every partition's first stored index and next index to commit, per topic."""
    out: dict[str, dict[str, Bounds]] = {}
    with Client(list(options.brokers), token=options.token, ca_file=options.ca_file) as client:
        for topic in options.topics:
            try:
                described = client.describe_topic(topic)
            except NotFound:
                raise OptionError(f"topic {topic!r} does not exist") from None
            out[topic] = {
                str(p.partition): Bounds(p.log_start, p.commit_index + 1)
                for p in described.partition_states
            }
    return out


def ends(bounds: dict[str, dict[str, Bounds]]) -> Offsets:
    """The offsets just past every partition's last committed record."""
    return {t: {p: b.end for p, b in parts.items()} for t, parts in bounds.items()}


def with_new_partitions(offsets: Offsets, bounds: dict[str, dict[str, Bounds]]) -> Offsets:
    """`offsets` plus the partitions it lacks (added since it was handed out), each at its
    first stored record."""
    out = {t: dict(parts) for t, parts in offsets.items()}
    for topic, parts in bounds.items():
        for partition, bound in parts.items():
            out.setdefault(topic, {}).setdefault(partition, bound.log_start)
    return out


class RangePartition(InputPartition):
    """One Spark input partition: a Range (picklable, no client)."""

    def __init__(self, range_: Range) -> None:
        self.range = range_


def read_range(options: Options, part: Range) -> Iterator[pa.RecordBatch]:
    """The committed records low <= index < high of one partition, as Arrow batches.

    A read long-polls (`wait_ms`): a replica that has not yet learned the commit index the
    range was planned from answers once it has. The next read is asked for (from the answer's
    Laminar-Next-Index) before this one is decoded, so the broker works while this process
    builds columns. The answers and columns are buffers of megabytes: this process keeps them
    mapped between reads (`allocator`)."""
    allocator.keep_read_buffers()
    builder = ColumnBuilder(part.topic, part.partition, options.include_headers)
    with Client(list(options.brokers), token=options.token, ca_file=options.ca_file) as client:

        def fetch(at: int) -> concurrent.futures.Future[RawRead | ReadResult]:
            return client.submit(
                client.async_client.read_batches(
                    part.topic, part.partition, at,
                    max_records=min(READ_MAX_RECORDS, part.high - at), max_bytes=READ_MAX_BYTES,
                    wait_ms=READ_WAIT_MS,
                )
            )  # fmt: skip

        position = part.low
        pending = fetch(position)
        # records committed but held back by a transaction still open before them (reads
        # are read_committed: docs/transactions.md) are waited for, up to the longest a
        # transaction may stay open
        held_until = time.monotonic() + MAX_TXN_TIMEOUT_MS / 1000 + READ_WAIT_MS / 1000
        while position < part.high:
            try:
                raw = pending.result()
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
            if isinstance(raw, ReadResult):  # a broker that answered in JSON
                raise RuntimeError(f"{part.topic}/{part.partition}: no binary read answer")
            guess = raw.next_index
            ahead = fetch(guess) if guess is not None and position < guess < part.high else None
            after = builder.add(raw.body, position, part.high)
            if after <= position:
                if guess is None or guess <= position:
                    if raw.commit_index >= position and time.monotonic() < held_until:
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
            batch = builder.take()
            if batch is not None:
                yield batch


class BatchReader(DataSourceReader):
    def __init__(self, options: Options) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        bounds = bounds_of(self.options)
        start = resolve(spec(self.options.starting, "startingOffsets"), bounds, "startingOffsets")
        end = resolve(spec(self.options.ending, "endingOffsets"), bounds, "endingOffsets")
        ranges = plan(start, end, self.options.min_partitions)
        return [RangePartition(r) for r in ranges] or [RangePartition(Range("", 0, 0, 0))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        part = cast(RangePartition, partition).range
        if part.high > part.low:
            yield from read_range(self.options, part)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets per topic partition. On Spark >= 4.2 `latestOffset(start, limit)` honours the
    engine's read limit (maxRecordsPerTrigger, or everything for availableNow); Spark 4.0/4.1
    call `latestOffset()` and get the same cap from the last offset this reader handed out."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self._target: Offsets | None = None  # availableNow: nothing beyond this
        self._last: Offsets | None = None

    def initialOffset(self) -> dict[str, Any]:
        bounds = bounds_of(self.options)
        start = resolve(spec(self.options.starting, "startingOffsets"), bounds, "startingOffsets")
        return as_json(start)

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit_: Any = None
    ) -> dict[str, Any]:
        bounds = bounds_of(self.options)
        begin = with_new_partitions(start or self._last or {}, bounds)
        latest = ends(bounds)
        if self._target is not None:  # availableNow: nothing beyond what was there at first
            latest = {
                t: {p: min(i, self._target.get(t, {}).get(p, i)) for p, i in parts.items()}
                for t, parts in latest.items()
            }
        cap = self.options.max_records_per_trigger
        if ReadMaxRows is not None and isinstance(limit_, ReadMaxRows):
            cap = limit_.max_rows
        elif ReadAllAvailable is not None and isinstance(limit_, ReadAllAvailable):
            cap = None
        # without `start` (Spark < 4.2) the cap counts from the last offset handed out; the
        # first batch after a (re)start is not capped, since where it starts is not known here
        if cap is not None and (start is not None or self._last is not None):
            latest = limit(begin, latest, cap)
        self._last = latest
        return as_json(latest)

    def getDefaultReadLimit(self) -> Any:
        if self.options.max_records_per_trigger is not None:
            return ReadMaxRows(self.options.max_records_per_trigger)
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
