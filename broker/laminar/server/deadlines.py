"""Waits that share one timeout, without a timer each: `asyncio.wait_for(asyncio.shield(f), t)`
for the hot paths (an append waiting for its commit, a queue command for its answer).

`wait_for` makes a timer, a waiter and callbacks for every call, and `shield` an outer future:
with one record per request, they and the body's read timer held 14 % of the event loop's
samples (bench/RESULTS.md, issue 22). Every wait here has the same timeout, so deadlines come
in the order the waits started: they sit in one queue, and a single timer, set for the
oldest, expires them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from functools import partial
from typing import Any, TypeVar

T = TypeVar("T")
#: the queue drops its finished waits when it grows to twice its length after the last time
#: (a wait that lasts, ahead of many short ones, must not keep their entries alive): it holds
#: at most twice the most waits ever in progress at once, at O(1) amortized per wait
COMPACT_MIN = 64


class Deadlines:
    """Waits of `timeout_s` each on futures nobody may cancel (one per event loop)."""

    def __init__(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s={timeout_s} must be positive")
        self.timeout_s = timeout_s
        #: (deadline on the loop's clock, the waiter): deadlines never decrease along it
        self._queue: deque[tuple[float, asyncio.Future[Any]]] = deque()
        self._compact_at = COMPACT_MIN
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        """Waits held: those in progress, and finished ones not dropped yet."""
        return len(self._queue)

    async def wait(self, future: asyncio.Future[T]) -> T:
        """`future`'s outcome, or TimeoutError once `timeout_s` passed. `future` is never
        cancelled: not by the timeout, nor when the caller is (as `shield`)."""
        if future.done():
            return future.result()
        return await self.watch(future)  # (a cancelled caller cancels the waiter, not `future`)

    def watch(self, future: asyncio.Future[T]) -> asyncio.Future[T]:
        """A future of `future`'s outcome, or of TimeoutError once `timeout_s` passed; it is
        resolved by a callback, never before this returns. Cancelling it leaves `future` be."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[T] = loop.create_future()
        future.add_done_callback(partial(Deadlines._relay, waiter))
        deadline = loop.time() + self.timeout_s
        queue = self._queue
        while queue and queue[0][1].done():
            queue.popleft()
        queue.append((deadline, waiter))
        if len(queue) >= self._compact_at:
            self._queue = deque(entry for entry in queue if not entry[1].done())
            self._compact_at = max(COMPACT_MIN, 2 * len(self._queue))
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        return waiter

    @staticmethod
    def _relay(waiter: asyncio.Future[T], future: asyncio.Future[T]) -> None:
        if waiter.done():
            return  # timed out, or its caller was cancelled
        if future.cancelled():
            waiter.cancel()
        elif (error := future.exception()) is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(future.result())

    def _expire(self) -> None:
        self._timer = None
        queue = self._queue
        now = asyncio.get_running_loop().time()
        while queue and (queue[0][1].done() or queue[0][0] <= now):
            _, waiter = queue.popleft()
            if not waiter.done():
                waiter.set_exception(TimeoutError())
        if queue:
            self._timer = asyncio.get_running_loop().call_at(queue[0][0], self._expire)

    def close(self) -> None:
        """Stop the timer (the waits still in progress never time out)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
