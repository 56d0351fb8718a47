"""`Deadlines`: the one-timer stand-in for `wait_for(shield(future), timeout)`, on a loop whose
clock the test moves (a wait expires only when the test says its time has come)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from laminar.server.deadlines import COMPACT_MIN, Deadlines


class _Clock(asyncio.SelectorEventLoop):
    """A loop whose time moves only when the test advances it."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0

    def time(self) -> float:
        return self.now


def _run(test: Callable[[_Clock], Coroutine[Any, Any, None]]) -> None:
    loop = _Clock()
    try:
        loop.run_until_complete(test(loop))
    finally:
        loop.close()


async def _turns(n: int = 5) -> None:
    """Let every callback that is due run (the test never blocks on the real clock)."""
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_wait_gives_the_futures_outcome() -> None:
    async def test(loop: _Clock) -> None:
        deadlines = Deadlines(10.0)
        done, failed = loop.create_future(), loop.create_future()
        waits = [loop.create_task(deadlines.wait(f)) for f in (done, failed)]
        await _turns()
        done.set_result(7)
        failed.set_exception(LookupError("gone"))
        assert await waits[0] == 7
        with pytest.raises(LookupError, match="gone"):
            await waits[1]
        ready = loop.create_future()
        ready.set_result(3)
        assert await deadlines.wait(ready) == 3  # finished already: no wait at all
        deadlines.close()

    _run(test)


def test_a_wait_times_out_at_its_own_deadline_and_leaves_the_future_alone() -> None:
    async def test(loop: _Clock) -> None:
        deadlines = Deadlines(10.0)
        first, second = loop.create_future(), loop.create_future()
        wait_first = loop.create_task(deadlines.wait(first))
        await _turns()
        loop.now += 4
        wait_second = loop.create_task(deadlines.wait(second))
        await _turns()
        loop.now += 6  # the first's deadline; the second has 4 s to go
        await _turns()
        assert wait_first.done() and not wait_second.done()
        with pytest.raises(TimeoutError):
            await wait_first
        assert not first.done()  # a timeout never cancels what was waited on
        first.set_result(1)  # (it may still finish: an append that commits late)
        loop.now += 3.9
        await _turns()
        assert not wait_second.done()
        loop.now += 0.1
        await _turns()
        assert wait_second.done()
        with pytest.raises(TimeoutError):
            await wait_second
        assert len(deadlines) == 0
        deadlines.close()

    _run(test)


def test_a_cancelled_caller_does_not_cancel_the_future() -> None:
    async def test(loop: _Clock) -> None:
        deadlines = Deadlines(10.0)
        future = loop.create_future()
        waiting = loop.create_task(deadlines.wait(future))
        await _turns()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not future.cancelled()
        future.set_result(1)  # relayed to nobody: the waiter is gone
        await _turns()
        loop.now += 20  # its deadline passes with nothing left to expire
        await _turns()
        assert len(deadlines) == 0
        deadlines.close()

    _run(test)


def test_finished_waits_behind_a_long_one_are_not_kept() -> None:
    async def test(loop: _Clock) -> None:
        deadlines = Deadlines(10.0)
        stuck = loop.create_future()  # e.g. a partition without a quorum
        long_wait = loop.create_task(deadlines.wait(stuck))
        await _turns()
        held = []
        for n in range(20 * COMPACT_MIN):  # short waits, each done before the next starts
            future = loop.create_future()
            short = loop.create_task(deadlines.wait(future))
            await _turns(1)
            future.set_result(n)
            assert await short == n
            held.append(len(deadlines))
        assert max(held) <= 2 * COMPACT_MIN  # not 20 * COMPACT_MIN: compacted as it grew
        loop.now += 10
        await _turns()
        assert long_wait.done()
        with pytest.raises(TimeoutError):
            await long_wait
        deadlines.close()

    _run(test)


def test_the_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Deadlines(0)
