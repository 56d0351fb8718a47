"""CommitLog: fsync policies, group commit, power-cut durability, streaming appends."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from laminar.log import (
    BATCH_HEADER_BYTES,
    AppendThresholdError,
    BatchFramingError,
    CommitLog,
    Directory,
    FileDirectory,
    LogConfig,
    LogError,
    MemoryDirectory,
    SegmentedLog,
)
from laminar.log.storage import FileStorage, MemoryStorage

from .helpers import make_batch, read_records

SMALL = LogConfig(segment_bytes=4096, max_batch_bytes=2048)


class CountingFileDirectory(FileDirectory):
    """A real directory that counts fdatasync calls on its files."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.syncs = 0

    def open(self, name: str, *, create: bool) -> FileStorage:
        storage = super().open(name, create=create)
        real_sync = storage.sync

        def counted() -> None:
            self.syncs += 1
            real_sync()

        storage.sync = counted  # type: ignore[method-assign]
        return storage


class CountingMemoryDirectory(MemoryDirectory):
    def __init__(self) -> None:
        super().__init__()
        self.syncs = 0

    def open(self, name: str, *, create: bool) -> MemoryStorage:
        storage = super().open(name, create=create)
        if not hasattr(storage, "counted"):
            real_sync = storage.sync

            def counted() -> None:
                self.syncs += 1
                real_sync()

            storage.sync = counted  # type: ignore[method-assign]
            storage.counted = True  # type: ignore[attr-defined]
        return storage


@pytest.fixture(params=["memory", "file"])
def counting_directory(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "memory":
        return CountingMemoryDirectory()
    return CountingFileDirectory(str(tmp_path / "log"))


async def test_group_commit_shares_fdatasyncs_and_acks_only_durable(counting_directory):
    log = await CommitLog.open(counting_directory, LogConfig(segment_bytes=1 << 20))
    counting_directory.syncs = 0
    durable_at_ack: list[bool] = []

    async def producer(tag: int) -> None:
        for round_ in range(5):
            result = await log.append(make_batch(tag * 10 + round_))
            durable_at_ack.append(log.durable_index >= result.next_index)

    await asyncio.gather(*(producer(t) for t in range(20)))
    appends = len(durable_at_ack)
    assert appends == 100 and all(durable_at_ack)
    assert 0 < counting_directory.syncs < appends / 4  # shared, not one per append
    assert len(read_records(log.log)) == 300
    await log.close()


async def test_never_and_interval_policies_do_not_wait_for_fdatasync(counting_directory):
    log = await CommitLog.open(counting_directory, LogConfig(segment_bytes=1 << 20, fsync="never"))
    counting_directory.syncs = 0
    for tag in range(20):
        await log.append(make_batch(tag))
    assert counting_directory.syncs == 0
    assert log.durable_index == 0
    assert await log.sync() == 60  # an explicit sync still works
    await log.close()

    log = await CommitLog.open(
        counting_directory, LogConfig(segment_bytes=1 << 20, fsync="interval", fsync_interval_ms=5)
    )
    counting_directory.syncs = 0
    await log.append(make_batch(1))
    assert log.durable_index == 60  # returned before any sync
    for _ in range(200):
        if log.durable_index == 63:
            break
        await asyncio.sleep(0.005)
    assert log.durable_index == 63 and counting_directory.syncs >= 1
    await log.close()


@pytest.mark.parametrize("seed", range(40))
async def test_power_cut_keeps_every_acknowledged_append(seed: int):
    """Concurrent producers under fsync=always; the power goes at a random moment (unsynced
    bytes lost, a torn prefix may remain). Every acknowledged batch survives, in order."""
    rng = random.Random(seed)
    directory = MemoryDirectory()
    log = await CommitLog.open(directory, SMALL)
    acknowledged: dict[int, int] = {}  # base index -> tag

    async def producer(first_tag: int) -> None:
        for tag in range(first_tag, first_tag + 1000):
            result = await log.append(make_batch(tag, records=rng.randint(1, 4)))
            acknowledged[result.base_index] = tag

    tasks = [asyncio.create_task(producer(p * 1000)) for p in range(4)]
    for _ in range(rng.randint(1, 300)):
        await asyncio.sleep(0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    directory.crash(rng)  # no close: the process is gone

    recovered = SegmentedLog.open(directory, SMALL)
    values = dict(read_records(recovered))
    for base, tag in acknowledged.items():
        assert values[base] == f"{tag}.0".encode().ljust(20, b".")
    assert recovered.next_index >= max((b + 1 for b in acknowledged), default=0)


async def chunks_of(data: bytes, size: int, *, extra: bytes = b"") -> AsyncIterator[bytes]:
    for offset in range(0, len(data), size):
        await asyncio.sleep(0)
        yield data[offset : offset + size]
    if extra:
        yield extra


async def test_append_stream_from_an_async_byte_stream(directory_factory: Callable[[], Directory]):
    log = await CommitLog.open(directory_factory(), SMALL)
    await log.append(make_batch(1))
    batch = make_batch(2, records=20)
    result = await log.append_stream(chunks_of(batch, 33), append_threshold=len(batch), term=2)
    assert (result.base_index, result.record_count) == (3, 20)
    assert log.durable_index >= 23
    assert [v for _, v in read_records(log.log)][3] == b"2.0".ljust(20, b".")
    assert log.log.term_at(22) == 2
    # a header split across chunks, and a first chunk holding header and payload together
    result = await log.append_stream(chunks_of(make_batch(3), 5))
    assert result.base_index == 23
    result = await log.append_stream(chunks_of(make_batch(4), 1000))
    assert result.base_index == 26
    await log.close()


async def test_bad_streams_roll_back(directory_factory: Callable[[], Directory]):
    log = await CommitLog.open(directory_factory(), SMALL)
    await log.append(make_batch(1))
    before = read_records(log.log)
    size = log.log.size_bytes
    batch = make_batch(2, records=20)
    with pytest.raises(AppendThresholdError):  # declared size over the threshold
        await log.append_stream(chunks_of(batch, 100), append_threshold=len(batch) - 1)
    with pytest.raises(AppendThresholdError):  # more bytes than declared: an endless stream
        await log.append_stream(chunks_of(batch, 100, extra=b"x" * 10_000))
    with pytest.raises(BatchFramingError):  # ends early
        await log.append_stream(chunks_of(batch[:-10], 100))
    with pytest.raises(BatchFramingError):  # ends inside the header
        await log.append_stream(chunks_of(batch[: BATCH_HEADER_BYTES - 1], 10))

    async def broken() -> AsyncIterator[bytes]:
        yield batch[:500]
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        await log.append_stream(broken())
    assert read_records(log.log) == before
    assert log.log.size_bytes == size
    assert (await log.append(make_batch(3))).base_index == 3
    await log.close()


async def test_appends_wait_while_a_stream_is_written(directory_factory: Callable[[], Directory]):
    log = await CommitLog.open(directory_factory(), SMALL)
    gate = asyncio.Event()
    batch = make_batch(1, records=10)

    async def slow() -> AsyncIterator[bytes]:
        yield batch[:100]
        await gate.wait()
        yield batch[100:]

    stream_task = asyncio.create_task(log.append_stream(slow()))
    await asyncio.sleep(0.01)
    append_task = asyncio.create_task(log.append(make_batch(2)))
    await asyncio.sleep(0.01)
    assert not append_task.done()
    gate.set()
    assert (await stream_task).base_index == 0
    assert (await append_task).base_index == 10
    await log.close()


async def test_truncate_fails_waiters_above_the_cut_and_lowers_durable_index():
    directory = MemoryDirectory()
    log = await CommitLog.open(directory, LogConfig(segment_bytes=1 << 20))
    for tag in range(4):
        await log.append(make_batch(tag))
    await log.truncate(6)
    assert (log.next_index, log.durable_index) == (6, 6)
    await log.append(make_batch(9))
    directory.crash()
    recovered = SegmentedLog.open(directory, LogConfig(segment_bytes=1 << 20))
    assert [v for _, v in read_records(recovered)][6] == b"9.0".ljust(20, b".")


async def test_sync_failure_reaches_the_appender(tmp_path: Path):
    directory = FileDirectory(str(tmp_path / "log"))
    log = await CommitLog.open(directory, SMALL)

    def failing() -> None:
        raise OSError(5, "Input/output error")

    storage = log.log._segments[-1].store.storage
    working = storage.sync
    storage.sync = failing  # type: ignore[method-assign]
    with pytest.raises(LogError, match="Input/output error"):
        await log.append(make_batch(1))
    # The next fdatasync might "succeed" without the pages the failed one lost: refuse
    # writes instead of acknowledging them as durable.
    storage.sync = working  # type: ignore[method-assign]
    with pytest.raises(LogError, match="reopen"):
        await log.append(make_batch(2))
    with pytest.raises(LogError, match="reopen"):
        await log.sync()
    await log.close()
    reopened = SegmentedLog.open(directory, SMALL)
    assert [i for i, _ in read_records(reopened)] == [0, 1, 2]  # what reached the disk
    reopened.close()
