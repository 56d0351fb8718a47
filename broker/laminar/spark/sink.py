"""The `laminar` sink: `df.write` and `df.writeStream` into topics.

Columns: `value` (required, binary or string), `key`, `headers` (array of struct<key, value>),
`topic` and `partition` (optional; the `topic` option wins over the column). A row without a
partition goes where its key hashes (`laminar.client.partitioner`), or, without a key, by its
position in the task: both the same when a task runs again.

Every task writes as an idempotent producer whose id is derived from (query id, batch id,
task partition), or for a batch write from (the write's id, task partition), with sequences
counted per topic partition from 0. A retried task or micro-batch sends the same batches with
the same ids and sequences; the brokers answer those they already have as duplicates (or, for
one older than the last five, 409), and the sink skips them: no record is written twice, as
long as the retried input is the same rows in the same order (deterministic upstream).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyspark.sql.datasource as datasource
import xxhash
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from ..client import Client
from ..client.errors import Conflict
from ..client.partitioner import partition_for
from ..log.batch import Record, encode_batch
from .options import OptionError, Options

#: Spark >= 4.1 hands stream writers Arrow batches; 4.0 hands them rows
_StreamWriterBase: type = getattr(
    datasource, "DataSourceStreamArrowWriter", datasource.DataSourceStreamWriter
)

RECORDS_PER_APPEND = 1000
BYTES_PER_APPEND = 1024 * 1024
MAX_PRODUCER_ID = 2**63 - 1


def producer_id(*parts: object) -> int:
    """A producer id (1..2^63-1) that is the same whenever `parts` are."""
    return xxhash.xxh64_intdigest("/".join(map(str, parts)).encode()) % MAX_PRODUCER_ID + 1


@dataclass
class Written(WriterCommitMessage):
    records: int
    duplicates: int


def _column(batch: pa.RecordBatch, name: str) -> list[Any] | None:
    index = batch.schema.get_field_index(name)
    return batch.column(index).to_pylist() if index >= 0 else None


def _bytes(value: Any, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise OptionError(f"column {what} must be binary or string, not {type(value).__name__}")


class _Appender:
    """Records grouped per topic partition, appended in order as one idempotent producer."""

    def __init__(self, options: Options, producer: int) -> None:
        self.options = options
        self.producer = producer
        self.client = Client(list(options.brokers), token=options.token, ca_file=options.ca_file)
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
        sequence = self.sequence.get(key, 0)
        batch = encode_batch(records, producer_id=self.producer, producer_seq=sequence)
        try:
            result = self.client.append(key[0], key[1], batch)
            duplicate = result.duplicate
        except Conflict:
            duplicate = True  # older than the broker's last five: written by an earlier attempt
        self.sequence[key] = sequence + len(records)
        if duplicate:
            self.duplicates += len(records)
        else:
            self.written += len(records)

    def finish(self) -> Written:
        try:
            for key in list(self.pending):
                self._flush(key)
            return Written(self.written, self.duplicates)
        finally:
            self.client.close()


def _write(options: Options, batches: Iterator[Any], producer: int) -> Written:
    appender = _Appender(options, producer)
    try:
        for batch in batches:
            if not isinstance(batch, pa.RecordBatch):  # Spark 4.0 streaming: a Row
                batch = pa.RecordBatch.from_pylist([batch.asDict()])
            appender.add_batch(batch)
    except BaseException:
        appender.client.close()
        raise
    return appender.finish()


class BatchWriter(DataSourceArrowWriter):
    def __init__(self, options: Options) -> None:
        self.options = options
        self.write_id = uuid.uuid4().hex  # made on the driver: the same in every task attempt

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        context = TaskContext.get()
        task = context.partitionId() if context is not None else 0
        return _write(self.options, iterator, producer_id(self.write_id, task))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # every append is durable once acknowledged; there is nothing to publish

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # what a failed job appended stays (no transactions); a retry does not repeat it


class StreamWriter(_StreamWriterBase):  # type: ignore[misc]
    def __init__(self, options: Options) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> Written:
        context = TaskContext.get()
        if context is None:
            raise RuntimeError("the laminar stream sink runs inside Spark tasks")
        query = context.getLocalProperty("sql.streaming.queryId")
        batch = context.getLocalProperty("streaming.sql.batchId")
        producer = producer_id(query, batch, context.partitionId())
        return _write(self.options, iterator, producer)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
