"""What HTTP handlers wait for from the node core: an admin command applied, the metadata
applied up to an index, a metadata barrier passed. The core answers in its rounds
(`Round.answers`, `Round.barriers`); this turns those answers into finished futures."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..metadata import Command, MetadataError
from ..node.core import NodeCore, Round
from ..partition.errors import NotLeader
from ..partition.signal import Signal


class CoreWaits:
    def __init__(self, core: NodeCore, wake: Callable[[], None]) -> None:
        self.core = core
        self.wake = wake
        self._proposals: dict[int, tuple[int, asyncio.Future[MetadataError | None]]] = {}
        self._barriers: dict[int, asyncio.Future[None]] = {}
        #: notified whenever the core's meta_applied_index advances
        self.meta_advanced = Signal()
        self._applied = core.meta_applied_index

    def answer(self, round_: Round) -> None:
        """Finish what `round_` answered."""
        for index, term, result in round_.answers:
            waiter = self._proposals.pop(index, None)
            if waiter is not None and not waiter[1].done():
                if waiter[0] == term:
                    waiter[1].set_result(result)
                else:
                    waiter[1].set_exception(NotLeader(self.core.metadata_leader))
        for ticket in round_.barriers:
            future = self._barriers.pop(ticket, None)
            if future is not None and not future.done():
                future.set_result(None)
        if self.core.meta_applied_index != self._applied:
            self._applied = self.core.meta_applied_index
            self.meta_advanced.notify()

    async def propose_metadata(self, command: Command, timeout_s: float) -> int:
        """Commit an admin command through the metadata group (leader only): its index once
        applied here; raises MetadataError (invalid / exists / not_found / fenced / busy),
        NotLeader, ReplicaClosed or TimeoutError."""
        index, term = self.core.propose_metadata(command)
        future: asyncio.Future[MetadataError | None] = asyncio.get_running_loop().create_future()
        self._proposals[index] = (term, future)
        self.wake()
        try:
            result = await asyncio.wait_for(future, timeout_s)
        finally:
            self._proposals.pop(index, None)
            self.core.forget_proposal(index)
        if result is not None:
            raise result
        return index

    async def metadata_applied(self, index: int, timeout_s: float) -> bool:
        """Wait until this node has applied the metadata group up to `index` (False: not
        within `timeout_s`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.core.meta_applied_index < index:
            remaining = deadline - loop.time()
            if remaining <= 0 or not await self.meta_advanced.wait(remaining):
                return False
        return True

    async def metadata_barrier(self, timeout_s: float) -> bool:
        """Wait until this node has applied every metadata entry committed before the call
        (`NodeCore.request_barrier`); False if not confirmed within `timeout_s`."""
        ticket = self.core.request_barrier()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._barriers[ticket] = future
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            self.core.cancel_barrier(ticket)
            return False
        finally:
            self._barriers.pop(ticket, None)
        return True
