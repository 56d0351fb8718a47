"""`Client`: a thin synchronous wrapper of `AsyncClient` for scripts, notebooks and threads.

Every public coroutine method of `AsyncClient` is a blocking method of `Client`, with the same
signature and documentation (`Blocking`); only producing differs (`produce`, `producer`), and
consuming has blocking objects of its own (`consumer`, `group_consumer`: sync_consumers.py).

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
import functools
import inspect
import os
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from laminar.log.batch import Record

from .client import DEFAULT_TIMEOUT_S, AsyncClient
from .models import RecordMetadata
from .producer import Bytes, Headers, Producer
from .sync_consumers import SyncConsumer, SyncGroupConsumer

T = TypeVar("T")
P = ParamSpec("P")
Produceable = Record | bytes | bytearray | memoryview | str | None


class Blocking(Generic[P, T]):
    """A method of `Client`: `AsyncClient`'s coroutine method of the same name, run on the
    client's loop until it returns (`Client.run`), with its signature and documentation."""

    def __init__(
        self, method: Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]
    ) -> None:
        self.name = method.__name__
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, client: None, owner: type[Client]) -> Blocking[P, T]: ...

    @overload
    def __get__(self, client: Client, owner: type[Client]) -> Callable[P, T]: ...

    def __get__(
        self, client: Client | None, owner: type[Client]
    ) -> Blocking[P, T] | Callable[P, T]:
        if client is None:
            return self
        method: Callable[P, Coroutine[Any, Any, T]] = getattr(client.async_client, self.name)

        @functools.wraps(method)
        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return client.run(method(*args, **kwargs))

        return call


class Client:
    """Blocking twin of `AsyncClient`: the same methods, returning results instead of
    coroutines. Use `with Client([...]) as client:` or call `close()`."""

    def __init__(
        self,
        brokers: Sequence[str] | str | None = None,
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

    @property
    def closed(self) -> bool:
        return self._closed

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
    # Every public coroutine method of AsyncClient, blocking: these lines give them their types
    # (the async ones'); one without a line here is added all the same (`_add_blocking_calls`)
    # and types as `__getattr__` says.

    cluster = Blocking(AsyncClient.cluster)
    node_partitions = Blocking(AsyncClient.node_partitions)
    node_tls = Blocking(AsyncClient.node_tls)
    drain = Blocking(AsyncClient.drain)
    undrain = Blocking(AsyncClient.undrain)
    handoff = Blocking(AsyncClient.handoff)
    set_weight = Blocking(AsyncClient.set_weight)
    topics = Blocking(AsyncClient.topics)
    create_topic = Blocking(AsyncClient.create_topic)
    describe_topic = Blocking(AsyncClient.describe_topic)
    partitions = Blocking(AsyncClient.partitions)
    wait_for_leaders = Blocking(AsyncClient.wait_for_leaders)
    alter_topic = Blocking(AsyncClient.alter_topic)
    delete_topic = Blocking(AsyncClient.delete_topic)
    partition_count = Blocking(AsyncClient.partition_count)
    append = Blocking(AsyncClient.append)
    read = Blocking(AsyncClient.read)
    read_batches = Blocking(AsyncClient.read_batches)
    acquire = Blocking(AsyncClient.acquire)
    accept = Blocking(AsyncClient.accept)
    release = Blocking(AsyncClient.release)
    reject = Blocking(AsyncClient.reject)
    renew = Blocking(AsyncClient.renew)
    describe_group = Blocking(AsyncClient.describe_group)

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Callable[..., Any]:
            """A public coroutine method of AsyncClient without its line above, blocking."""
            raise AttributeError(name)

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

    # ------------------------------------------------------------------ consuming

    def consumer(
        self,
        topic: str,
        partitions: Iterable[int] | None = None,
        *,
        consumer_timeout_ms: float | None = None,
        **consumer_options: Any,
    ) -> SyncConsumer:
        """A blocking `Consumer` of `topic`: `for partition, record in consumer`; iteration
        ends after `consumer_timeout_ms` without a record (None: never). Options as for
        `Consumer` (`start`, `wait_ms`, ...)."""
        return SyncConsumer(
            self, topic, partitions, consumer_timeout_ms=consumer_timeout_ms, **consumer_options
        )

    def group_consumer(
        self,
        topic: str,
        group: str,
        *,
        consumer_timeout_ms: float | None = None,
        **group_options: Any,
    ) -> SyncGroupConsumer:
        """A blocking `GroupConsumer` of `topic` as consumer group `group`: `for delivery in
        queue` (then `delivery.accept()`, ...) or `queue.run(handler, concurrency=n)` with a
        plain function run in threads. Options as for `GroupConsumer`."""
        return SyncGroupConsumer(
            self, topic, group, consumer_timeout_ms=consumer_timeout_ms, **group_options
        )


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


#: AsyncClient calls that answer an object for asyncio code (a streaming append): not blocking
ASYNC_ONLY = frozenset({"append_stream"})


def _add_blocking_calls(cls: type[Client]) -> None:
    """A `Blocking` method of `cls` for every public coroutine method of AsyncClient that it
    does not have, but those in ASYNC_ONLY (a new API call is in the blocking client at once)."""
    for name, member in vars(AsyncClient).items():
        if name.startswith("_") or name in ASYNC_ONLY or hasattr(cls, name):
            continue
        if inspect.iscoroutinefunction(member):
            setattr(cls, name, Blocking(member))


_add_blocking_calls(Client)
