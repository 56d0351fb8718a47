"""Producer logic: batching, linger, size limits, partitioning, sequence numbers, idempotent
retries, one batch in flight per partition, backpressure, flush and close.

These are pure-logic unit tests: the Producer is given `FakeLog`, a small in-process stand-in
for `AsyncClient.append` / `partition_count` that decodes each batch with the real codec and
deduplicates (producer id, sequence) the way the broker's contract says. This is the one place
where a stand-in is allowed; the real client against real brokers is tested in
tests/integration/test_client.py.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass

import pytest

from laminar.client import (
    AppendResult,
    NotFound,
    Producer,
    RecordMetadata,
    Timeout,
    Unavailable,
    partition_for,
)
from laminar.client.producer import record_bytes
from laminar.log.batch import BatchHeader, Record, StoredRecord, decode_batch, parse_header


@dataclass
class Call:
    partition: int
    header: BatchHeader
    records: list[StoredRecord]
    size: int


class FakeLog:
    """In-process stand-in for the append path (pure-logic test only; see the module doc)."""

    def __init__(self, partitions: int = 4, delay_s: float = 0.0) -> None:
        self.partitions = partitions
        self.delay_s = delay_s
        self.calls: list[Call] = []
        self.logs: dict[int, list[StoredRecord]] = defaultdict(list)
        self.written: dict[tuple[int, int, int], AppendResult] = {}
        self.lose_answers = 0  # write, then fail as if the answer was lost
        self.refuse = 0  # fail before writing
        self.error: Exception | None = None  # raised on every call when set
        self.errors: list[Exception] = []  # raised first, one per call
        self.gate: asyncio.Event | None = None  # appends wait for it when set
        self.in_flight: dict[int, int] = defaultdict(int)
        self.max_in_flight: dict[int, int] = defaultdict(int)
        self.total_in_flight = 0
        self.max_total_in_flight = 0

    async def partition_count(self, topic: str) -> int:
        return self.partitions

    async def append(self, topic: str, partition: int, records: bytes) -> AppendResult:
        self.in_flight[partition] += 1
        self.total_in_flight += 1
        self.max_in_flight[partition] = max(
            self.max_in_flight[partition], self.in_flight[partition]
        )
        self.max_total_in_flight = max(self.max_total_in_flight, self.total_in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(self.delay_s)
            header = parse_header(records)
            decoded = decode_batch(records)
            self.calls.append(Call(partition, header, decoded, len(records)))
            if self.errors:
                raise self.errors.pop(0)
            if self.error is not None:
                raise self.error
            if self.refuse:
                self.refuse -= 1
                raise Unavailable(503, "unavailable", "no leader")
            key = (partition, header.producer_id, header.producer_seq)
            if key in self.written:
                original = self.written[key]
                return AppendResult(original.base_index, original.count, duplicate=True)
            log = self.logs[partition]
            base = len(log) + 1
            log.extend(
                StoredRecord(base + i, r.timestamp_ms, r.key, r.value, r.headers)
                for i, r in enumerate(decoded)
            )
            result = AppendResult(base, len(decoded))
            self.written[key] = result
            if self.lose_answers:
                self.lose_answers -= 1
                raise Unavailable(0, "connection_lost", "the answer was lost")
            return result
        finally:
            self.in_flight[partition] -= 1
            self.total_in_flight -= 1


def values(log: list[StoredRecord]) -> list[bytes | None]:
    return [r.value for r in log]


async def test_records_sent_within_the_linger_go_in_one_batch() -> None:
    log = FakeLog(partitions=1)
    producer = Producer(log, "t", linger_ms=50)
    loop = asyncio.get_running_loop()
    started = loop.time()
    futures = [await producer.send(f"v{i}".encode()) for i in range(10)]
    results = await asyncio.gather(*futures)
    assert loop.time() - started >= 0.045
    assert len(log.calls) == 1
    assert [r.index for r in results] == list(range(1, 11))
    assert values(log.logs[0]) == [f"v{i}".encode() for i in range(10)]
    await producer.close()


async def test_batches_never_exceed_max_batch_bytes() -> None:
    log = FakeLog(partitions=1)
    producer = Producer(log, "t", linger_ms=1000, max_batch_bytes=4096)
    value = b"x" * 1000
    size = record_bytes(Record(value, timestamp_ms=0))
    futures = [await producer.send(value) for _ in range(20)]
    await producer.flush()
    assert all(f.done() for f in futures)
    per_batch = (4096 - 72) // size
    assert [len(c.records) for c in log.calls] == [per_batch] * (20 // per_batch) + (
        [20 % per_batch] if 20 % per_batch else []
    )
    assert all(c.size <= 4096 for c in log.calls)
    await producer.close()


async def test_a_full_batch_is_sent_without_waiting_for_the_linger() -> None:
    log = FakeLog(partitions=1)
    producer = Producer(log, "t", linger_ms=60_000, max_batch_bytes=1024)
    futures = [await producer.send(b"y" * 300) for _ in range(3)]
    # 72 + 3 * 314 = 1014 bytes: no record (at least 14 bytes) fits any more, so it is full.
    await asyncio.wait_for(asyncio.gather(*futures), timeout=5)
    assert len(log.calls) == 1
    await producer.close()


async def test_an_oversized_record_goes_alone() -> None:
    log = FakeLog(partitions=1)
    producer = Producer(log, "t", linger_ms=0, max_batch_bytes=1024)
    big = await producer.send(b"z" * 5000)
    small = await producer.send(b"s")
    assert (await big).index == 1 and (await small).index == 2
    assert [len(c.records) for c in log.calls] == [1, 1]
    await producer.close()


async def test_keyed_records_follow_the_partitioner_and_keep_their_order() -> None:
    log = FakeLog(partitions=6)
    producer = Producer(log, "t", linger_ms=2, max_batch_bytes=2048)
    sent: list[tuple[bytes, bytes, asyncio.Future[RecordMetadata]]] = []
    for i in range(600):
        key = f"k{i % 37}".encode()
        value = f"{i}".encode()
        sent.append((key, value, await producer.send(value, key=key)))
    await producer.flush()
    per_key: dict[bytes, list[int]] = defaultdict(list)
    for key, value, future in sent:
        meta = future.result()
        assert meta.partition == partition_for(key, 6)
        stored = log.logs[meta.partition][meta.index - 1]
        assert (stored.key, stored.value) == (key, value)
        per_key[key].append(meta.index)
    for indexes in per_key.values():
        assert indexes == sorted(indexes)
    for partition, records in log.logs.items():
        assert [r.index for r in records] == list(range(1, len(records) + 1)), partition
    await producer.close()


async def test_sequence_numbers_count_records_per_partition() -> None:
    log = FakeLog(partitions=3)
    producer = Producer(log, "t", linger_ms=0, max_batch_bytes=200)
    for i in range(90):
        await producer.send(b"v" * (i % 7), partition=i % 3)
    await producer.flush()
    assert 1 <= producer.producer_id < 2**63
    by_partition: dict[int, list[Call]] = defaultdict(list)
    for call in log.calls:
        assert call.header.producer_id == producer.producer_id
        by_partition[call.partition].append(call)
    for partition, calls in by_partition.items():
        expected = 0
        for call in calls:
            assert call.header.producer_seq == expected
            expected += call.header.record_count
        assert expected == 30
        assert producer.next_sequence(partition) == 30
    other = Producer(log, "t")
    assert other.producer_id != producer.producer_id
    await producer.close()


async def test_keyless_records_stick_to_one_partition_per_batch() -> None:
    log = FakeLog(partitions=4)
    producer = Producer(log, "t", linger_ms=30)
    futures = [await producer.send(f"{i}".encode()) for i in range(50)]
    await producer.flush()
    partitions = {f.result().partition for f in futures}
    assert len(partitions) == 1 and len(log.calls) == 1
    first = partitions.pop()
    more = [await producer.send(b"next") for _ in range(5)]
    await producer.flush()
    assert {f.result().partition for f in more} == {(first + 1) % 4}
    await producer.close()


async def test_keyless_records_move_on_when_a_batch_is_full() -> None:
    log = FakeLog(partitions=3)
    producer = Producer(log, "t", linger_ms=10_000, max_batch_bytes=1000)
    futures = [await producer.send(b"q" * 100) for _ in range(27)]
    await producer.flush()
    counts = defaultdict(int)
    for future in futures:
        counts[future.result().partition] += 1
    assert sorted(counts) == [0, 1, 2]  # 8 records per full batch, round-robin
    assert all(len(c.records) <= 8 for c in log.calls)
    await producer.close()


async def test_a_retry_reuses_the_producer_id_and_sequence_and_is_deduplicated() -> None:
    log = FakeLog(partitions=1)
    log.lose_answers = 1  # written, but the producer does not hear of it
    producer = Producer(log, "t", linger_ms=0)
    first = await producer.send(b"a")
    assert (await first).index == 1
    assert len(log.calls) == 2
    assert {(c.header.producer_id, c.header.producer_seq) for c in log.calls} == {
        (producer.producer_id, 0)
    }
    assert values(log.logs[0]) == [b"a"]  # the retry was a duplicate: nothing written twice
    second = await producer.send(b"b")
    assert (await second).index == 2
    assert log.calls[-1].header.producer_seq == 1
    await producer.close()


async def test_a_refused_append_is_retried_until_it_succeeds() -> None:
    log = FakeLog(partitions=1)
    log.refuse = 3
    producer = Producer(log, "t", linger_ms=0)
    future = await producer.send(b"a")
    assert await asyncio.wait_for(future, timeout=10) == RecordMetadata(0, 1)
    assert len(log.calls) == 4
    await producer.close()


async def test_retries_stop_at_the_delivery_timeout() -> None:
    log = FakeLog(partitions=1)
    log.error = Unavailable(503, "unavailable", "no leader")
    producer = Producer(log, "t", linger_ms=0, delivery_timeout_s=0.3)
    future = await producer.send(b"a")
    with pytest.raises(Unavailable):
        await asyncio.wait_for(future, timeout=10)
    await producer.close()


async def test_a_batch_that_may_have_been_written_fails_marked_ambiguous() -> None:
    log = FakeLog(partitions=1)
    unknown = Timeout(504, "outcome_unknown", "the leader stepped down; it may still commit")
    unknown.ambiguous = True  # as the client marks a 504
    log.errors = [unknown]
    log.error = Unavailable(503, "unavailable", "no leader")  # from then on, until given up
    producer = Producer(log, "t", linger_ms=0, delivery_timeout_s=0.3)
    future = await producer.send(b"a")
    with pytest.raises(Unavailable) as info:
        await asyncio.wait_for(future, timeout=10)
    assert info.value.ambiguous  # the last error is a 503, but the 504's append may be written
    await producer.close()


async def test_a_permanent_error_fails_the_batch_and_later_batches_go_on() -> None:
    log = FakeLog(partitions=1)
    log.error = NotFound(404, "not_found", "no topic t")
    producer = Producer(log, "t", linger_ms=0)
    failed = await producer.send(b"a")
    with pytest.raises(NotFound):
        await failed
    assert len(log.calls) == 1  # not retried
    log.error = None
    ok = await producer.send(b"b")
    assert (await ok).index == 1
    assert log.calls[-1].header.producer_seq == 1  # the failed batch's sequence is not reused
    await producer.close()


async def test_one_batch_in_flight_per_partition_and_max_in_flight_overall() -> None:
    log = FakeLog(partitions=8, delay_s=0.01)
    producer = Producer(log, "t", linger_ms=0, max_in_flight=3)
    futures = [await producer.send(b"v", partition=i % 8) for i in range(400)]
    await producer.flush()
    assert all(not f.exception() for f in futures)
    assert max(log.max_in_flight.values()) == 1
    assert 1 < log.max_total_in_flight <= 3
    # While a batch was in flight the next one filled up: far fewer appends than records.
    assert len(log.calls) < 200
    await producer.close()


async def test_send_waits_while_the_buffer_is_full() -> None:
    log = FakeLog(partitions=1)
    log.gate = asyncio.Event()
    size = record_bytes(Record(b"x" * 100, timestamp_ms=0))
    producer = Producer(log, "t", linger_ms=0, buffer_bytes=3 * size)
    first = [await producer.send(b"x" * 100) for _ in range(3)]
    assert producer.buffered_bytes == 3 * size
    blocked = asyncio.ensure_future(producer.send(b"x" * 100))
    await asyncio.sleep(0.05)
    assert not blocked.done()
    log.gate.set()
    fourth = await asyncio.wait_for(blocked, timeout=5)
    await asyncio.gather(*first, fourth)
    await producer.flush()
    assert producer.buffered_bytes == 0
    await producer.close()


async def test_a_record_larger_than_the_buffer_is_still_admitted_alone() -> None:
    log = FakeLog(partitions=1)
    producer = Producer(log, "t", linger_ms=0, buffer_bytes=10)
    future = await asyncio.wait_for(producer.send(b"x" * 100), timeout=5)
    assert (await future).index == 1
    await producer.close()


async def test_flush_sends_at_once_despite_the_linger() -> None:
    log = FakeLog(partitions=2)
    producer = Producer(log, "t", linger_ms=60_000)
    futures = [await producer.send(b"v", partition=i % 2) for i in range(10)]
    await asyncio.wait_for(producer.flush(), timeout=5)
    assert all(f.done() for f in futures)
    assert len(log.calls) == 2
    await producer.close()


async def test_close_sends_what_is_buffered_and_refuses_more() -> None:
    log = FakeLog(partitions=1)
    async with Producer(log, "t", linger_ms=60_000) as producer:
        future = await producer.send(b"last words")
    assert future.result() == RecordMetadata(0, 1)
    with pytest.raises(RuntimeError):
        await producer.send(b"too late")


async def test_headers_str_values_and_timestamps_are_encoded() -> None:
    log = FakeLog(partitions=1)
    producer = Producer(log, "t", linger_ms=0)
    await (await producer.send("wert", key="schlüssel", headers={"h": "v", "b": b"\x00"}))
    await (await producer.send(None, key=b"k", headers=[("h", b"1")], timestamp_ms=1234))
    first, second = log.logs[0]
    assert first.key == "schlüssel".encode() and first.value == b"wert"
    assert first.headers == (("h", b"v"), ("b", b"\x00"))
    assert second.value is None and second.timestamp_ms == 1234
    await producer.close()


async def test_bad_arguments_are_refused() -> None:
    log = FakeLog(partitions=2)
    producer = Producer(log, "t")
    with pytest.raises(ValueError):
        await producer.send(b"v", partition=2)
    # a timestamp a batch cannot carry is refused by send, never by the batch it would share
    # with other records (issue 19: it made encoding the batch fail, and all of them)
    good = await producer.send(b"good", partition=0)
    for bad in (-1, 253402300799999 + 1, 2**63):
        with pytest.raises(ValueError, match="timestamp_ms"):
            await producer.send(b"v", partition=0, timestamp_ms=bad)
    assert (await good).partition == 0
    with pytest.raises(ValueError):
        Producer(log, "t", producer_id=0)
    with pytest.raises(ValueError):
        Producer(log, "t", max_batch_bytes=80)
    with pytest.raises(ValueError):
        Producer(log, "t", max_in_flight=0)
    await producer.close()
