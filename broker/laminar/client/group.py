"""`GroupConsumer`: work through a topic as a shared queue (one consumer group, every partition).

```python
async with GroupConsumer(client, "orders", "billing") as orders:
    await orders.run(handle, concurrency=8)  # handle(delivery): ok → accept, raise → reject
# or
async with GroupConsumer(client, "orders", "billing") as orders:
    async for delivery in orders:
        ...
        await delivery.accept()  # or release() / reject("why")
```

How it works (API: docs/api.md, "Shared queues"):

* **Acquiring.** One loop per partition long-polls `acquire` (`wait_ms`) with the consumer's id
  (default `host-pid-random`). At most `max_in_flight` messages are held unsettled at a time,
  counting those waiting to be handed out: a loop asks for at most `batch` messages and its
  fair share of the free room (`max_in_flight / partitions`), and waits when there is none,
  the waiting loops being served first come first served. A loop whose acquire takes the
  last free room while another partition's loop has none does not long-poll: it asks with
  `wait_ms` 0 and hands the room on when nothing is there (each partition then asks at most
  every `IDLE_POLL_S`), so a message on any partition is found within about that long, not
  behind `wait_ms` of each empty partition ahead of it (`limit=1`, small `max_in_flight`).
* **Leases.** Every `renew_interval_ms` (default `lease_ms / 3`) the leases of all held
  messages are renewed, one `renew` call per partition, on a fixed schedule: a slow answer
  delays neither the next renewal nor another partition's. A message whose lease was lost (renew
  refused: it ran out, and the broker may have given it to someone else) is not renewed again;
  if it was not handed out yet it is dropped; settling it answers False.
* **Settling.** `accept` / `release` / `reject` calls are batched per partition: those made
  within `settle_linger_ms` (or up to `settle_batch` indexes) go in one request. Each resolves
  to True (settled) or False (refused: the lease was lost, the message may come again; logged
  as a warning, counted in `refused`; `run` goes on).
* **Errors.** Retryable errors (no leader during an election, a broker restarting, a 504
  whose outcome is unknown) are retried with backoff forever; any other error (the topic was
  deleted, a bad token) is raised by the iterator and `run`. A repeated accept/release/reject
  of the consumer's own settlement is `done` again, so retrying one is harmless; an acquire
  repeated after a 504 may leave what the lost one took held until its lease ends, then it is
  delivered again. Partitions added to the topic are picked up (checked every
  `partition_check_s`).
* **Closing.** `close()` stops acquiring, waits (up to `close_timeout_s`) for acquires under
  way and `run` handlers, sends pending settlements, then releases every message still held
  (best effort: those it cannot release come back when their lease ends).

Delivery is at least once: a message whose handler ran may be delivered again if the accept
did not reach the broker before the lease ended.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import secrets
import socket
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Literal, Protocol

from laminar.contract import (
    DEFAULT_LEASE_MS,
    MAX_ACQUIRE,
    MAX_LEASE_MS,
    MAX_REASON_CHARS,
    MAX_SETTLE_INDEXES,
    MAX_WAIT_MS,
)

from .client import check_consumer, check_group
from .errors import LaminarError
from .models import Acquired, QueueMessage, Settled, TopicDescription

if TYPE_CHECKING:
    from .transactions import Transaction

log = logging.getLogger(__name__)

Action = Literal["accept", "release", "reject"]
OnError = Literal["reject", "release"]
State = Literal["held", "settling", "accepted", "released", "rejected", "lost"]
Handler = Callable[["Delivery"], Awaitable[object]]

RETRY_BACKOFF_S = 0.1
MAX_RETRY_BACKOFF_S = 2.0
IDLE_POLL_S = 0.1  # least time between two acquires of a partition that found nothing
MIN_RENEW_INTERVAL_S = 0.01
#: unanswered renew calls a partition and consumer may have (`_renew_loop`)
MAX_RENEWS_IN_FLIGHT = 3
_DONE: dict[Action, State] = {"accept": "accepted", "release": "released", "reject": "rejected"}


class GroupTransport(Protocol):
    """What a GroupConsumer needs from its client (`AsyncClient` is one)."""

    async def acquire(
        self,
        topic: str,
        partition: int,
        group: str,
        *,
        consumer: str | None = ...,
        max_messages: int = ...,
        lease_ms: int = ...,
        wait_ms: int = ...,
        max_bytes: int | None = ...,
    ) -> Acquired: ...

    async def accept(
        self, topic: str, partition: int, group: str, consumer: str, indexes: Sequence[int]
    ) -> Settled: ...

    async def release(
        self, topic: str, partition: int, group: str, consumer: str, indexes: Sequence[int]
    ) -> Settled: ...

    async def reject(
        self,
        topic: str,
        partition: int,
        group: str,
        consumer: str,
        indexes: Sequence[int],
        reason: str | None = ...,
    ) -> Settled: ...

    async def renew(
        self,
        topic: str,
        partition: int,
        group: str,
        consumer: str,
        indexes: Sequence[int],
        lease_ms: int,
    ) -> Settled: ...

    async def describe_topic(self, name: str, /) -> TopicDescription: ...


class Retry(Exception):
    """Raise it in a `run` handler to release the message (delivered again) instead of
    rejecting it."""


def default_consumer_id() -> str:
    """`<hostname>-<pid>-<8 random hex digits>`, made a valid consumer id."""
    host = re.sub(r"[^A-Za-z0-9._:-]", "-", socket.gethostname())
    host = host.lstrip("._:-")[:150] or "consumer"
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"


def reason_for(error: BaseException) -> str:
    """A reject reason (1..200 characters) naming an exception."""
    text = " ".join(f"{type(error).__name__}: {error}".split()).removesuffix(":")
    return text[:MAX_REASON_CHARS]


class Delivery:
    """A message acquired for this consumer, to settle exactly once with `accept()`,
    `release()` or `reject(reason)`. Its lease is renewed until then."""

    __slots__ = ("_lease_deadline_ms", "_lease_lost", "_owner", "_state", "consumer", "message")

    def __init__(self, owner: GroupConsumer, message: QueueMessage, consumer: str) -> None:
        self._owner = owner
        self.message = message
        self.consumer = consumer
        self._state: State = "held"
        self._lease_lost = False
        self._lease_deadline_ms = message.lease_deadline_ms

    def __repr__(self) -> str:
        m = self.message
        return (
            f"Delivery({m.topic}/{m.partition} index {m.index}, deliveries {m.deliveries}, "
            f"{self._state})"
        )

    @property
    def topic(self) -> str:
        return self.message.topic

    @property
    def partition(self) -> int:
        return self.message.partition

    @property
    def index(self) -> int:
        return self.message.index

    @property
    def deliveries(self) -> int:
        return self.message.deliveries

    @property
    def key(self) -> bytes | None:
        return self.message.key

    @property
    def value(self) -> bytes | None:
        return self.message.value

    @property
    def headers(self) -> tuple[tuple[str, bytes], ...]:
        return self.message.headers

    @property
    def lease_deadline_ms(self) -> int:
        """The lease's end as last reported by the broker (acquire or renew)."""
        return self._lease_deadline_ms

    @property
    def lease_lost(self) -> bool:
        """A renewal was refused: the message is no longer held by this consumer."""
        return self._lease_lost

    @property
    def state(self) -> State:
        return self._state

    @property
    def settled(self) -> bool:
        """Accepted, released, rejected, or lost (refused when settled, or given up)."""
        return self._state not in ("held", "settling")

    async def accept(self) -> bool:
        """Done with it: never delivered again. False if the broker refused (lease lost)."""
        return await self._owner._settle(self, "accept", None)

    async def release(self) -> bool:
        """Give it back to be delivered again (deliveries + 1). False if refused."""
        return await self._owner._settle(self, "release", None)

    async def reject(self, reason: str | None = None) -> bool:
        """Dead-letter it to `<topic>.dlq` with `reason` (1..200 chars). False if refused."""
        return await self._owner._settle(self, "reject", reason)

    async def accept_in(self, transaction: Transaction) -> bool:
        """Accept it as part of `transaction` (consume -> produce exactly once): finished if
        the transaction commits, given back if it aborts (laminar.client.transactions).
        False if refused (lease lost)."""
        return await self._owner._accept_in(self, transaction)


@dataclass(eq=False, slots=True)
class _Partition:
    number: int
    held: dict[int, Delivery] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    acquiring: bool = False  # an acquire call is under way


@dataclass(eq=False, slots=True)
class _Batch:
    partition: int
    action: Action
    consumer: str
    reason: str | None
    items: list[tuple[Delivery, asyncio.Future[bool]]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


_BatchKey = tuple[int, Action, str, str | None]


class GroupConsumer:
    """Consumes `topic` as consumer group `group` over all its partitions (see the module doc).

    `lease_ms`: each message's lease (renewed while held); `max_in_flight`: most messages
    held unsettled at once; `batch`: most messages per acquire; `wait_ms`: long-poll of an
    acquire; `limit`: hand out at most this many messages in all, then iteration ends (and no
    more are acquired than that). Use `async with` (or `start()` / `close()`), then
    `async for delivery in consumer` and/or `await consumer.run(handler)`. The client must
    stay open until `close()` returns.
    """

    def __init__(
        self,
        client: GroupTransport,
        topic: str,
        group: str,
        *,
        consumer: str | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        max_in_flight: int = 1000,
        batch: int = 100,
        wait_ms: int = 1000,
        max_bytes: int | None = None,
        limit: int | None = None,
        renew_interval_ms: int | None = None,
        settle_linger_ms: float = 5.0,
        settle_batch: int = 1000,
        partition_check_s: float = 10.0,
        close_timeout_s: float | None = None,
    ) -> None:
        check_group(group)
        consumer = default_consumer_id() if consumer is None else consumer
        check_consumer(consumer)
        if not 1 <= lease_ms <= MAX_LEASE_MS:
            raise ValueError(f"lease_ms must be in 1..{MAX_LEASE_MS}")
        if not 0 <= wait_ms <= MAX_WAIT_MS:
            raise ValueError(f"wait_ms must be in 0..{MAX_WAIT_MS}")
        if max_in_flight < 1 or not 1 <= batch <= MAX_ACQUIRE:
            raise ValueError(f"max_in_flight must be >= 1 and batch in 1..{MAX_ACQUIRE}")
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        if renew_interval_ms is not None and renew_interval_ms <= 0:
            raise ValueError("renew_interval_ms must be positive")
        if settle_linger_ms < 0 or not 1 <= settle_batch <= MAX_SETTLE_INDEXES:
            raise ValueError(f"settle_linger_ms must be >= 0, settle_batch 1..{MAX_SETTLE_INDEXES}")
        if partition_check_s <= 0:
            raise ValueError("partition_check_s must be positive")
        self._client = client
        self._topic = topic
        self._group = group
        self._consumer = consumer
        self._lease_ms = lease_ms
        self._max_in_flight = max_in_flight
        self._batch = batch
        self._wait_ms = wait_ms
        self._max_bytes = max_bytes
        self._limit = limit
        interval_ms = lease_ms / 3 if renew_interval_ms is None else renew_interval_ms
        self._renew_interval_s = max(MIN_RENEW_INTERVAL_S, interval_ms / 1000)
        self._linger_s = settle_linger_ms / 1000
        self._settle_batch = settle_batch
        self._partition_check_s = partition_check_s
        self._close_timeout_s = (
            wait_ms / 1000 + 5.0 if close_timeout_s is None else max(0.0, close_timeout_s)
        )
        self._partitions: dict[int, _Partition] = {}
        self._ready: deque[Delivery] = deque()
        self._wake: asyncio.Event | None = None
        self._held = 0  # messages held (in `_Partition.held`)
        self._reserved = 0  # room promised to acquires under way
        self._acquired = 0  # messages acquired that were or will be handed out (for `limit`)
        self._handed = 0
        self._refused = 0
        self._waiters: deque[tuple[int, asyncio.Future[int]]] = deque()
        self._batches: dict[_BatchKey, _Batch] = {}
        self._sending: set[asyncio.Task[None]] = set()
        self._workers: set[asyncio.Task[None]] = set()
        self._background: list[asyncio.Task[None]] = []
        self._error: BaseException | None = None
        self._starting: asyncio.Lock | None = None
        self._started = False
        self._stopping = False  # no more acquiring, nothing more handed out
        self._closed = False  # no more settling either

    # ------------------------------------------------------------------ public

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def group(self) -> str:
        return self._group

    @property
    def consumer(self) -> str:
        """The consumer id sent with every call."""
        return self._consumer

    @property
    def partitions(self) -> list[int]:
        """The partitions consumed (known once started)."""
        return sorted(self._partitions)

    @property
    def refused(self) -> int:
        """Settlements the broker refused so far (their lease had ended: they may come again)."""
        return self._refused

    @property
    def in_flight(self) -> int:
        """Messages held and not settled yet (handed out or waiting to be)."""
        return self._held

    async def __aenter__(self) -> GroupConsumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __aiter__(self) -> GroupConsumer:
        return self

    async def __anext__(self) -> Delivery:
        delivery = await self._next()
        if delivery is None:
            raise StopAsyncIteration
        return delivery

    async def start(self) -> None:
        """Find the partitions and start acquiring (idempotent)."""
        if self._started:
            return
        if self._stopping:
            raise RuntimeError("the GroupConsumer is closed")
        if self._starting is None:
            self._starting = asyncio.Lock()
            self._wake = asyncio.Event()
        async with self._starting:
            if self._started:
                return
            description = await self._client.describe_topic(self._topic)
            if self._stopping:
                raise RuntimeError("the GroupConsumer is closed")
            self._started = True
            self._add_partitions(description.partitions)
            loop = asyncio.get_running_loop()
            self._background = [
                loop.create_task(self._renew_loop()),
                loop.create_task(self._watch_partitions()),
            ]

    async def run(
        self, handler: Handler, *, concurrency: int = 1, on_error: OnError = "reject"
    ) -> None:
        """Hand messages to `handler` in `concurrency` tasks until `close()` (or `limit`).

        A handler that returns accepts the message (unless it settled it itself); one that
        raises `Retry` releases it; one that raises anything else rejects it with the error
        as the reason, or releases it with `on_error="release"`. Raises the consumer's fatal
        errors. Cancelling `run` cancels the handlers; their messages stay held until
        `close()` releases them.
        """
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if on_error not in ("reject", "release"):
            raise ValueError(f"on_error={on_error!r} is not 'reject' or 'release'")
        await self.start()
        loop = asyncio.get_running_loop()
        workers = [loop.create_task(self._work(handler, on_error)) for _ in range(concurrency)]
        self._workers.update(workers)
        try:
            await asyncio.gather(*workers)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not self._stopping or (current is not None and current.cancelling()):
                raise
            # close() ran out of time waiting for a handler and cancelled it: a normal end
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            self._workers.difference_update(workers)

    async def close(self) -> None:
        """Stop, settle what is pending and release what is held (see the module doc)."""
        if self._stopping:
            return
        self._stopping = True
        for _, waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(0)
        self._waiters.clear()
        if self._wake is not None:
            self._wake.set()
        current = asyncio.current_task()
        tasks: list[asyncio.Task[None]] = []
        for partition in self._partitions.values():
            task = partition.task
            if task is None or task is current:
                continue
            if not partition.acquiring:
                task.cancel()  # between calls: stop now (else: wait for the answer)
            tasks.append(task)
        await _finish(tasks, self._close_timeout_s)
        await _finish([t for t in self._workers if t is not current], self._close_timeout_s)
        await self._flush_all()
        self._closed = True
        await self._flush_all()  # what was settled meanwhile
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self._release_held()

    # ------------------------------------------------------------------ handing out

    async def _next(self) -> Delivery | None:
        await self.start()
        assert self._wake is not None
        while True:
            if self._error is not None:
                raise self._error
            if self._stopping or (self._limit is not None and self._handed >= self._limit):
                return None
            while self._ready:
                delivery = self._ready.popleft()
                if delivery._lease_lost or delivery._state != "held":
                    self._acquired -= 1  # never handed out: its room in `limit` is free again
                    self._forget(delivery, "lost")
                    continue
                self._handed += 1
                return delivery
            self._wake.clear()
            await self._wake.wait()

    async def _work(self, handler: Handler, on_error: OnError) -> None:
        while True:
            delivery = await self._next()
            if delivery is None:
                return
            action: Action = "accept"
            reason: str | None = None
            try:
                await handler(delivery)
            except Retry:
                action = "release"
            except Exception as e:
                log.warning("handler failed on %r: %s", delivery, reason_for(e), exc_info=True)
                action = on_error
                reason = reason_for(e) if on_error == "reject" else None
            if delivery._state != "held":
                continue  # the handler settled it itself
            try:
                await self._settle(delivery, action, reason)
            except RuntimeError:
                return  # closed meanwhile: close() releases it
            except LaminarError as e:
                # Give up on it: no more renewals, so the broker gives it out again later.
                log.warning("could not %s %r: %s", action, delivery, e)
                self._forget(delivery, "lost")

    # ------------------------------------------------------------------ acquiring

    def _add_partitions(self, count: int) -> None:
        loop = asyncio.get_running_loop()
        for number in range(count):
            if number not in self._partitions:
                partition = _Partition(number)
                self._partitions[number] = partition
                partition.task = loop.create_task(self._acquire_loop(partition))

    def _free(self) -> int:
        free = self._max_in_flight - self._held - self._reserved
        if self._limit is not None:
            free = min(free, self._limit - self._acquired - self._reserved)
        return free

    async def _reserve(self) -> int:
        """Room for the next acquire of a partition: 1.. messages, or 0 when stopping."""
        if self._stopping:
            return 0
        share = max(1, self._max_in_flight // max(1, len(self._partitions)))
        want = min(self._batch, share)
        free = self._free()
        if not self._waiters and free > 0:
            granted = min(want, free)
            self._reserved += granted
            return granted
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = (want, waiter)
        self._waiters.append(entry)
        try:
            return await waiter
        except asyncio.CancelledError:
            if entry in self._waiters:
                self._waiters.remove(entry)
            elif waiter.done() and not waiter.cancelled():
                self._unreserve(waiter.result())
            raise

    def _unreserve(self, count: int) -> None:
        self._reserved -= count
        self._grant()

    def _grant(self) -> None:
        """Give the free room to the waiting acquire loops, first come first served."""
        while self._waiters and not self._stopping:
            free = self._free()
            if free <= 0:
                return
            want, waiter = self._waiters.popleft()
            if waiter.done():
                continue
            granted = min(want, free)
            self._reserved += granted
            waiter.set_result(granted)

    def _starving(self, partition: _Partition) -> bool:
        """Would a long poll of `partition` (holding its room) starve another partition's
        loop of room to acquire with? (No room is left, and another loop has no acquire
        under way.)"""
        if self._free() > 0:
            return False
        return any(p is not partition and not p.acquiring for p in self._partitions.values())

    async def _acquire_loop(self, partition: _Partition) -> None:
        attempt = 0
        while not self._stopping:
            room = await self._reserve()
            if room <= 0:
                return
            partition.acquiring = True
            began = asyncio.get_running_loop().time()
            try:
                acquired = await self._client.acquire(
                    self._topic,
                    partition.number,
                    self._group,
                    consumer=self._consumer,
                    max_messages=room,
                    lease_ms=self._lease_ms,
                    wait_ms=0 if self._starving(partition) else self._wait_ms,
                    max_bytes=self._max_bytes,
                )
            except LaminarError as e:
                self._unreserve(room)
                if not e.retryable:
                    self._fail(e)
                    return
                log.debug("acquire from %s/%d: %s; retrying", self._topic, partition.number, e)
                delay = min(MAX_RETRY_BACKOFF_S, RETRY_BACKOFF_S * 2**attempt)
                await asyncio.sleep(delay * random.uniform(0.5, 1))
                attempt += 1
                continue
            except asyncio.CancelledError:
                self._unreserve(room)
                raise
            except Exception as e:
                self._unreserve(room)
                self._fail(e)
                return
            finally:
                partition.acquiring = False
            attempt = 0
            self._reserved -= room
            for message in acquired.messages:
                self._add(partition, message, acquired.consumer or self._consumer)
            self._grant()
            if not acquired.messages:  # no spinning on quick empty answers (wait_ms 0)
                elapsed = asyncio.get_running_loop().time() - began
                if elapsed < IDLE_POLL_S:
                    await asyncio.sleep(IDLE_POLL_S - elapsed)

    def _add(self, partition: _Partition, message: QueueMessage, consumer: str) -> None:
        delivery = Delivery(self, message, consumer)
        old = partition.held.get(message.index)
        if old is None:
            self._held += 1
        else:  # given to us again (our lease on it had run out): the old one is stale
            old._lease_lost = True
        partition.held[message.index] = delivery
        self._acquired += 1
        if not self._stopping:
            self._ready.append(delivery)
            assert self._wake is not None
            self._wake.set()

    def _forget(self, delivery: Delivery, state: State) -> None:
        """`delivery` is no longer held (settled, refused or given up)."""
        delivery._state = state
        held = self._partitions[delivery.partition].held
        if held.get(delivery.index) is delivery:
            del held[delivery.index]
            self._held -= 1
            self._grant()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        if self._wake is not None:
            self._wake.set()

    async def _watch_partitions(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self._partition_check_s)
            try:
                description = await self._client.describe_topic(self._topic)
            except Exception as e:
                log.debug("describing %s: %s", self._topic, e)
                continue
            if not self._stopping:
                self._add_partitions(description.partitions)

    # ------------------------------------------------------------------ leases

    async def _renew_loop(self) -> None:
        """Renew every held lease each `renew_interval_ms`, on a fixed schedule: each call
        runs as a task of its own, so a slow answer delays neither the next renewal nor other
        partitions' (waiting for them all before sleeping again let one slow answer stretch
        the interval past the lease). At most `MAX_RENEWS_IN_FLIGHT` calls a partition and
        consumer are unanswered at once; renewing goes on while close() waits for running
        handlers."""
        loop = asyncio.get_running_loop()
        #: each partition and consumer's unanswered renew calls
        in_flight: dict[tuple[int, str], set[asyncio.Task[None]]] = {}
        due_s = loop.time()
        try:
            while not self._closed:
                due_s = max(due_s + self._renew_interval_s, loop.time())
                await asyncio.sleep(due_s - loop.time())
                in_flight = {key: running for key, running in in_flight.items() if running}
                for partition in list(self._partitions.values()):
                    by_consumer: dict[str, list[int]] = {}
                    for index, delivery in partition.held.items():
                        if not delivery._lease_lost:
                            by_consumer.setdefault(delivery.consumer, []).append(index)
                    for consumer, indexes in by_consumer.items():
                        running = in_flight.setdefault((partition.number, consumer), set())
                        if len(running) >= MAX_RENEWS_IN_FLIGHT:
                            continue
                        task = loop.create_task(self._renew_chunks(partition, consumer, indexes))
                        running.add(task)
                        task.add_done_callback(running.discard)
        finally:
            await _finish([task for running in in_flight.values() for task in running], 0)

    async def _renew_chunks(self, partition: _Partition, consumer: str, indexes: list[int]) -> None:
        await asyncio.gather(*(self._renew(partition, consumer, c) for c in _chunks(indexes)))

    async def _renew(self, partition: _Partition, consumer: str, indexes: list[int]) -> None:
        try:
            settled = await self._client.renew(
                self._topic, partition.number, self._group, consumer, indexes, self._lease_ms
            )
        except Exception as e:
            log.warning(
                "renewing %d leases on %s/%d: %s", len(indexes), self._topic, partition.number, e
            )
            return
        for index in settled.refused:
            delivery = partition.held.get(index)
            if delivery is not None and delivery.consumer == consumer:
                delivery._lease_lost = True
        if settled.lease_deadline_ms is not None:
            for index in settled.done:
                delivery = partition.held.get(index)
                if delivery is not None and delivery.consumer == consumer:
                    delivery._lease_deadline_ms = settled.lease_deadline_ms

    # ------------------------------------------------------------------ settling

    async def _settle(self, delivery: Delivery, action: Action, reason: str | None) -> bool:
        if self._closed:
            raise RuntimeError("the GroupConsumer is closed")
        if delivery._state != "held":
            raise RuntimeError(f"{delivery!r} is already {delivery._state}")
        if reason is not None and not 1 <= len(reason) <= MAX_REASON_CHARS:
            raise ValueError(f"reason must be 1..{MAX_REASON_CHARS} characters")
        loop = asyncio.get_running_loop()
        delivery._state = "settling"
        result: asyncio.Future[bool] = loop.create_future()
        key: _BatchKey = (delivery.partition, action, delivery.consumer, reason)
        batch = self._batches.get(key)
        if batch is None:
            batch = _Batch(delivery.partition, action, delivery.consumer, reason)
            self._batches[key] = batch
            batch.timer = loop.call_later(self._linger_s, self._flush, key, batch)
        batch.items.append((delivery, result))
        if len(batch.items) >= self._settle_batch:
            self._flush(key, batch)
        return await result

    async def _accept_in(self, delivery: Delivery, transaction: Transaction) -> bool:
        if self._closed:
            raise RuntimeError("the GroupConsumer is closed")
        if delivery._state != "held":
            raise RuntimeError(f"{delivery!r} is already {delivery._state}")
        delivery._state = "settling"
        try:
            settled = await transaction.accept(
                self._topic, delivery.partition, self._group, delivery.consumer, [delivery.index]
            )
        except BaseException:
            delivery._state = "held"
            raise
        ok = delivery.index in settled.done
        self._forget(delivery, "accepted" if ok else "lost")  # (the transaction decides)
        return ok

    async def _flush_all(self) -> None:
        for key, batch in list(self._batches.items()):
            self._flush(key, batch)
        await _finish(list(self._sending), self._close_timeout_s)

    def _flush(self, key: _BatchKey, batch: _Batch) -> None:
        if self._batches.get(key) is not batch:
            return  # sent already
        del self._batches[key]
        if batch.timer is not None:
            batch.timer.cancel()
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: _Batch) -> None:
        indexes = sorted({delivery.index for delivery, _ in batch.items})
        args = (self._topic, batch.partition, self._group, batch.consumer, indexes)
        try:
            if batch.action == "accept":
                settled = await self._client.accept(*args)
            elif batch.action == "release":
                settled = await self._client.release(*args)
            else:
                settled = await self._client.reject(*args, reason=batch.reason)
        except BaseException as e:
            error: BaseException = e
            if isinstance(e, asyncio.CancelledError):  # by close(), out of time
                error = RuntimeError("the GroupConsumer closed before the broker answered")
            for delivery, result in batch.items:
                if delivery._state == "settling":
                    delivery._state = "held"  # may be settled again, or released by close()
                if not result.done():
                    result.set_exception(error)
            if not isinstance(e, Exception):
                raise
            return
        done = set(settled.done)
        refused = 0
        for delivery, result in batch.items:
            ok = delivery.index in done
            refused += not ok
            self._forget(delivery, _DONE[batch.action] if ok else "lost")
            if not result.done():
                result.set_result(ok)
        if refused:
            self._refused += refused
            log.warning(
                "the broker refused to %s %d of %d messages of %s/%d (their leases had ended: "
                "they may be delivered again)",
                batch.action,
                refused,
                len(batch.items),
                self._topic,
                batch.partition,
            )

    async def _release_held(self) -> None:
        """Release every message still held (best effort)."""
        calls = []
        for partition in self._partitions.values():
            by_consumer: dict[str, list[int]] = {}
            for index, delivery in partition.held.items():
                if delivery._state == "held" and not delivery._lease_lost:
                    by_consumer.setdefault(delivery.consumer, []).append(index)
            for consumer, indexes in by_consumer.items():
                for chunk in _chunks(indexes):
                    calls.append(self._release(partition, consumer, chunk))
        if calls:
            await asyncio.gather(*calls)
        for partition in self._partitions.values():
            for delivery in list(partition.held.values()):
                self._forget(delivery, "lost")  # not released: its lease will run out
        self._ready.clear()

    async def _release(self, partition: _Partition, consumer: str, indexes: list[int]) -> None:
        try:
            settled = await self._client.release(
                self._topic, partition.number, self._group, consumer, indexes
            )
        except Exception as e:
            log.info(
                "could not release %d messages of %s/%d: %s",
                len(indexes),
                self._topic,
                partition.number,
                e,
            )
            return
        for index in settled.done:
            delivery = partition.held.get(index)
            if delivery is not None and delivery.consumer == consumer:
                self._forget(delivery, "released")


def _chunks(indexes: list[int]) -> list[list[int]]:
    return [indexes[i : i + MAX_SETTLE_INDEXES] for i in range(0, len(indexes), MAX_SETTLE_INDEXES)]


async def _finish(tasks: list[asyncio.Task[None]], timeout_s: float) -> None:
    """Let `tasks` end by themselves for up to `timeout_s`, then cancel the others."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
