"""A wake-up for coroutines waiting on "something changed" (a commit, an applied command)."""

from __future__ import annotations

import asyncio


class Signal:
    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        """Wake every coroutine waiting now."""
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    async def wait(self, timeout_s: float) -> bool:
        """Return after the next `notify` (True) or after `timeout_s` (False)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await asyncio.wait_for(future, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            if future in self._waiters:
                self._waiters.remove(future)
