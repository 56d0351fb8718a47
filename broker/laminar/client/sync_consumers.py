"""Blocking consumers for threads and scripts: `SyncConsumer` (a topic's log) and
`SyncGroupConsumer` (a shared queue), made by `Client.consumer` and `Client.group_consumer`.

```python
with Client(brokers) as client:
    with client.consumer("orders", consumer_timeout_ms=1000) as consumer:
        for partition, record in consumer:  # ends after 1 s without a record
            ...
    with client.group_consumer("orders", "billing") as queue:
        for delivery in queue:
            ...
            delivery.accept()  # or release() / reject("why"): blocks until settled
        # or: queue.run(handle, concurrency=8)  # plain functions, in 8 threads
```

Each wraps the asyncio object (`Consumer`, `GroupConsumer`) running on the `Client`'s loop, so
the asyncio object's rules hold (start positions, leases renewed in the background, at least
once delivery, what `close()` does). What is added:

* **Round trips.** A call from a thread to the loop costs a thread switch each way, so the
  log consumer takes every record ready at once (up to `BUFFERED_RECORDS`) in one trip and
  hands them out from a buffer: `positions()` counts only what was handed out.
* **`consumer_timeout_ms`** (kafka-python's): iteration ends after that long without a record
  or delivery (0: once nothing is there already); a later `for` goes on where it stopped.
  None (the default) waits for ever.
* **Ctrl-C.** A KeyboardInterrupt while `next()` or `run()` waits closes the consumer (a
  group consumer: no more acquiring, the handlers under way finish for up to
  `close_timeout_s`, their messages are settled, the others released), then propagates: the
  loop ends and the program stops as Python programs do. A second Ctrl-C during that close
  stops waiting; what is still held then comes back when its lease ends.
* **Handlers are threads.** `run(handler, concurrency=n)` calls the plain function `handler`
  in n threads of its own. A thread cannot be cancelled: a handler still running when
  `close()` stops waiting for it runs on (its message is released, and settling it then
  raises RuntimeError); a long handler may watch `stopping` to finish early.
* **Settling blocks** until the broker answered, so the group consumer does not linger to
  batch settlements (`settle_linger_ms` defaults to 0 here, not 5): settlements made at the
  same moment, by `run`'s threads, still share a request.

Close a consumer before its client (nested `with` blocks do): closing the client first stops
everything at once, and what was held comes back when its lease ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from laminar.log.batch import StoredRecord

from .consumer import Consumer
from .group import Delivery, GroupConsumer, OnError, State
from .models import QueueMessage

if TYPE_CHECKING:
    from .sync import Client

T = TypeVar("T")
SyncHandler = Callable[["SyncDelivery"], object]

#: most records a SyncConsumer takes from its loop in one round trip (what is ready at once)
BUFFERED_RECORDS = 1000
#: a SyncGroupConsumer's default `settle_linger_ms`: its settle calls block, so no lingering
SYNC_SETTLE_LINGER_MS = 0.0


def _timeout_s(consumer_timeout_ms: float | None) -> float | None:
    if consumer_timeout_ms is not None and consumer_timeout_ms < 0:
        raise ValueError("consumer_timeout_ms must be >= 0 (or None: wait for ever)")
    return None if consumer_timeout_ms is None else consumer_timeout_ms / 1000


async def _call(function: Callable[[], T]) -> T:
    """Run `function` on the loop (the asyncio objects are not thread-safe)."""
    return function()


async def _next_or_none(iterator: AsyncIterator[T], timeout_s: float | None) -> T | None:
    """The iterator's next item, or None when it ended or `timeout_s` passed without one.
    Cancelling while it waits loses nothing: both consumers take an item only as they
    return it."""
    timeout = asyncio.timeout(timeout_s)
    try:
        async with timeout:
            return await anext(iterator)
    except StopAsyncIteration:
        return None
    except TimeoutError:
        if timeout.expired():
            return None
        raise  # the consumer's own error


class SyncConsumer:
    """Blocking face of a `Consumer` (a log reader: nothing is committed on the broker) on
    `client`'s loop: `for partition, record in consumer`. Options are `Consumer`'s (`start`,
    `wait_ms`, ...); `consumer_timeout_ms` ends iteration after that long without a record.
    Iterate from one thread at a time; `close()` may come from any thread."""

    def __init__(
        self,
        client: Client,
        topic: str,
        partitions: Iterable[int] | None = None,
        *,
        consumer_timeout_ms: float | None = None,
        **consumer_options: Any,
    ) -> None:
        self._timeout_s = _timeout_s(consumer_timeout_ms)
        self._client = client
        self._consumer = Consumer(client.async_client, topic, partitions, **consumer_options)
        self._buffer: deque[tuple[int, StoredRecord]] = deque()
        self._error: BaseException | None = None  # raised once the buffer before it is empty
        self._closed = False

    @property
    def consumer(self) -> Consumer:
        """The wrapped consumer (use it only from coroutines run by `Client.run`)."""
        return self._consumer

    @property
    def topic(self) -> str:
        return self._consumer.topic

    @property
    def partitions(self) -> list[int]:
        """The partitions read (known once started)."""
        return self._client.run(_call(lambda: self._consumer.partitions))

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        """Resolve the partitions and start positions, and start fetching (idempotent;
        `with` and the first `next()` do it)."""
        self._client.run(self._consumer.start())

    def positions(self) -> dict[int, int]:
        """The next index iteration will yield, per partition (empty before `start()`)."""
        positions = self._client.run(_call(self._consumer.positions))
        first: set[int] = set()
        for partition, record in self._buffer:  # taken from the loop, not handed out yet
            if partition not in first:
                first.add(partition)
                positions[partition] = record.index
        return positions

    def seek(self, partition: int, index: int) -> None:
        """Continue `partition` at `index`: records of it read ahead so far are dropped."""
        self._client.run(_call(lambda: self._consumer.seek(partition, index)))
        self._buffer = deque(item for item in self._buffer if item[0] != partition)

    def __iter__(self) -> Iterator[tuple[int, StoredRecord]]:
        return self

    def __next__(self) -> tuple[int, StoredRecord]:
        try:
            return self._next()
        except KeyboardInterrupt:
            self.close()
            raise

    def _next(self) -> tuple[int, StoredRecord]:
        if self._closed:
            raise StopIteration
        if not self._buffer:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            taken = self._client.run(self._take(self._timeout_s))
            if self._closed:  # by another thread meanwhile
                raise StopIteration
            self._buffer.extend(taken)
            if not self._buffer:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                raise StopIteration  # timed out, or closed
        return self._buffer.popleft()

    async def _take(self, timeout_s: float | None) -> list[tuple[int, StoredRecord]]:
        """On the loop: wait up to `timeout_s` for a record, then take those ready at once
        too. An error after the first is kept for the `next()` after the records before it."""
        await self._consumer.start()  # (not under the timeout: starting is not waiting)
        first = await _next_or_none(self._consumer, timeout_s)
        if first is None:
            return []
        taken: list[tuple[int, StoredRecord]] = [first]
        try:
            while len(taken) < BUFFERED_RECORDS:
                ready = await _next_or_none(self._consumer, 0)  # 0: what needs no waiting
                if ready is None:
                    break
                taken.append(ready)
        except Exception as e:
            self._error = e
        return taken

    def close(self) -> None:
        """Stop fetching; iteration then ends (idempotent, from any thread)."""
        if self._closed:
            return
        self._closed = True
        self._buffer.clear()
        if not self._client.closed:
            self._client.run(self._consumer.close())

    def __enter__(self) -> SyncConsumer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SyncDelivery:
    """A message acquired by a `SyncGroupConsumer`, to settle exactly once with `accept()`,
    `release()` or `reject(reason)`, from any thread; each blocks until the broker answered.
    Its lease is renewed until then."""

    __slots__ = ("_client", "_delivery")

    def __init__(self, client: Client, delivery: Delivery) -> None:
        self._client = client
        self._delivery = delivery

    def __repr__(self) -> str:
        return f"Sync{self._delivery!r}"

    @property
    def delivery(self) -> Delivery:
        """The wrapped delivery (use it only from coroutines run by `Client.run`)."""
        return self._delivery

    @property
    def message(self) -> QueueMessage:
        return self._delivery.message

    @property
    def consumer(self) -> str:
        return self._delivery.consumer

    @property
    def topic(self) -> str:
        return self._delivery.topic

    @property
    def partition(self) -> int:
        return self._delivery.partition

    @property
    def index(self) -> int:
        return self._delivery.index

    @property
    def deliveries(self) -> int:
        return self._delivery.deliveries

    @property
    def key(self) -> bytes | None:
        return self._delivery.key

    @property
    def value(self) -> bytes | None:
        return self._delivery.value

    @property
    def headers(self) -> tuple[tuple[str, bytes], ...]:
        return self._delivery.headers

    @property
    def lease_deadline_ms(self) -> int:
        """The lease's end as last reported by the broker (acquire or renew)."""
        return self._delivery.lease_deadline_ms

    @property
    def lease_lost(self) -> bool:
        """A renewal was refused: the message is no longer held by this consumer."""
        return self._delivery.lease_lost

    @property
    def state(self) -> State:
        return self._delivery.state

    @property
    def settled(self) -> bool:
        """Accepted, released, rejected, or lost (refused when settled, or given up)."""
        return self._delivery.settled

    def accept(self) -> bool:
        """Done with it: never delivered again. False if the broker refused (lease lost)."""
        return self._client.run(self._delivery.accept())

    def release(self) -> bool:
        """Give it back to be delivered again (deliveries + 1). False if refused."""
        return self._client.run(self._delivery.release())

    def reject(self, reason: str | None = None) -> bool:
        """Dead-letter it to `<topic>.dlq` with `reason` (1..200 chars). False if refused."""
        return self._client.run(self._delivery.reject(reason))


class SyncGroupConsumer:
    """Blocking face of a `GroupConsumer` (a shared queue) on `client`'s loop:
    `for delivery in queue` (settle each: `delivery.accept()`, ...) and/or
    `queue.run(handler, concurrency=n)`. Options are `GroupConsumer`'s (`consumer`,
    `lease_ms`, `max_in_flight`, `limit`, `close_timeout_s`, ...; `settle_linger_ms`
    defaults to 0: see the module doc); `consumer_timeout_ms` ends iteration after that long
    without a delivery. Any number of threads may iterate, settle and close it."""

    def __init__(
        self,
        client: Client,
        topic: str,
        group: str,
        *,
        consumer_timeout_ms: float | None = None,
        **group_options: Any,
    ) -> None:
        self._timeout_s = _timeout_s(consumer_timeout_ms)
        group_options.setdefault("settle_linger_ms", SYNC_SETTLE_LINGER_MS)
        self._client = client
        self._group = GroupConsumer(client.async_client, topic, group, **group_options)
        self._stopping = threading.Event()
        self._closing: concurrent.futures.Future[None] | None = None
        self._lock = threading.RLock()  # RLock: close() may come from a signal handler
        self._handler_thread = threading.local()

    @property
    def group_consumer(self) -> GroupConsumer:
        """The wrapped consumer (use it only from coroutines run by `Client.run`)."""
        return self._group

    @property
    def topic(self) -> str:
        return self._group.topic

    @property
    def group(self) -> str:
        return self._group.group

    @property
    def consumer(self) -> str:
        """The consumer id sent with every call."""
        return self._group.consumer

    @property
    def partitions(self) -> list[int]:
        """The partitions consumed (known once started)."""
        return self._client.run(_call(lambda: self._group.partitions))

    @property
    def refused(self) -> int:
        """Settlements the broker refused so far (their lease had ended: they may come again)."""
        return self._group.refused

    @property
    def in_flight(self) -> int:
        """Messages held and not settled yet (handed out or waiting to be)."""
        return self._group.in_flight

    @property
    def stopping(self) -> threading.Event:
        """Set once `close()` began (Ctrl-C, another thread, a signal handler): a long
        handler may wait on it or check it to finish early, as threads cannot be cancelled."""
        return self._stopping

    @property
    def closed(self) -> bool:
        """`close()` has finished."""
        closing = self._closing
        return closing is not None and closing.done()

    def start(self) -> None:
        """Find the partitions and start acquiring (idempotent; `with`, the first `next()`
        and `run` do it)."""
        self._client.run(self._group.start())

    def __iter__(self) -> Iterator[SyncDelivery]:
        return self

    def __next__(self) -> SyncDelivery:
        try:
            delivery = self._client.run(self._take(self._timeout_s))
            if delivery is None:
                raise StopIteration  # closed, limit reached, or timed out
            return SyncDelivery(self._client, delivery)
        except KeyboardInterrupt:
            self.close()
            raise

    async def _take(self, timeout_s: float | None) -> Delivery | None:
        await self._group.start()  # (not under the timeout: starting is not waiting)
        return await _next_or_none(self._group, timeout_s)

    def run(
        self, handler: SyncHandler, *, concurrency: int = 1, on_error: OnError = "reject"
    ) -> None:
        """Call `handler(delivery)` in `concurrency` threads until `close()` (or `limit`).

        As `GroupConsumer.run`: a handler that returns accepts the message (unless it settled
        it itself); one that raises `Retry` releases it; one that raises anything else
        rejects it with the error as the reason, or releases it with `on_error="release"`.
        Raises the consumer's fatal errors. Ctrl-C closes the consumer (the handlers under
        way finish first), then raises KeyboardInterrupt.
        """
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=concurrency, thread_name_prefix=f"laminar-{self.group}"
        )

        def call(delivery: SyncDelivery) -> object:
            self._handler_thread.active = True
            try:
                return handler(delivery)
            finally:
                self._handler_thread.active = False

        async def in_thread(delivery: Delivery) -> None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(threads, call, SyncDelivery(self._client, delivery))

        running: concurrent.futures.Future[None] | None = None
        try:
            running = self._client.submit(
                self._group.run(in_thread, concurrency=concurrency, on_error=on_error)
            )
            running.result()
        except KeyboardInterrupt:
            try:
                self.close()  # run ends once the handlers under way are done
            finally:
                if running is not None:
                    running.cancel()  # (a second Ctrl-C cut the close short)
            raise
        except BaseException:
            if running is not None:
                running.cancel()
            raise
        finally:
            threads.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        """Stop acquiring, let the handlers under way finish (up to `close_timeout_s`),
        settle what is pending and release what is held (idempotent, from any thread). From
        a `run` handler it only begins closing: the close waits for that handler."""
        with self._lock:
            self._stopping.set()
            if self._closing is None:
                if self._client.closed:  # it cancelled everything already
                    self._closing = concurrent.futures.Future()
                    self._closing.set_result(None)
                else:
                    self._closing = self._client.submit(self._group.close())
            closing = self._closing
        if getattr(self._handler_thread, "active", False):
            return
        try:
            closing.result()
        except KeyboardInterrupt:
            closing.cancel()
            raise

    def __enter__(self) -> SyncGroupConsumer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
