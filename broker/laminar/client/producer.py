"""`Producer`: batching, partitioning, idempotent and ordered appends to one topic.

* **Batching.** Records are collected per partition into one batch until it holds
  `max_batch_bytes` (encoded size, header included) or its first record has waited
  `linger_ms`; while a batch of the partition is in flight the next one keeps filling up to the
  size limit, so a busy partition sends big batches whatever `linger_ms` is.
* **Partitioning.** `partition=` wins; else a keyed record goes to `partition_for(key, n)` (the
  same key always to the same partition); keyless records stick to one partition until its
  batch closes, then move round-robin to the next (`StickyPartitioner`). The partition count is
  read once, at the first `send` (or given as `partitions=`): after the topic grows, a new
  Producer is needed to use the new partitions.
* **Idempotence.** Each Producer draws a random producer id in 1..2^63-1. Every batch of a
  partition carries the partition's next sequence number (the first batch 0, then + the record
  count of each batch), assigned when the batch is handed to the sender. A failed append is
  retried with the very same bytes, so the same (producer id, sequence): if the first attempt
  was in fact written (a timeout, a leader change after the commit), the broker answers
  `duplicate: true` with the original index and writes nothing again.
* **Ordering.** At most one batch per partition is in flight. The broker accepts any sequence
  at or above the next expected one, so a later batch overtaking an earlier one (two requests
  in flight, or the earlier one retried after a leader change) would be written first and make
  the earlier one a 409 `conflict`: records of a partition would be lost or reordered. With one
  in flight, retries cannot reorder anything. `max_in_flight` bounds the appends in flight
  across all partitions of this producer.
* **Retries.** Retryable failures (`Unavailable`: 503, nothing written; `Overloaded`: 429;
  `Timeout`: 504, maybe written, so the retry is answered as a duplicate if it was; the
  client already retried them within its own `timeout_s`) are retried until
  `delivery_timeout_s` after the batch was first sent; then, and on any other error, the
  futures of the batch's records fail with the error, `ambiguous` when any attempt may have
  been written. Sequence numbers of failed batches are not reused (gaps are allowed).
* **Backpressure.** `send` waits while the records not yet acknowledged hold more than
  `buffer_bytes` (one record alone is always admitted).
* **Compression.** `compression="zstd"` or `"lz4"` compresses each batch's records as a whole
  when the batch is sent (Kafka's `compression.type`); the broker stores and serves the
  compressed bytes and consumers decompress. `max_batch_bytes` and `buffer_bytes` count records
  uncompressed: the broker refuses a batch whose records decompress to more than the topic's
  `max_batch_bytes`, so a batch this producer builds within that limit is never refused for it.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol

from laminar.log.batch import (
    BATCH_HEADER_BYTES,
    HEADER_FIELD,
    MAX_HEADERS_PER_RECORD,
    MAX_TIMESTAMP_DELTA_MS,
    RECORD_HEADER_BYTES,
    Record,
    encode_batch,
)
from laminar.log.compression import codec_named
from laminar.log.records import MAX_TIMESTAMP_MS, MIN_TIMESTAMP_MS

from .errors import LaminarError
from .models import AppendResult, RecordMetadata
from .partitioner import StickyPartitioner, partition_for

MAX_PRODUCER_ID = 2**63 - 1
RETRY_BACKOFF_S = 0.1
MAX_RETRY_BACKOFF_S = 2.0

Bytes = bytes | bytearray | memoryview | str
Headers = Mapping[str, Bytes] | Iterable[tuple[str, Bytes]]


class ProducerTransport(Protocol):
    """What a Producer needs from its client (`AsyncClient` is one)."""

    async def append(self, topic: str, partition: int, records: bytes, /) -> AppendResult: ...

    async def partition_count(self, topic: str, /) -> int: ...


def _to_bytes(value: Bytes | None) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def _to_headers(headers: Headers) -> tuple[tuple[str, bytes], ...]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    result = tuple((str(name), _to_bytes(value) or b"") for name, value in items)
    if len(result) > MAX_HEADERS_PER_RECORD:
        raise ValueError(f"a record may carry at most {MAX_HEADERS_PER_RECORD} headers")
    return result


def record_bytes(record: Record) -> int:
    """The record's exact encoded size inside a batch (the batch adds its 72-byte header)."""
    size = RECORD_HEADER_BYTES + len(record.key or b"") + len(record.value or b"")
    for name, value in record.headers:
        size += HEADER_FIELD.size + len(name.encode()) + len(value)
    return size


@dataclass(eq=False, slots=True)
class _Batch:
    created: float
    first_timestamp_ms: int
    records: list[Record] = field(default_factory=list)
    futures: list[asyncio.Future[RecordMetadata]] = field(default_factory=list)
    size: int = BATCH_HEADER_BYTES
    closed: bool = False  # takes no more records


@dataclass(eq=False, slots=True)
class _Partition:
    wake: asyncio.Event
    batches: deque[_Batch] = field(default_factory=deque)
    sending: _Batch | None = None
    next_sequence: int = 0
    task: asyncio.Task[None] | None = None


class Producer:
    """Batches records to `topic` and appends them through `client` (see the module doc).

    `send` returns a future that resolves to the record's `RecordMetadata` once its batch is
    committed, or fails with the `LaminarError` that stopped it. Use `async with Producer(...)`
    or call `close()`, which sends everything buffered first.
    """

    def __init__(
        self,
        client: ProducerTransport,
        topic: str,
        *,
        linger_ms: float = 5,
        max_batch_bytes: int = 1 << 20,
        max_in_flight: int = 64,
        buffer_bytes: int = 32 << 20,
        delivery_timeout_s: float = 120.0,
        partitions: int | None = None,
        producer_id: int | None = None,
        compression: str | None = None,
    ) -> None:
        codec_named(compression)  # (ValueError now for an unknown codec, not at the first send)
        if linger_ms < 0:
            raise ValueError(f"linger_ms={linger_ms} must not be negative")
        if max_batch_bytes <= BATCH_HEADER_BYTES + RECORD_HEADER_BYTES:
            raise ValueError(f"max_batch_bytes={max_batch_bytes} cannot hold a record")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight={max_in_flight} must be at least 1")
        if buffer_bytes < 1:
            raise ValueError(f"buffer_bytes={buffer_bytes} must be positive")
        if partitions is not None and partitions < 1:
            raise ValueError(f"partitions={partitions} must be at least 1")
        if producer_id is not None and not 1 <= producer_id <= MAX_PRODUCER_ID:
            raise ValueError(f"producer_id {producer_id} is not in 1..2^63-1")
        self._client = client
        self._topic = topic
        self._linger_s = linger_ms / 1000
        self._max_batch_bytes = max_batch_bytes
        self._max_in_flight = max_in_flight
        self._buffer_bytes = buffer_bytes
        self._delivery_timeout_s = delivery_timeout_s
        self._partitions = partitions
        self._producer_id = producer_id or secrets.randbelow(MAX_PRODUCER_ID) + 1
        self._compression = compression
        self._sticky = StickyPartitioner()
        self._queues: dict[int, _Partition] = {}
        self._buffered = 0
        self._flushing = 0
        self._closed = False
        self._space: asyncio.Event | None = None  # set whenever buffered bytes are released
        self._in_flight: asyncio.Semaphore | None = None
        self._count_lock: asyncio.Lock | None = None

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def producer_id(self) -> int:
        return self._producer_id

    @property
    def compression(self) -> str | None:
        """The codec of its batches ("zstd", "lz4"; None or "none": not compressed)."""
        return self._compression

    @property
    def buffered_bytes(self) -> int:
        """Encoded bytes of the records sent but not yet acknowledged (or failed)."""
        return self._buffered

    def next_sequence(self, partition: int) -> int:
        """The sequence number the partition's next batch will carry."""
        queue = self._queues.get(partition)
        return queue.next_sequence if queue else 0

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def send(
        self,
        value: Bytes | None,
        key: Bytes | None = None,
        headers: Headers = (),
        partition: int | None = None,
        *,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Buffer one record; the returned future resolves once it is committed.

        Waits while the producer buffers more than `buffer_bytes` (backpressure). `value` and
        `key` may be bytes or str (UTF-8); `timestamp_ms` defaults to now.
        """
        if self._closed:
            raise RuntimeError("the producer is closed")
        key_bytes = _to_bytes(key)
        stamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        if not MIN_TIMESTAMP_MS <= stamp <= MAX_TIMESTAMP_MS:
            # here, not when its batch is encoded: that would fail the records batched with it
            raise ValueError(f"timestamp_ms {stamp} is outside [0, {MAX_TIMESTAMP_MS}]")
        record = Record(_to_bytes(value), key_bytes, _to_headers(headers), stamp)
        size = record_bytes(record)
        count = await self._partition_count()
        if partition is not None and not 0 <= partition < count:
            raise ValueError(f"partition {partition} is not in 0..{count - 1} of {self._topic}")
        while self._buffered and self._buffered + size > self._buffer_bytes:
            space = self._space_event()
            space.clear()
            await space.wait()
            if self._closed:
                raise RuntimeError("the producer is closed")
        if partition is None:
            if key_bytes is None:
                partition = self._sticky.current(count)
            else:
                partition = partition_for(key_bytes, count)
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        self._buffered += size
        self._add(partition, record, size, future)
        return future

    async def flush(self) -> None:
        """Send every buffered record now and wait until each is committed or has failed."""
        waiting: list[asyncio.Future[RecordMetadata]] = []
        for queue in self._queues.values():
            if queue.sending is not None:
                waiting.extend(queue.sending.futures)
            for batch in queue.batches:
                waiting.extend(batch.futures)
            queue.wake.set()
        if not waiting:
            return
        self._flushing += 1
        try:
            await asyncio.wait(waiting)
        finally:
            self._flushing -= 1

    async def close(self) -> None:
        """Refuse new records, send the buffered ones and wait for them."""
        self._closed = True
        await self.flush()
        tasks = [q.task for q in self._queues.values() if q.task is not None]
        if tasks:
            await asyncio.wait(tasks)

    # ------------------------------------------------------------------ internals

    async def _partition_count(self) -> int:
        if self._partitions is None:
            if self._count_lock is None:
                self._count_lock = asyncio.Lock()
            async with self._count_lock:
                if self._partitions is None:
                    self._partitions = await self._client.partition_count(self._topic)
        return self._partitions

    def _space_event(self) -> asyncio.Event:
        if self._space is None:
            self._space = asyncio.Event()
        return self._space

    def _add(
        self, partition: int, record: Record, size: int, future: asyncio.Future[RecordMetadata]
    ) -> None:
        queue = self._queues.get(partition)
        if queue is None:
            queue = self._queues[partition] = _Partition(asyncio.Event())
        loop = asyncio.get_running_loop()
        assert record.timestamp_ms is not None
        tail = queue.batches[-1] if queue.batches else None
        if tail is not None and not tail.closed:
            too_big = tail.size + size > self._max_batch_bytes
            too_far = abs(record.timestamp_ms - tail.first_timestamp_ms) > MAX_TIMESTAMP_DELTA_MS
            if too_big or too_far:
                self._close_batch(partition, queue, tail)
        if tail is None or tail.closed:
            tail = _Batch(loop.time(), record.timestamp_ms)
            queue.batches.append(tail)
        tail.records.append(record)
        tail.futures.append(future)
        tail.size += size
        if self._max_batch_bytes - tail.size < RECORD_HEADER_BYTES:  # no record fits anymore
            self._close_batch(partition, queue, tail)
        elif self._linger_s == 0 or self._flushing or self._closed:
            queue.wake.set()
        if queue.task is None:
            queue.task = loop.create_task(self._run(partition, queue))

    def _close_batch(self, partition: int, queue: _Partition, batch: _Batch) -> None:
        if not batch.closed:
            batch.closed = True
            self._sticky.batch_closed(partition)
            queue.wake.set()

    async def _run(self, partition: int, queue: _Partition) -> None:
        """The partition's sender: its batches one at a time, in order."""
        loop = asyncio.get_running_loop()
        if self._in_flight is None:
            self._in_flight = asyncio.Semaphore(self._max_in_flight)
        try:
            while queue.batches:
                head = queue.batches[0]
                if not (head.closed or self._flushing or self._closed):
                    wait_s = head.created + self._linger_s - loop.time()
                    if wait_s > 0:
                        queue.wake.clear()
                        try:
                            async with asyncio.timeout(wait_s):
                                await queue.wake.wait()
                        except TimeoutError:
                            pass
                        continue
                async with self._in_flight:
                    queue.batches.popleft()
                    self._close_batch(partition, queue, head)
                    queue.sending = head
                    sequence = queue.next_sequence
                    queue.next_sequence += len(head.records)
                    try:
                        await self._deliver(partition, head, sequence)
                    finally:
                        queue.sending = None
                        self._release(head.size - BATCH_HEADER_BYTES)
        finally:
            queue.task = None
            while queue.batches:  # cancelled: nobody will send these
                batch = queue.batches.popleft()
                self._fail(batch, RuntimeError("the producer's sender was cancelled"))
                self._release(batch.size - BATCH_HEADER_BYTES)

    async def _deliver(self, partition: int, batch: _Batch, sequence: int) -> None:
        try:
            data = encode_batch(
                batch.records,
                producer_id=self._producer_id,
                producer_seq=sequence,
                compression=self._compression,
            )
        except ValueError as e:
            self._fail(batch, e)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._delivery_timeout_s
        attempt = 0
        maybe_written = False
        while True:
            try:
                result = await self._client.append(self._topic, partition, data)
            except LaminarError as e:
                maybe_written = maybe_written or e.ambiguous
                delay = min(MAX_RETRY_BACKOFF_S, RETRY_BACKOFF_S * 2**attempt)
                delay *= random.uniform(0.5, 1)
                if e.retryable and loop.time() + delay < deadline:
                    await asyncio.sleep(delay)
                    attempt += 1
                    continue
                e.ambiguous = maybe_written  # an earlier attempt may have been written
                self._fail(batch, e)
                return
            except asyncio.CancelledError:
                self._fail(batch, RuntimeError("the producer's sender was cancelled"))
                raise
            except Exception as e:
                self._fail(batch, e)
                return
            for i, future in enumerate(batch.futures):
                if not future.done():
                    future.set_result(RecordMetadata(partition, result.base_index + i))
            return

    @staticmethod
    def _fail(batch: _Batch, error: BaseException) -> None:
        for future in batch.futures:
            if not future.done():
                future.set_exception(error)

    def _release(self, size: int) -> None:
        self._buffered -= size
        self._space_event().set()
