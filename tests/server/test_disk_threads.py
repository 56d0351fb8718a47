"""The disk threads of a broker's rounds (laminar.server.disk_threads): a round's jobs run
concurrently (their fdatasyncs share journal commits), the round's one future resolves only
when every job has finished, with the first error, and closing finishes what was handed over."""

from __future__ import annotations

import asyncio
import threading

import pytest

from laminar.server.disk_threads import DiskThreads

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
