"""`Client`: a thin synchronous wrapper of `AsyncClient` for scripts, notebooks and threads.

It owns an event loop running in a daemon thread and submits each call to it
(`asyncio.run_coroutine_threadsafe`). That is more robust than `asyncio.run` per call: the
connection pool and the routing cache live as long as the client, and it works where an event
loop is already running in the calling thread (Jupyter) because the calls never touch that loop.
Any number of threads may share one `Client`. Do not call it from its own loop's thread (the
callbacks of a future it returned): that would deadlock, so it raises RuntimeError.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from laminar.log.batch import Record

from .client import (
    DEFAULT_ACQUIRE_MAX,
    DEFAULT_LEASE_MS,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_RECORDS,
    DEFAULT_TIMEOUT_S,
    AsyncClient,
)
from .models import (
    Acquired,
    AppendResult,
    ClusterInfo,
    GroupDescription,
    NodeAdminState,
    NodePartitions,
    NodeTls,
    ReadResult,
    RecordMetadata,
    Settled,
    TopicDescription,
    TopicInfo,
)
from .producer import Bytes, Headers, Producer

T = TypeVar("T")
Produceable = Record | bytes | bytearray | memoryview | str | None


class Client:
    """Blocking twin of `AsyncClient`: the same methods, returning results instead of
    coroutines. Use `with Client([...]) as client:` or call `close()`."""

    def __init__(
        self,
        brokers: Sequence[str],
        *,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        ca_file: str | os.PathLike[str] | None = None,
        token_file: str | os.PathLike[str] | None = None,
        context: str | None = None,
    ) -> None:
        self._async = AsyncClient(
            brokers,
            token=token,
            timeout_s=timeout_s,
            ca_file=ca_file,
            token_file=token_file,
            context=context,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="laminar-client", daemon=True
        )
        self._thread.start()
        self._closed = False
        self._lock = threading.Lock()

    @property
    def async_client(self) -> AsyncClient:
        """The wrapped client (use it only from coroutines run by `run`)."""
        return self._async

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the client's loop and wait for its result."""
        future = self.submit(coroutine)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start a coroutine on the client's loop; its result comes in the returned future."""
        if self._closed:
            coroutine.close()
            raise RuntimeError("the client is closed")
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a blocking Client call from its own event loop would deadlock")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def close(self) -> None:
        """Cancel the calls still in flight (`submit`), close the connections and stop the
        loop thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            try:
                self.run(self._shut())
            finally:
                self._closed = True
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(timeout=10)
                if not self._thread.is_alive():
                    self._loop.close()

    async def _shut(self) -> None:
        """On the loop: cancel every other task and wait for them, then close the client (a
        task left pending would be destroyed with the loop)."""
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        await self._async.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ the AsyncClient's calls

    def cluster(self) -> ClusterInfo:
        return self.run(self._async.cluster())

    def topics(self) -> list[TopicInfo]:
        return self.run(self._async.topics())

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> TopicDescription:
        return self.run(self._async.create_topic(name, partitions, replication_factor, config))

    def describe_topic(self, name: str) -> TopicDescription:
        return self.run(self._async.describe_topic(name))

    def alter_topic(
        self,
        name: str,
        partitions: int | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> TopicDescription:
        return self.run(self._async.alter_topic(name, partitions, config))

    def delete_topic(self, name: str) -> None:
        self.run(self._async.delete_topic(name))

    def partition_count(self, topic: str) -> int:
        return self.run(self._async.partition_count(topic))

    def node_partitions(self, node: str) -> NodePartitions:
        return self.run(self._async.node_partitions(node))

    def node_tls(self, node: str) -> NodeTls:
        return self.run(self._async.node_tls(node))

    def drain(self, node: str) -> NodeAdminState:
        return self.run(self._async.drain(node))

    def undrain(self, node: str) -> NodeAdminState:
        return self.run(self._async.undrain(node))

    def handoff(self, node: str) -> int:
        return self.run(self._async.handoff(node))

    def set_weight(self, node: str, weight: int) -> NodeAdminState:
        return self.run(self._async.set_weight(node, weight))

    def append(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record] | bytes | bytearray | memoryview,
        *,
        producer_id: int | None = None,
        sequence: int | None = None,
        timeout_s: float | None = None,
    ) -> AppendResult:
        return self.run(
            self._async.append(
                topic,
                partition,
                records,
                producer_id=producer_id,
                sequence=sequence,
                timeout_s=timeout_s,
            )
        )

    def read(
        self,
        topic: str,
        partition: int,
        from_index: int | None = None,
        *,
        max_records: int = DEFAULT_MAX_RECORDS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        wait_ms: int = 0,
        timeout_s: float | None = None,
    ) -> ReadResult:
        return self.run(
            self._async.read(
                topic,
                partition,
                from_index,
                max_records=max_records,
                max_bytes=max_bytes,
                wait_ms=wait_ms,
                timeout_s=timeout_s,
            )
        )

    # ------------------------------------------------------------------ shared queues

    def acquire(
        self,
        topic: str,
        partition: int,
        group: str,
        *,
        consumer: str | None = None,
        max_messages: int = DEFAULT_ACQUIRE_MAX,
        lease_ms: int = DEFAULT_LEASE_MS,
        wait_ms: int = 0,
        max_bytes: int | None = None,
        timeout_s: float | None = None,
    ) -> Acquired:
        return self.run(
            self._async.acquire(
                topic,
                partition,
                group,
                consumer=consumer,
                max_messages=max_messages,
                lease_ms=lease_ms,
                wait_ms=wait_ms,
                max_bytes=max_bytes,
                timeout_s=timeout_s,
            )
        )

    def accept(
        self, topic: str, partition: int, group: str, consumer: str, indexes: Sequence[int]
    ) -> Settled:
        return self.run(self._async.accept(topic, partition, group, consumer, indexes))

    def release(
        self, topic: str, partition: int, group: str, consumer: str, indexes: Sequence[int]
    ) -> Settled:
        return self.run(self._async.release(topic, partition, group, consumer, indexes))

    def reject(
        self,
        topic: str,
        partition: int,
        group: str,
        consumer: str,
        indexes: Sequence[int],
        reason: str | None = None,
    ) -> Settled:
        return self.run(self._async.reject(topic, partition, group, consumer, indexes, reason))

    def renew(
        self,
        topic: str,
        partition: int,
        group: str,
        consumer: str,
        indexes: Sequence[int],
        lease_ms: int,
    ) -> Settled:
        return self.run(self._async.renew(topic, partition, group, consumer, indexes, lease_ms))

    def describe_group(self, topic: str, partition: int, group: str) -> GroupDescription:
        return self.run(self._async.describe_group(topic, partition, group))

    # ------------------------------------------------------------------ producing

    def produce(
        self,
        topic: str,
        values_or_records: Iterable[Produceable],
        *,
        key: Bytes | None = None,
        partition: int | None = None,
        **producer_options: Any,
    ) -> list[RecordMetadata]:
        """Produce many records through a `Producer` and wait until all are committed.

        Items are `Record`s (their key, headers and timestamp are used) or values (bytes, str
        or None) sent with `key`. Returns each record's metadata in input order; if any record
        failed, raises the first failure once every record has been settled. Keyword options
        go to `Producer` (`linger_ms`, `max_batch_bytes`, ...).
        """
        items = list(values_or_records)
        return self.run(self._produce(topic, items, key, partition, producer_options))

    async def _produce(
        self,
        topic: str,
        items: list[Produceable],
        key: Bytes | None,
        partition: int | None,
        options: dict[str, Any],
    ) -> list[RecordMetadata]:
        producer = Producer(self._async, topic, **options)
        futures: list[asyncio.Future[RecordMetadata]] = []
        try:
            for item in items:
                if isinstance(item, Record):
                    future = await producer.send(
                        item.value,
                        item.key,
                        item.headers,
                        partition,
                        timestamp_ms=item.timestamp_ms,
                    )
                else:
                    future = await producer.send(item, key, (), partition)
                futures.append(future)
        finally:
            await producer.close()
        return [future.result() for future in futures]

    def producer(self, topic: str, **producer_options: Any) -> SyncProducer:
        """A blocking `Producer` for `topic` (options as for `Producer`)."""
        return SyncProducer(self, topic, **producer_options)


class SyncProducer:
    """Blocking face of a `Producer` running on a `Client`'s loop. `send` blocks only for
    backpressure and returns a `concurrent.futures.Future` of the record's metadata."""

    def __init__(self, client: Client, topic: str, **producer_options: Any) -> None:
        self._client = client
        self._producer = Producer(client.async_client, topic, **producer_options)

    @property
    def producer(self) -> Producer:
        return self._producer

    def send(
        self,
        value: Bytes | None,
        key: Bytes | None = None,
        headers: Headers = (),
        partition: int | None = None,
        *,
        timestamp_ms: int | None = None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        return self._client.run(self._send(value, key, headers, partition, timestamp_ms))

    async def _send(
        self,
        value: Bytes | None,
        key: Bytes | None,
        headers: Headers,
        partition: int | None,
        timestamp_ms: int | None,
    ) -> concurrent.futures.Future[RecordMetadata]:
        sent = await self._producer.send(value, key, headers, partition, timestamp_ms=timestamp_ms)
        result: concurrent.futures.Future[RecordMetadata] = concurrent.futures.Future()

        def copy(done: asyncio.Future[RecordMetadata]) -> None:
            if done.cancelled():
                result.cancel()
            elif (error := done.exception()) is not None:
                result.set_exception(error)
            else:
                result.set_result(done.result())

        sent.add_done_callback(copy)
        return result

    def flush(self) -> None:
        self._client.run(self._producer.flush())

    def close(self) -> None:
        self._client.run(self._producer.close())

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
