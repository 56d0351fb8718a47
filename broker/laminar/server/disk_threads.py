"""The threads that run a round's disk work (log writes, fdatasyncs, hard-state saves) off the
event loop, with one wake-up of the loop per round.

A round hands over a batch of jobs, one per storage (`Broker._round`). They run concurrently,
because concurrent fdatasyncs of different logs share the file system's journal commits, and
the loop awaits the batch as one future, resolved once its last job finished.
`concurrent.futures.ThreadPoolExecutor` with `asyncio.wrap_future` cost a future, a condition
and a loop wake-up per job, which profiles of a busy broker showed at 6-8 % of a round
(bench/RESULTS.md, issue 22).

A job is a callable, run by a Python thread, or a `DirectWrite` (a file's writes and
fdatasync as a descriptor and buffers), run by a thread of `laminar.log._disk` that never
takes the GIL: a Python thread took it to start each job and to report it done, and a busy
loop hands it over only at its switch interval. Those threads report on an eventfd the loop
watches; a DirectWrite is finished (`DirectWrite.finish`) on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Sequence

from ..log._disk import Pool
from ..log.storage import WRITEBACK_CHUNK_BYTES, DirectWrite


class _Batch:
    """The jobs of one round: the last to finish resolves `future` on its loop."""

    __slots__ = ("error", "future", "left", "lock", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, jobs: int) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.left = jobs
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def _count(self, error: BaseException | None) -> bool:
        """One job finished (with `error`); whether it was the last."""
        with self.lock:
            if error is not None and self.error is None:
                self.error = error
            self.left -= 1
            return self.left == 0

    def done_one(self, error: BaseException | None) -> None:
        """A job finished, on a Python thread."""
        if self._count(error):
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                self.loop.call_soon_threadsafe(self._resolve)

    def done_on_loop(self, error: BaseException | None) -> None:
        """A job finished, seen on the loop."""
        if self._count(error):
            self._resolve()

    def _resolve(self) -> None:
        if self.future.done():  # cancelled: the round was (stop waits in `close` instead)
            return
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(None)


_Job = tuple[_Batch, Callable[[], None]] | None


class DiskThreads:
    """`threads` Python threads and as many without the GIL, started on first use, running
    batches of jobs (`run`)."""

    def __init__(self, threads: int, name: str) -> None:
        self._count = threads
        self._name = name
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._pool: Pool | None = None
        #: DirectWrites handed to the pool, by token: their batch and themselves
        self._direct: dict[int, tuple[_Batch, DirectWrite]] = {}
        self._tokens = 0
        self._loop: asyncio.AbstractEventLoop | None = None  # watching the pool's eventfd

    def run(self, jobs: Sequence[DirectWrite | Callable[[], None]]) -> asyncio.Future[None]:
        """Start `jobs` in the threads; the future resolves when every one of them has
        finished, with the first error raised among them (none is left running then)."""
        if self._closed:
            raise RuntimeError(f"{self._name}: closed")
        batch = _Batch(asyncio.get_running_loop(), len(jobs))
        if not jobs:
            batch.future.set_result(None)
            return batch.future
        for job in jobs:
            if isinstance(job, DirectWrite):
                self._submit(batch, job)
                continue
            if not self._threads:
                self._start()
            self._jobs.put((batch, job))
        return batch.future

    async def run_in_turn(
        self, jobs: Sequence[DirectWrite | Callable[[], None]], width: int = 1
    ) -> None:
        """Run `jobs` in order, at most `width` at a time (each started once one before has
        finished), raising the first error: the jobs not started by then are not run (their
        DirectWrites end unrun); those running are waited for."""
        if width < 1:
            raise ValueError("width must be at least 1")
        waiting = iter(jobs)
        failed: list[BaseException] = []

        async def lane() -> None:
            while not failed and (job := next(waiting, None)) is not None:
                try:
                    await self.run([job])
                except BaseException as e:
                    failed.append(e)

        try:
            lanes = (lane() for _ in range(min(width, len(jobs))))
            await asyncio.gather(*lanes, return_exceptions=True)
        finally:
            for left in waiting:  # not started: let their descriptors go
                if isinstance(left, DirectWrite):
                    left.abandon()
        if failed:
            raise failed[0]

    def _submit(self, batch: _Batch, job: DirectWrite) -> None:
        pool = self._pool
        if pool is None:
            pool = self._pool = Pool(self._count)
            batch.loop.add_reader(pool.fileno(), self._collect)
            self._loop = batch.loop
        self._tokens += 1
        try:
            if job.writeback is None:
                pool.submit(self._tokens, job.fd, job.writes, job.sync)
            else:
                start, end = job.writeback
                pool.submit(
                    self._tokens, job.fd, job.writes, job.sync, start, end, WRITEBACK_CHUNK_BYTES
                )
        except BaseException as e:  # (refused whole: nothing of it ran)
            job.abandon()
            batch.done_on_loop(e)
            return
        self._direct[self._tokens] = (batch, job)

    def _collect(self) -> None:
        """The pool reported finished DirectWrites: finish each, and count it in its batch."""
        assert self._pool is not None
        for token, error, failed in self._pool.collect():
            batch, job = self._direct.pop(token)
            batch.done_on_loop(job.finish(error, failed))

    def unwatch(self) -> None:
        """Stop watching for finished DirectWrites (on the loop, before `close`)."""
        if self._pool is not None and self._loop is not None:
            self._loop.remove_reader(self._pool.fileno())
            self._loop = None

    def close(self) -> None:
        """Finish every job handed over, then stop the threads (blocks until they end). The
        DirectWrites are finished here (unpinned, and made ready to publish if they succeeded),
        but no round hears of it: their rounds are over. Off the loop, after `unwatch`."""
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
        self._threads.clear()
        if self._pool is not None:
            self._pool.stop()
            for token, error, failed in self._pool.collect():
                self._direct.pop(token)[1].finish(error, failed)

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
