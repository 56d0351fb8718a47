"""`Consumer`: read a topic's partitions as one ordered stream per partition.

One fetch task per partition long-polls `read` (`wait_ms`) from the partition's next index and
hands whole answers to the iterator through a small bounded queue, so at most about
`(prefetch + partitions) * max_bytes` bytes wait in memory. The iterator yields
`(partition, StoredRecord)`: the records of a partition in index order, partitions interleaved
in the order their answers arrive. It is a log reader: nothing is committed on the broker;
`positions()` gives the next index per partition to store wherever you like, and `start=` /
`seek()` resume from there.

**By time.** `start_timestamp_ms=` starts each partition at its first record whose timestamp is
at or after that time, and `seek_to_timestamp()` moves there later (Kafka's `offsetsForTimes`
then `seek`): the partition's leader finds it in its time index
(`AsyncClient.partition_offsets`). A partition with no record that late continues at its
end, as Kafka's consumer does with a null offset.

**To the end.** `stop_at_end=True` reads what exists when the consumer starts and no more, as
`laminar consume` does: each partition's end is one past its commit index then, and iteration
ends once every partition got there (a `seek` back reads again up to the same end). Without
it the consumer follows the partitions for ever.

**Below the log start.** When retention has removed the records at a partition's position,
the broker answers 416 `out_of_range` with the partition's `log_start`; the consumer then
jumps to `log_start` (the removed records are skipped, as Kafka's `auto.offset.reset=earliest`
does) and `positions()` shows the jump.

**Errors.** Retryable errors (`Unavailable`, `Overloaded`, `Timeout`) are retried forever with
backoff: a consumer waits out leader elections and restarts of the cluster. Any other error
(the topic was deleted, a bad token, ...) stops that partition's fetching and is raised by the
iterator.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, Protocol

from laminar.log.batch import StoredRecord
from laminar.models.group_admin import PartitionOffsets

from .errors import LaminarError, OutOfRange
from .models import ReadResult, TopicDescription

Start = Literal["earliest", "latest"] | Mapping[int, int]
RETRY_BACKOFF_S = 0.1
MAX_RETRY_BACKOFF_S = 2.0
IDLE_POLL_S = 0.1  # pause between empty answers when wait_ms is 0
_CLOSED = -1  # the partition of the chunk that tells a waiting iterator the consumer closed


class ConsumerTransport(Protocol):
    """What a Consumer needs from its client (`AsyncClient` is one)."""

    async def read(
        self,
        topic: str,
        partition: int,
        from_index: int | None = None,
        *,
        max_records: int = ...,
        max_bytes: int = ...,
        wait_ms: int = ...,
    ) -> ReadResult: ...

    async def describe_topic(self, name: str, /) -> TopicDescription: ...

    async def partition_offsets(
        self, topic: str, partition: int, *, timestamp_ms: int | None = ...
    ) -> PartitionOffsets: ...


@dataclass(eq=False, slots=True)
class _Chunk:
    partition: int
    generation: int
    records: list[StoredRecord] = field(default_factory=list)
    next_index: int = 0
    error: BaseException | None = None
    offset: int = 0


class Consumer:
    """Iterates over the records of `topic` (all partitions, or those given).

    `start`: "earliest" (each partition's log start), "latest" (only records committed after
    the consumer starts) or `{partition: index}` (partitions missing from it start at the
    earliest). `start_timestamp_ms`: instead, each partition not in a `start` mapping starts
    at its first record whose timestamp is at or after it (ms since the epoch; at its end if
    none is that late). `stop_at_end`: iteration ends at each partition's commit index at the
    start (else it waits for new records for ever). Use `async with` (or `start()`/`close()`)
    and `async for partition, record in consumer`.
    """

    def __init__(
        self,
        client: ConsumerTransport,
        topic: str,
        partitions: Iterable[int] | None = None,
        *,
        start: Start = "earliest",
        wait_ms: int = 1000,
        max_bytes: int = 1 << 20,
        max_records: int = 1000,
        prefetch: int = 4,
        start_timestamp_ms: int | None = None,
        stop_at_end: bool = False,
    ) -> None:
        if isinstance(start, str) and start not in ("earliest", "latest"):
            raise ValueError(f"start={start!r} is not 'earliest', 'latest' or a mapping")
        if start_timestamp_ms is not None and (
            isinstance(start_timestamp_ms, bool)
            or not isinstance(start_timestamp_ms, int)
            or start_timestamp_ms < 0
        ):
            raise ValueError(f"start_timestamp_ms={start_timestamp_ms!r} is not a time in ms")
        if wait_ms < 0 or max_bytes < 1 or max_records < 1 or prefetch < 1:
            raise ValueError("wait_ms must be >= 0; max_bytes, max_records, prefetch >= 1")
        self._client = client
        self._topic = topic
        self._wanted = None if partitions is None else sorted(set(partitions))
        self._start_at = start
        self._start_ms = start_timestamp_ms
        self._wait_ms = wait_ms
        self._max_bytes = max_bytes
        self._max_records = max_records
        self._prefetch = prefetch
        self._stop_at_end = stop_at_end
        #: with `stop_at_end`: one past each partition's commit index at the start
        self._ends: dict[int, int] = {}
        self._positions: dict[int, int] = {}
        self._seeks: dict[int, int] = {}
        self._generations: dict[int, int] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._queue: asyncio.Queue[_Chunk] | None = None
        self._current: _Chunk | None = None
        self._started = False
        self._starting: asyncio.Lock | None = None
        self._closed = False

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def partitions(self) -> list[int]:
        """The partitions read (known once started)."""
        return sorted(self._positions)

    def positions(self) -> dict[int, int]:
        """The next index the iterator will yield, per partition (empty before `start()`)."""
        return dict(self._positions)

    def seek(self, partition: int, index: int) -> None:
        """Continue `partition` at `index`: records of it prefetched so far are dropped."""
        if index < 0:
            raise ValueError(f"index {index} is negative")
        if self._started and partition not in self._positions:
            raise ValueError(f"partition {partition} is not consumed here")
        if not self._started:
            self._seeks[partition] = index  # applied over `start` by start()
            return
        self._generations[partition] += 1
        self._positions[partition] = index
        if self._current is not None and self._current.partition == partition:
            self._current = None
        self._spawn(partition, index)

    async def seek_to_timestamp(self, timestamp_ms: int) -> dict[int, int]:
        """Continue every partition at its first record whose timestamp is at or after
        `timestamp_ms` (ms since the epoch), or at its end when it has none that late; returns
        the new positions. Starts the consumer if it was not started."""
        await self.start()
        found = await asyncio.gather(*(self._index_at(p, timestamp_ms) for p in self.partitions))
        for partition, index in zip(self.partitions, found, strict=True):
            self.seek(partition, index)
        return dict(zip(self.partitions, found, strict=True))

    async def _index_at(self, partition: int, timestamp_ms: int) -> int:
        offsets = await self._client.partition_offsets(
            self._topic, partition, timestamp_ms=timestamp_ms
        )
        return offsets.end_index if offsets.index is None else offsets.index

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> tuple[int, StoredRecord]:
        if self._closed:
            raise StopAsyncIteration
        await self.start()
        assert self._queue is not None
        while True:
            chunk = self._current
            if chunk is not None and chunk.generation == self._generations[chunk.partition]:
                if chunk.offset < len(chunk.records):
                    record = chunk.records[chunk.offset]
                    chunk.offset += 1
                    self._positions[chunk.partition] = record.index + 1
                    return chunk.partition, record
                self._positions[chunk.partition] = max(
                    self._positions[chunk.partition], chunk.next_index
                )
            self._current = None
            if self._stop_at_end and all(
                self._positions[p] >= end for p, end in self._ends.items()
            ):
                raise StopAsyncIteration  # (a seek back may read again)
            chunk = await self._queue.get()
            if chunk.partition == _CLOSED:
                raise StopAsyncIteration
            if chunk.generation != self._generations[chunk.partition]:
                continue
            if chunk.error is not None:
                raise chunk.error
            self._current = chunk

    async def start(self) -> None:
        """Resolve the partitions and start positions, and start fetching (idempotent)."""
        if self._started:
            return
        if self._closed:
            raise RuntimeError("the consumer is closed")
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._started:
                return
            description = await self._client.describe_topic(self._topic)
            partitions = self._wanted
            if partitions is None:
                partitions = list(range(description.partitions))
            for p in partitions:
                if not 0 <= p < description.partitions:
                    raise ValueError(f"{self._topic} has no partition {p}")
            mapping = {**(self._start_at if isinstance(self._start_at, Mapping) else {})}
            mapping.update(self._seeks)
            by_time: dict[int, int] = {}
            if self._start_ms is not None:
                later = [p for p in partitions if p not in mapping]
                found = await asyncio.gather(*(self._index_at(p, self._start_ms) for p in later))
                by_time = dict(zip(later, found, strict=True))
            for p in partitions:
                state = description.partition(p)
                if self._stop_at_end:
                    if state is None:  # (no leader reported): ask the partition itself
                        answer = await self._client.read(self._topic, p, None, max_records=1)
                        self._ends[p] = answer.commit_index + 1
                    else:
                        self._ends[p] = state.commit_index + 1
                if p in mapping:
                    self._positions[p] = mapping[p]
                elif p in by_time:
                    self._positions[p] = by_time[p]
                elif self._start_at == "latest":
                    if state is None:
                        answer = await self._client.read(self._topic, p, None, max_records=1)
                        self._positions[p] = answer.commit_index + 1
                    else:
                        self._positions[p] = state.commit_index + 1
                else:
                    self._positions[p] = state.log_start if state is not None else 1
                self._generations[p] = 0
            self._queue = asyncio.Queue(maxsize=self._prefetch)
            self._started = True
            for p in partitions:
                self._spawn(p, self._positions[p])

    async def close(self) -> None:
        """Stop fetching. Iteration then ends."""
        self._closed = True
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        if self._queue is not None:  # wake an iterator waiting for records: it ends
            while not self._queue.empty():
                self._queue.get_nowait()
            self._queue.put_nowait(_Chunk(_CLOSED, 0))

    # ------------------------------------------------------------------ fetching

    def _spawn(self, partition: int, index: int) -> None:
        old = self._tasks.pop(partition, None)
        if old is not None:
            old.cancel()
        if self._closed:
            return
        generation = self._generations[partition]
        task = asyncio.get_running_loop().create_task(self._fetch(partition, generation, index))
        self._tasks[partition] = task

    async def _fetch(self, partition: int, generation: int, index: int) -> None:
        assert self._queue is not None
        put = self._queue.put
        end = self._ends.get(partition) if self._stop_at_end else None
        attempt = 0
        while True:
            if end is not None and index >= end:
                await put(_Chunk(partition, generation, [], index))  # (its position, at the end)
                return
            try:
                result = await self._client.read(
                    self._topic,
                    partition,
                    index,
                    max_records=self._max_records,
                    max_bytes=self._max_bytes,
                    wait_ms=self._wait_ms,
                )
            except OutOfRange as e:
                log_start = e.log_start
                if log_start is None:
                    log_start = await self._log_start(partition)
                if log_start is not None and log_start > index:
                    index = log_start  # retention removed [index, log_start): skip them
                    await put(_Chunk(partition, generation, [], index))
                    continue
                retry = True  # a replica whose log start differs: ask again
            except LaminarError as e:
                retry = e.retryable
                if not retry:
                    await put(_Chunk(partition, generation, error=e))
                    return
            except Exception as e:
                await put(_Chunk(partition, generation, error=e))
                return
            else:
                retry = False
            if retry:
                delay = min(MAX_RETRY_BACKOFF_S, RETRY_BACKOFF_S * 2**attempt)
                await asyncio.sleep(delay * random.uniform(0.5, 1))
                attempt += 1
                continue
            attempt = 0
            next_index = max(result.next_index, index)
            records = result.records
            if records:
                next_index = max(next_index, records[-1].index + 1)
            if end is not None and next_index > end:  # (committed since the start)
                records = [r for r in records if r.index < end]
                next_index = end
            if records or next_index != index:
                await put(_Chunk(partition, generation, records, next_index))
            elif self._wait_ms == 0:
                await asyncio.sleep(IDLE_POLL_S)
            index = next_index

    async def _log_start(self, partition: int) -> int | None:
        try:
            state = (await self._client.describe_topic(self._topic)).partition(partition)
        except LaminarError:
            return None
        return state.log_start if state is not None else None
