"""The threads that run a round's disk work (log writes, fdatasyncs, hard-state saves) off the
event loop, with one wake-up of the loop per round.

A round hands over a batch of jobs, one per storage (`Broker._round`). They run concurrently
on a few threads, because concurrent fdatasyncs of different logs share the file system's
journal commits, and the loop awaits the batch as one future, resolved once by the thread that
finished its last job. `concurrent.futures.ThreadPoolExecutor` with `asyncio.wrap_future` cost
a future, a condition and a loop wake-up per job, which profiles of a busy broker showed at
6-8 % of a round (bench/RESULTS.md, issue 22).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Sequence


class _Batch:
    """The jobs of one round: the last to finish resolves `future` on its loop."""

    __slots__ = ("error", "future", "left", "lock", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, jobs: int) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.left = jobs
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def done_one(self, error: BaseException | None) -> None:
        with self.lock:
            if error is not None and self.error is None:
                self.error = error
            self.left -= 1
            last = self.left == 0
        if last:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                self.loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if self.future.done():  # cancelled: the round was (stop waits in `close` instead)
            return
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(None)


_Job = tuple[_Batch, Callable[[], None]] | None


class DiskThreads:
    """`threads` threads, started on first use, running batches of jobs (`run`)."""

    def __init__(self, threads: int, name: str) -> None:
        self._count = threads
        self._name = name
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def run(self, jobs: Sequence[Callable[[], None]]) -> asyncio.Future[None]:
        """Start `jobs` in the threads; the future resolves when every one of them has
        finished, with the first error raised among them (none is left running then)."""
        if self._closed:
            raise RuntimeError(f"{self._name}: closed")
        batch = _Batch(asyncio.get_running_loop(), len(jobs))
        if not jobs:
            batch.future.set_result(None)
            return batch.future
        if not self._threads:
            self._start()
        for job in jobs:
            self._jobs.put((batch, job))
        return batch.future

    def close(self) -> None:
        """Finish every job handed over, then stop the threads (blocks until they end)."""
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
        self._threads.clear()

    def _start(self) -> None:
        for i in range(self._count):
            # daemons: a broker that was never stopped must not hold the interpreter's exit
            # (nothing it acknowledged depends on a job still running then)
            thread = threading.Thread(target=self._work, name=f"{self._name}_{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            batch, call = job
            try:
                call()
            except BaseException as e:  # handed to the loop, as the executor's future did
                batch.done_one(e)
            else:
                batch.done_one(None)
