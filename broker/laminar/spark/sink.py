"""The `laminar` sink: `df.write` and `df.writeStream` into topics.

Columns: `value` (required, binary or string), `key`, `headers` (array of struct<key, value>),
`topic` and `partition` (optional; the `topic` option wins over the column). A row without a
partition goes where its key hashes (`laminar.client.partitioner`), or, without a key, to the
partition keyless rows fill now (one append's worth each, in turn): both the same when a task
runs again. Rows are encoded column by column (`encode.py`) into appends of up to 8 MiB.

A (micro-)batch commits atomically across partitions (docs/transactions.md). Each task writes
as a transactional id of its own, derived from the query id (or, for `df.write`, the write's
id) and the task's partition, so a task run again fences and aborts its earlier attempt's
transaction. The driver's commit then ends every task's transaction with one request
(`also`), committed all or none, tagged with the batch id. A query restarted after the
commit was decided but before Spark recorded it runs the batch again: each task finds its id's
last transaction committed with that batch's tag, and writes nothing. Killed before, the
restart's tasks abort what the killed ones left open. `read_committed` readers (the default)
never see part of a batch. As with any exactly-once sink, the input of a batch run again must
be the same rows (a deterministic upstream).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyspark.sql.datasource as datasource
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from ..client import Client, LaminarError, NotFound
from ..client.errors import PayloadTooLarge
from ..client.models import AppendResult
from ..client.partitioner import key_hash
from ..log.batch import BATCH_HEADER_BYTES
from ..txn.coordinator import DEFAULT_EXPIRY_MS
from .encode import Rows, binary, encode_rows, row_sizes
from .options import OptionError, Options

#: Spark >= 4.1 hands stream writers Arrow batches; 4.0 hands them rows
_StreamWriterBase: type = getattr(
    datasource, "DataSourceStreamArrowWriter", datasource.DataSourceStreamWriter
)

#: One append's records section at most: a batch of the brokers' default largest size (their
#: max_batch_bytes and max_request_bytes, 8 MiB). Fewer where the topic's batches must be
#: smaller (`_batch_limit`), or once a broker refuses it as too large (it is cut in halves).
#: Larger appends cost the brokers less per record: 4 MiB ones ran at about 70k rows/s in
#: bench/spark_bench.py, 6 MiB ones at about 100k (bench/RESULTS.md).
BYTES_PER_APPEND = 8 * 1024 * 1024 - BATCH_HEADER_BYTES
#: Rows waiting for their append, over every partition, at most (the largest is appended).
MAX_PENDING_BYTES = 32 * 1024 * 1024
#: Appends in flight at once, to different partitions (one partition's go one at a time:
#: their sequence numbers must arrive in order).
MAX_APPENDS_IN_FLIGHT = 4
#: How long a `df.write`'s ids are kept once ended (never used again: each write has its own).
BATCH_WRITE_EXPIRY_MS = 60_000
#: Tasks' transactions one end request commits (the coordinator's MAX_ENDED_TOGETHER + 1).
MAX_TASKS = 1001


@dataclass
class Written(WriterCommitMessage):
    records: int
    #: rows a retried task found written already (its id's transaction committed with this
    #: batch's tag, or appends the broker answered as duplicates)
    duplicates: int
    #: (transactional id, producer id) of the task's transaction; None if it wrote nothing
    txn: tuple[str, int] | None = None


def _rows(batch: Any) -> pa.RecordBatch:
    if not isinstance(batch, pa.RecordBatch):  # Spark 4.0 streaming: a Row
        batch = pa.RecordBatch.from_pylist([batch.asDict()])
    return batch


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    index = batch.schema.get_field_index(name)
    return batch.column(index) if index >= 0 else None


def _batch_limit(config: Mapping[str, Any]) -> int:
    """The largest records section an append to a topic of `config` may carry: below
    BYTES_PER_APPEND, the topic's max_batch_bytes and half its segment_bytes, less the batch
    header (a limit of the broker's own is found out by its refusal: see `_Appender._wait`)."""
    limit = BYTES_PER_APPEND
    for key, share in (("max_batch_bytes", 1), ("segment_overflow_bytes", 1), ("segment_bytes", 2)):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            limit = min(limit, value // share - BATCH_HEADER_BYTES)
    return max(limit, 1)


def _halves(chunks: list[Rows]) -> tuple[list[Rows], list[Rows]]:
    """The rows of `chunks`, in order, in two parts of about half each."""
    if len(chunks) > 1:
        middle = len(chunks) // 2
        return chunks[:middle], chunks[middle:]
    rows = chunks[0]
    half = len(rows) // 2
    return [rows.slice(0, half)], [rows.slice(half, len(rows) - half)]


@dataclass
class _Pending:
    """Rows waiting for their append to one partition."""

    chunks: list[Rows]
    bytes: int = 0
    rows: int = 0


@dataclass
class _InFlight:
    future: concurrent.futures.Future[AppendResult]
    chunks: list[Rows]
    rows: int
    sequence: int


class _Appender:
    """Rows grouped per topic partition, encoded column by column (`encode.encode_rows`) and
    appended in order in one transaction of the transactional id `txn_id` (started at the
    first append). A row goes to its `partition`, else where its key hashes, else (keyless)
    to the partition keyless rows fill now: they stick to one partition until its append is
    full, then move to the next (Kafka's sticky partitioner), starting at `first_partition`.
    The same rows in the same order go to the same partitions every time."""

    def __init__(
        self, options: Options, client: Client, txn_id: str, expiry_ms: int,
        first_partition: int = 0,
    ) -> None:  # fmt: skip
        self.options = options
        self.client = client
        self.txn_id = txn_id
        self.expiry_ms = expiry_ms
        self.producer: int | None = None
        self.pending: dict[tuple[str, int], _Pending] = {}
        self.pending_bytes = 0
        self.in_flight: dict[tuple[str, int], _InFlight] = {}
        self.sequence: dict[tuple[str, int], int] = {}
        self.partitions: dict[str, int] = {}
        self.limits: dict[str, int] = {}
        self.sticky: dict[str, int] = {}
        self.first_partition = first_partition
        self.written = 0
        self.duplicates = 0

    def add_batch(self, batch: pa.RecordBatch) -> None:
        value = _column(batch, "value")
        if value is None:
            raise OptionError("the laminar sink needs a value column")
        key = _column(batch, "key")
        headers = _column(batch, "headers")
        if headers is not None and not pa.types.is_list(headers.type):
            raise OptionError(
                f"column headers must be array<struct<key, value>>, not {headers.type}"
            )
        rows = Rows(
            binary(value, "value"),
            None if key is None or pa.types.is_null(key.type) else binary(key, "key"),
            None if headers is None or headers.null_count == len(headers) else headers,
        )
        partition = _column(batch, "partition")
        fixed = self.options.topics[0] if self.options.topics else None
        topic = _column(batch, "topic")
        if fixed is not None or topic is None:
            if fixed is None:
                raise OptionError("no topic: set the topic option or a topic column")
            self._add_to_topic(fixed, rows, partition)
            return
        topic = topic.cast(pa.string())
        if topic.null_count:
            raise OptionError("no topic: set the topic option or a topic column (it has nulls)")
        for name in pc.unique(topic).to_pylist():
            chosen = np.flatnonzero(np.asarray(pc.equal(topic, name)))
            part = None if partition is None else partition.take(pa.array(chosen))
            self._add_to_topic(name, rows if len(chosen) == len(rows) else rows.take(chosen), part)

    def _add_to_topic(self, topic: str, rows: Rows, partition: pa.Array | None) -> None:
        count = self._partition_count(topic)
        places = np.full(len(rows), -1, dtype=np.int64)  # -1: not placed yet
        if partition is not None:
            if not pa.types.is_integer(partition.type):
                raise OptionError(f"column partition must be an integer, not {partition.type}")
            given = np.asarray(partition.is_valid())
            numbers = np.asarray(partition.cast(pa.int64()).fill_null(0), dtype=np.int64)
            wrong = numbers[given & ((numbers >= count) | (numbers < 0))]
            if len(wrong):
                raise OptionError(
                    f"row partition {int(wrong[0])} is not a partition of {topic!r} "
                    f"(0..{count - 1})"
                )
            places[given] = numbers[given]
        if rows.keys is not None:
            keyed = np.flatnonzero((places < 0) & np.asarray(rows.keys.is_valid()))
            if len(keyed):
                keys = rows.keys.take(pa.array(keyed)).to_pylist()
                places[keyed] = [key_hash(k) % count for k in keys]
        placed = np.flatnonzero(places >= 0)
        if len(placed):
            order = placed[np.argsort(places[placed], kind="stable")]
            bounds = np.flatnonzero(np.diff(places[order])) + 1
            for run in np.split(order, bounds):
                whole = len(run) == len(rows)
                self._add(topic, int(places[run[0]]), rows if whole else rows.take(run))
        keyless = np.flatnonzero(places < 0)
        if len(keyless):
            self._stick(topic, rows if len(keyless) == len(rows) else rows.take(keyless))

    def _stick(self, topic: str, rows: Rows) -> None:
        """Keyless rows without a partition: fill the current partition's append, then the
        next partition's."""
        count = self._partition_count(topic)
        sizes = np.cumsum(row_sizes(rows))
        at = 0
        while at < len(rows):
            partition = self.sticky.setdefault(topic, self.first_partition % count)
            pending = self.pending.get((topic, partition))
            room = self._limit(topic) - (pending.bytes if pending is not None else 0)
            used = sizes[at - 1] if at else 0
            fits = int(np.searchsorted(sizes, used + room, side="right")) - at
            take = max(fits, 1 if pending is None or not pending.rows else 0)
            if take:
                self._add(topic, partition, rows.slice(at, take))
                at += take
            else:
                self._flush((topic, partition))

    def _partition_count(self, topic: str) -> int:
        if topic not in self.partitions:
            description = self.client.describe_topic(topic)
            self.partitions[topic] = description.partitions
            self.limits[topic] = _batch_limit(description.config)
        return self.partitions[topic]

    def _limit(self, topic: str) -> int:
        self._partition_count(topic)
        return self.limits[topic]

    def _add(self, topic: str, partition: int, rows: Rows) -> None:
        key = (topic, partition)
        pending = self.pending.setdefault(key, _Pending([]))
        size = int(row_sizes(rows).sum())
        pending.chunks.append(rows)
        pending.bytes += size
        pending.rows += len(rows)
        self.pending_bytes += size
        if pending.bytes >= self._limit(topic):
            self._flush(key)
        while self.pending_bytes > MAX_PENDING_BYTES:
            self._flush(max(self.pending, key=lambda k: self.pending[k].bytes))

    def _flush(self, key: tuple[str, int]) -> None:
        """Append what waits for `key`'s partition (cut to its limit), in flight; keyless
        rows move on to the next partition."""
        pending = self.pending.pop(key, None)
        topic, partition = key
        if self.sticky.get(topic) == partition:
            self.sticky[topic] = (partition + 1) % self._partition_count(topic)
        if pending is None or not pending.rows:
            return
        self.pending_bytes -= pending.bytes
        if self.producer is None:  # fences, and aborts, an earlier attempt's transaction
            info = self.client.init_transactions(
                self.txn_id,
                timeout_ms=self.options.transaction_timeout_ms,
                expiry_ms=self.expiry_ms,
            )
            self.producer = info.producer_id
        if key not in self.sequence:
            self.client.add_transaction_partitions(self.txn_id, self.producer, [key])
            self.sequence[key] = 0
        self._wait(key)  # one append per partition at a time: sequences in order
        while len(self.in_flight) >= MAX_APPENDS_IN_FLIGHT:
            self._wait(next(iter(self.in_flight)))
        self._send(key, pending.chunks, pending.rows)

    def _send(self, key: tuple[str, int], chunks: list[Rows], rows: int) -> None:
        assert self.producer is not None
        sequence = self.sequence[key]
        batch = encode_rows(
            chunks, producer_id=self.producer, producer_seq=sequence, transactional=True
        )
        future = self.client.submit(self.client.async_client.append(key[0], key[1], batch))
        self.in_flight[key] = _InFlight(future, chunks, rows, sequence)
        self.sequence[key] = sequence + rows

    def _wait(self, key: tuple[str, int]) -> None:
        """Wait for `key`'s append in flight; one the broker refuses as too large is sent
        again in halves (nothing of it was written)."""
        flight = self.in_flight.pop(key, None)
        if flight is None:
            return
        try:
            result = flight.future.result()
        except PayloadTooLarge:
            if flight.rows < 2:
                raise
            self.limits[key[0]] = max(self._limit(key[0]) // 2, 1)
            self.sequence[key] = flight.sequence
            for half in _halves(flight.chunks):
                self._send(key, half, sum(len(chunk) for chunk in half))
                self._wait(key)
            return
        if result.duplicate:  # (an append the client sent again)
            self.duplicates += flight.rows
        else:
            self.written += flight.rows

    def finish(self) -> Written:
        for key in list(self.pending):
            self._flush(key)
        for key in list(self.in_flight):
            self._wait(key)
        txn = None if self.producer is None else (self.txn_id, self.producer)
        return Written(self.written, self.duplicates, txn)

    def abandon(self) -> None:
        """The task failed: stop waiting for appends in flight (the transaction is aborted by
        the driver, a retry's init, or its timeout)."""
        for flight in self.in_flight.values():
            flight.future.cancel()
        self.in_flight.clear()


def _write(
    options: Options, batches: Iterator[Any], txn_id: str, *, tag: str | None, expiry_ms: int,
    first_partition: int = 0,
) -> Written:  # fmt: skip
    with Client(list(options.brokers), token=options.token, ca_file=options.ca_file) as client:
        if tag is not None and _committed_as(client, txn_id, tag):
            return Written(0, sum(_rows(batch).num_rows for batch in batches))
        appender = _Appender(options, client, txn_id, expiry_ms, first_partition)
        try:
            for batch in batches:
                appender.add_batch(_rows(batch))
            return appender.finish()
        except BaseException:
            appender.abandon()
            raise


def _committed_as(client: Client, txn_id: str, tag: str) -> bool:
    """Did `txn_id`'s last transaction commit with `tag` (this batch, run before)?"""
    try:
        described = client.describe_transaction(txn_id)
    except NotFound:
        return False
    return described.last_committed is True and described.last_tag == tag


def _task_txn_id(*parts: object) -> str:
    """A transactional id for a task: `spark-` and the parts, in the ids' alphabet."""
    txn_id = "-".join(["spark", *map(str, parts)])
    return re.sub(r"[^A-Za-z0-9._:-]", "_", txn_id)[:200]


def _end(options: Options, messages: list[WriterCommitMessage | None], *, commit: bool,
         tag: str | None) -> None:  # fmt: skip
    """End every task's transaction with one request: all commit, or none."""
    txns = [m.txn for m in messages if isinstance(m, Written) and m.txn is not None]
    if not txns:
        return
    if len(txns) > MAX_TASKS:
        raise OptionError(f"the laminar sink commits {MAX_TASKS} tasks' writes at most")
    (first, producer), *rest = txns
    with Client(list(options.brokers), token=options.token, ca_file=options.ca_file) as client:
        client.end_transaction(first, producer, commit=commit, also=rest, tag=tag)


def _abort(options: Options, messages: list[WriterCommitMessage | None]) -> None:
    """Best effort: what is not aborted here, a retry's init or the timeout aborts."""
    with contextlib.suppress(LaminarError, OSError):
        _end(options, messages, commit=False, tag=None)


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.write_id = uuid.uuid4().hex  # made on the driver: the same in every task attempt

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        txn_id = _task_txn_id("w", self.write_id, task)
        return _write(
            self.options, iterator, txn_id, tag=None, expiry_ms=BATCH_WRITE_EXPIRY_MS,
            first_partition=task,
        )  # fmt: skip

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _end(self.options, messages, commit=True, tag=None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self.options, messages)


class StreamWriter(_StreamWriterBase):  # type: ignore[misc]
    def __init__(self, options: Options) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> Written:
        context = TaskContext.get()
        if context is None:
            raise RuntimeError("the laminar stream sink runs inside Spark tasks")
        query = context.getLocalProperty("sql.streaming.queryId")
        batch = context.getLocalProperty("streaming.sql.batchId")
        txn_id = _task_txn_id(query, context.partitionId())
        return _write(
            self.options, iterator, txn_id, tag=_batch_tag(batch), expiry_ms=DEFAULT_EXPIRY_MS,
            first_partition=context.partitionId(),
        )  # fmt: skip

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _end(self.options, messages, commit=True, tag=_batch_tag(batchId))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort(self.options, messages)


def _batch_tag(batch_id: object) -> str:
    return f"batch {batch_id}"
