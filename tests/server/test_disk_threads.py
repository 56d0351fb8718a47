"""The disk threads of a broker's rounds (laminar.server.disk_threads): a round's jobs run
concurrently (their fdatasyncs share journal commits), the round's one future resolves only
when every job has finished, with the first error, and closing finishes what was handed over.
A log write that needs no roll runs on threads without the GIL (a DirectWrite), on real
files."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from laminar.log import FileDirectory, LogConfig, SegmentedLog, StorageError
from laminar.log.segment import STORE_SUFFIX
from laminar.log.storage import DirectWrite, FileStorage, OpenFiles
from laminar.server.disk_threads import DiskThreads

from ..log.helpers import make_batch, read_records

WAIT_S = 30.0


async def test_a_rounds_jobs_run_at_once_and_its_future_waits_for_all() -> None:
    threads = DiskThreads(3, "disk-test")
    together = threading.Barrier(3, timeout=WAIT_S)  # broken (an error) unless all 3 run at once
    release = threading.Event()
    two_finished = threading.Event()
    finished: list[int] = []

    def job(i: int) -> None:
        together.wait()
        if i == 2:
            release.wait(WAIT_S)
        finished.append(i)
        if len(finished) == 2:
            two_finished.set()

    try:
        batch = threads.run([lambda i=i: job(i) for i in range(3)])
        loop = asyncio.get_running_loop()
        # two finished, the third holds: the round's future cannot have resolved
        assert await loop.run_in_executor(None, two_finished.wait, WAIT_S)
        await asyncio.sleep(0)  # (a resolution handed to the loop would run here)
        assert not batch.done()
        release.set()
        await asyncio.wait_for(batch, WAIT_S)
        assert sorted(finished) == [0, 1, 2]
        assert await threads.run([]) is None  # nothing to do: done at once
    finally:
        threads.close()


async def test_the_first_error_is_raised_once_every_job_has_finished() -> None:
    threads = DiskThreads(2, "disk-test")
    failed = threading.Event()
    finished: list[str] = []

    def fails() -> None:
        failed.set()
        raise OSError(5, "Input/output error")

    def slow() -> None:
        failed.wait(WAIT_S)
        finished.append("slow")

    try:
        with pytest.raises(OSError, match="Input/output error"):
            await asyncio.wait_for(threads.run([fails, slow]), WAIT_S)
        assert finished == ["slow"]  # (it finished before the error reached the round)
        await asyncio.wait_for(threads.run([lambda: finished.append("after")]), WAIT_S)
        assert finished == ["slow", "after"]  # the threads go on after an error
    finally:
        threads.close()


async def test_close_finishes_every_job_handed_over_even_if_its_round_was_cancelled() -> None:
    threads = DiskThreads(1, "disk-test")
    release = threading.Event()
    finished: list[int] = []

    def job(i: int) -> None:
        release.wait(WAIT_S)
        finished.append(i)

    batch = threads.run([lambda i=i: job(i) for i in range(3)])
    batch.cancel()  # as `stop` cancels a round awaiting its disk work
    release.set()
    await asyncio.get_running_loop().run_in_executor(None, threads.close)
    assert finished == [0, 1, 2]
    with pytest.raises(RuntimeError, match="closed"):
        threads.run([lambda: None])


# ---- DirectWrites: the threads without the GIL (laminar.log._disk) -------------------------


def small_log(path: Path) -> SegmentedLog:
    return SegmentedLog.open(FileDirectory(str(path)), LogConfig(segment_bytes=4096))


async def test_a_log_write_runs_without_the_gil_and_reads_back_after_a_restart(
    tmp_path: Path,
) -> None:
    log = small_log(tmp_path)
    log.append(make_batch(0), term=1)
    before = log.next_index
    write = log.begin_write([(make_batch(tag), 2) for tag in range(1, 6)])
    job = write.direct(sync=True)
    assert isinstance(job, DirectWrite) and len(job.writes) == 5
    threads = DiskThreads(2, "disk-test")
    try:
        await asyncio.wait_for(threads.run([job]), WAIT_S)
        assert not job.storage.holds_descriptor or job.storage._pins == 0
        write.publish()
        assert log.next_index == before + 5 * 3 and log.term_at(before) == 2
        records = read_records(log)
        log.close()
        reopened = small_log(tmp_path)  # what it wrote is on disk, whole
        assert reopened.recovery.cuts == () and read_records(reopened) == records
        assert [v for _, v in records][-1] == b"5.2".ljust(20, b".")
        reopened.close()
    finally:
        threads.unwatch()
        threads.close()


async def test_a_broker_stopping_with_a_direct_write_in_flight_finishes_it_whole(
    tmp_path: Path,
) -> None:
    """As `Broker.stop` does: the round awaiting the write is cancelled, the loop stops
    watching, and closing the threads runs the write to its end (not unpublished halfway,
    nor its descriptor closed under it). Its round never hears of it, so nothing was
    acknowledged; the log reopens with the batches whole, as entries Raft may keep or cut."""
    log = small_log(tmp_path)
    log.append(make_batch(0), term=1)
    before = log.next_index
    write = log.begin_write([(make_batch(tag), 2) for tag in range(1, 6)])
    job = write.direct(sync=True)
    assert job is not None
    threads = DiskThreads(1, "disk-test")
    round_ = threads.run([job])  # handed to the pool: queued or being written now
    round_.cancel()
    threads.unwatch()
    await asyncio.get_running_loop().run_in_executor(None, threads.close)
    assert job.storage._pins == 0  # finished: unpinned
    assert log.next_index == before  # unpublished: no round took it
    write.discard()
    log.close()
    reopened = small_log(tmp_path)
    assert reopened.recovery.cuts == ()  # whole: nothing torn to cut
    assert reopened.next_index == before + 5 * 3 and reopened.term_at(before) == 2
    assert [v for _, v in read_records(reopened)][-1] == b"5.2".ljust(20, b".")
    reopened.close()


def test_a_write_that_rolls_a_segment_is_left_to_the_python_threads(tmp_path: Path) -> None:
    log = small_log(tmp_path)
    write = log.begin_write([(make_batch(tag), 1) for tag in range(200)])  # > 4 KiB
    assert write.direct(sync=True) is None  # nothing pinned, nothing changed
    write.run(sync=True)
    write.publish()
    assert log.next_index == 600 and len(log.segment_base_indexes) > 1
    log.close()


async def test_a_refused_write_fails_the_round_with_the_storage_error_and_changes_nothing(
    tmp_path: Path,
) -> None:
    log = small_log(tmp_path)
    log.append(make_batch(0), term=1)
    size = log.size_bytes
    write = log.begin_write([(make_batch(1), 1)])
    job = write.direct(sync=True)
    assert job is not None
    # the kernel refuses writes on a descriptor opened read-only (EBADF)
    segment_path = sorted(tmp_path.glob(f"*{STORE_SUFFIX}"))[-1]
    read_only = os.open(segment_path, os.O_RDONLY)
    job.fd = read_only
    threads = DiskThreads(1, "disk-test")
    try:
        with pytest.raises(StorageError, match=r"write to .* failed: \[Errno 9\]"):
            await asyncio.wait_for(threads.run([job]), WAIT_S)
        assert log.size_bytes == size and log.next_index == 3  # unpublished
        assert job.storage._pins == 0
    finally:
        os.close(read_only)
        threads.unwatch()
        threads.close()
        write.discard()
        log.close()


def test_a_storage_in_use_by_a_direct_write_keeps_its_descriptor(tmp_path: Path) -> None:
    files = OpenFiles(1)
    first = FileStorage(str(tmp_path / "a"), create=True, files=files)
    job = first.direct([(0, [b"abc"])], sync=False)
    second = FileStorage(str(tmp_path / "b"), create=True, files=files)  # over the budget
    assert first.holds_descriptor  # pinned: not evicted
    first.close()
    assert first.holds_descriptor  # closed only once the write is finished
    os.pwrite(job.fd, b"abc", 0)  # (what the pool's thread does)
    assert job.finish(0, -1) is None
    assert not first.holds_descriptor and (tmp_path / "a").read_bytes() == b"abc"
    second.close()


async def test_the_pools_threads_never_preempt_the_loop_that_hands_them_work(
    tmp_path: Path,
) -> None:
    """They run as SCHED_BATCH from the moment the pool is handed its first job: a woken one
    waits for an idle CPU, or for the event loop's thread to wait, instead of taking that
    thread's CPU at every job it is handed. They are looked at before any of them could run
    (this thread, and the threads it starts, on one CPU): a thread that set its own policy
    when it first ran was still SCHED_NORMAL then (CI62 saw one so, under load)."""
    before = set(os.listdir("/proc/self/task"))
    threads = DiskThreads(2, "disk-test")
    storage = FileStorage(str(tmp_path / "f"), create=True, files=OpenFiles(4))
    affinity = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(affinity)})  # this thread's; the pool's threads inherit it
        try:
            running = threads.run([storage.direct([(0, [b"abc"])], sync=True)])
            started = [int(t) for t in set(os.listdir("/proc/self/task")) - before]
            policies = [os.sched_getscheduler(t) for t in started]
        finally:
            os.sched_setaffinity(0, affinity)
        await asyncio.wait_for(running, WAIT_S)
        assert len(started) == 2  # the pool's
        assert policies == [os.SCHED_BATCH] * 2
        assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the loop's own is untouched
    finally:
        threads.unwatch()
        threads.close()
        storage.close()


async def test_jobs_run_in_turn_one_at_a_time_and_an_error_ends_the_rest_unrun(
    tmp_path: Path,
) -> None:
    """A journal checkpoint's log syncs (`Broker._beside`): each starts once the one before
    has finished; after a failure the others are not run, and their descriptors are let go."""
    threads = DiskThreads(4, "disk-test")
    running: list[int] = []
    order: list[int] = []
    overlapped = threading.Event()

    def job(i: int) -> None:
        running.append(i)
        if len(running) > 1:
            overlapped.set()
        order.append(i)
        running.remove(i)

    def fails() -> None:
        raise StorageError("fdatasync failed")

    try:
        await asyncio.wait_for(threads.run_in_turn([lambda i=i: job(i) for i in range(6)]), WAIT_S)
        assert order == list(range(6)) and not overlapped.is_set()
        storage = FileStorage(str(tmp_path / "f"), create=True)
        left = storage.direct([(0, [b"abc"])], sync=True)
        assert left is not None and storage._pins == 1
        with pytest.raises(StorageError, match="fdatasync failed"):
            await asyncio.wait_for(threads.run_in_turn([fails, left]), WAIT_S)
        assert storage._pins == 0 and storage.size == 0  # unrun: nothing written
        storage.close()
    finally:
        threads.close()


async def test_jobs_run_in_turn_a_few_at_a_time_and_an_error_waits_for_those_running(
    tmp_path: Path,
) -> None:
    """A checkpoint of many logs syncs them `width` at a time (`Broker._beside`): never more at
    once, all of them; after a failure the ones running are waited for, and a DirectWrite
    still waiting lets its descriptor go (run or not, as the lanes met the failure)."""
    threads = DiskThreads(8, "disk-test")
    lock = threading.Lock()
    running: list[int] = []
    most = [0]
    ran: list[int] = []
    wave = threading.Barrier(3, timeout=WAIT_S)  # each wave of 3 must run at once

    def job(i: int) -> None:
        with lock:
            running.append(i)
            most[0] = max(most[0], len(running))
        if i < 9:
            wave.wait()
        with lock:
            running.remove(i)
            ran.append(i)

    failing = threading.Event()

    def fails() -> None:
        failing.set()
        raise StorageError("fdatasync failed")

    def slow(i: int) -> None:
        assert failing.wait(WAIT_S)
        job(i)

    try:
        jobs = [lambda i=i: job(i) for i in range(9)]
        await asyncio.wait_for(threads.run_in_turn(jobs, 3), WAIT_S)
        assert sorted(ran) == list(range(9)) and most[0] == 3
        ran.clear()
        storage = FileStorage(str(tmp_path / "f"), create=True)
        left = storage.direct([(0, [b"abc"])], sync=True)
        assert left is not None and storage._pins == 1
        with pytest.raises(StorageError, match="fdatasync failed"):
            await asyncio.wait_for(threads.run_in_turn([fails, lambda: slow(100), left], 2), WAIT_S)
        assert ran == [100] and not running  # the one running when it failed finished
        assert storage._pins == 0
        storage.close()
        with pytest.raises(ValueError, match="width"):
            await threads.run_in_turn(jobs, 0)
    finally:
        threads.close()


async def test_a_sync_with_writeback_writes_back_what_was_written_since_the_last_sync(
    tmp_path: Path,
) -> None:
    """`FileStorage.direct(writeback=True)`: the range written since the last sync (known to
    the storage as a hint) is written back in pieces before the fdatasync, by the pool."""
    storage = FileStorage(str(tmp_path / "f"), create=True)
    threads = DiskThreads(2, "disk-test")
    megabyte = b"x" * (1 << 20)
    try:
        storage.write(0, [megabyte])
        job = storage.direct([(1 << 20, [b"tail"])], sync=True, writeback=True)
        assert job is not None and job.writeback == (0, 1 << 20)
        await asyncio.wait_for(threads.run([job]), WAIT_S)
        assert storage._synced_to == storage.size == (1 << 20) + 4  # its own write too
        idle = storage.direct([], sync=True, writeback=True)
        assert idle is not None and idle.writeback is None  # nothing written since
        assert idle.finish(0, -1) is None
        storage.write(storage.size, [b"more"])
        storage.truncate(100)  # a cut lowers the hint with the size
        storage.write(100, [megabyte])
        job = storage.direct([], sync=True, writeback=True)
        assert job is not None and job.writeback == (100, 100 + (1 << 20))
        await asyncio.wait_for(threads.run([job]), WAIT_S)
        assert storage._synced_to == 100 + (1 << 20)
        assert os.path.getsize(tmp_path / "f") == 100 + (1 << 20)
        plain = storage.direct([], sync=False, writeback=True)
        assert plain is not None and plain.writeback is None  # no sync: no write-back
        assert plain.finish(0, -1) is None
    finally:
        threads.unwatch()
        threads.close()
        storage.close()


def test_the_pool_refuses_a_writeback_without_a_chunk() -> None:
    from laminar.log._disk import Pool

    pool = Pool(1)
    try:
        with pytest.raises(ValueError, match="write-back"):
            pool.submit(1, 0, [], True, 0, 4096, 0)
        with pytest.raises(ValueError, match="write-back"):
            pool.submit(1, 0, [], True, -1, 4096, 4096)
        assert pool.outstanding() == 0
    finally:
        pool.stop()
