"""The `laminar` sink: `df.write` and `df.writeStream` into topics.

Columns: `value` (required, binary or string), `key`, `headers` (array of struct<key, value>),
`topic` and `partition` (optional; the `topic` option wins over the column). A row without a
partition goes where its key hashes (`laminar.client.partitioner`), or, without a key, by its
position in the task: both the same when a task runs again.

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

import contextlib
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyspark.sql.datasource as datasource
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from ..client import Client, LaminarError, NotFound
from ..client.partitioner import partition_for
from ..log.batch import Record, encode_batch
from ..txn.coordinator import DEFAULT_EXPIRY_MS
from .options import OptionError, Options

#: Spark >= 4.1 hands stream writers Arrow batches; 4.0 hands them rows
_StreamWriterBase: type = getattr(
    datasource, "DataSourceStreamArrowWriter", datasource.DataSourceStreamWriter
)

RECORDS_PER_APPEND = 1000
BYTES_PER_APPEND = 1024 * 1024
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


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    index = batch.schema.get_field_index(name)
    return batch.column(index).to_pylist() if index >= 0 else None


def _bytes(value: Any, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise OptionError(f"column {what} must be binary or string, not {type(value).__name__}")


def _rows(batch: Any) -> pa.RecordBatch:
    if not isinstance(batch, pa.RecordBatch):  # Spark 4.0 streaming: a Row
        batch = pa.RecordBatch.from_pylist([batch.asDict()])
    return batch


class _Appender:
    """Records grouped per topic partition, appended in order in one transaction of the
    transactional id `txn_id` (started at the first append)."""

    def __init__(self, options: Options, client: Client, txn_id: str, expiry_ms: int) -> None:
        self.options = options
        self.client = client
        self.txn_id = txn_id
        self.expiry_ms = expiry_ms
        self.producer: int | None = None
        self.pending: dict[tuple[str, int], list[Record]] = {}
        self.pending_bytes: dict[tuple[str, int], int] = {}
        self.sequence: dict[tuple[str, int], int] = {}
        self.partitions: dict[str, int] = {}
        self.rows = 0
        self.written = 0
        self.duplicates = 0

    def add_batch(self, batch: pa.RecordBatch) -> None:
        values = _column(batch, "value")
        if values is None:
            raise OptionError("the laminar sink needs a value column")
        keys = _column(batch, "key") or [None] * len(values)
        headers = _column(batch, "headers") or [None] * len(values)
        topics = _column(batch, "topic")
        partitions = _column(batch, "partition")
        fixed = self.options.topics[0] if self.options.topics else None
        for i, value in enumerate(values):
            topic = fixed or (topics[i] if topics is not None else None)
            if not topic:
                raise OptionError("no topic: set the topic option or a topic column")
            key = _bytes(keys[i], "key")
            partition = partitions[i] if partitions is not None else None
            if partition is None:
                count = self._partition_count(topic)
                partition = partition_for(key, count) if key is not None else self.rows % count
            record = Record(
                value=_bytes(value, "value"),
                key=key,
                headers=tuple(
                    (h["key"], _bytes(h["value"], "headers") or b"") for h in headers[i] or ()
                ),
            )
            self._add(topic, int(partition), record)
            self.rows += 1

    def _partition_count(self, topic: str) -> int:
        if topic not in self.partitions:
            self.partitions[topic] = self.client.partition_count(topic)
        return self.partitions[topic]

    def _add(self, topic: str, partition: int, record: Record) -> None:
        key = (topic, partition)
        self.pending.setdefault(key, []).append(record)
        size = self.pending_bytes.get(key, 0) + len(record.value or b"") + len(record.key or b"")
        size += sum(len(name) + len(value) for name, value in record.headers)
        self.pending_bytes[key] = size
        if len(self.pending[key]) >= RECORDS_PER_APPEND or size >= BYTES_PER_APPEND:
            self._flush(key)

    def _flush(self, key: tuple[str, int]) -> None:
        records = self.pending.pop(key, [])
        self.pending_bytes.pop(key, None)
        if not records:
            return
        if self.producer is None:  # fences, and aborts, an earlier attempt's transaction
            info = self.client.init_transactions(
                self.txn_id,
                timeout_ms=self.options.transaction_timeout_ms,
                expiry_ms=self.expiry_ms,
            )
            self.producer = info.producer_id
        if key not in self.sequence:
            self.client.add_transaction_partitions(self.txn_id, self.producer, [key])
        sequence = self.sequence.get(key, 0)
        batch = encode_batch(
            records, producer_id=self.producer, producer_seq=sequence, transactional=True
        )
        result = self.client.append(key[0], key[1], batch)
        self.sequence[key] = sequence + len(records)
        if result.duplicate:  # (an append the client sent again)
            self.duplicates += len(records)
        else:
            self.written += len(records)

    def finish(self) -> Written:
        for key in list(self.pending):
            self._flush(key)
        txn = None if self.producer is None else (self.txn_id, self.producer)
        return Written(self.written, self.duplicates, txn)


def _write(
    options: Options, batches: Iterator[Any], txn_id: str, *, tag: str | None, expiry_ms: int
) -> Written:
    with Client(list(options.brokers), token=options.token, ca_file=options.ca_file) as client:
        if tag is not None and _committed_as(client, txn_id, tag):
            return Written(0, sum(_rows(batch).num_rows for batch in batches))
        appender = _Appender(options, client, txn_id, expiry_ms)
        for batch in batches:
            appender.add_batch(_rows(batch))
        return appender.finish()


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
        return _write(self.options, iterator, txn_id, tag=None, expiry_ms=BATCH_WRITE_EXPIRY_MS)

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
            self.options, iterator, txn_id, tag=_batch_tag(batch), expiry_ms=DEFAULT_EXPIRY_MS
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _end(self.options, messages, commit=True, tag=_batch_tag(batchId))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort(self.options, messages)


def _batch_tag(batch_id: object) -> str:
    return f"batch {batch_id}"
