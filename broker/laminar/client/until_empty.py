"""Where `laminar queue consume` ends without `--follow`: once every message that existed
when it started is taken or settled.

`laminar consume` ends at the commit index each partition had when it started (its `ends`):
what exists then is read, nothing is waited for. `queue consume` ends at the same indexes: a
partition is done once an acquire of it finds nothing after its leader's group state has
applied the log up to its end (`end_index` of `describe_group`; an acquire that finds nothing
before then may just have come before the leader applied records committed a moment earlier).
Every message below the end is then held (by this consumer or another), settled, or
dead-lettered; one that comes free again makes its partition not done. The `EmptyWatch`
transport sees the acquires a `GroupConsumer` makes (acquiring without a long poll,
`wait_ms=0`, so an empty answer comes at once) and sets `ended` once every partition is done;
`until_end` hands out the deliveries acquired before that moment, and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from .client import AsyncClient
from .group import Delivery, GroupConsumer
from .models import Acquired


class EmptyWatch:
    """`client` as a GroupConsumer's transport (laminar.client.group.GroupTransport) that sets
    `ended` once every partition of `ends` (partition -> one past its last index at the start)
    is done: an acquire found nothing after its leader had applied the log up to the end."""

    def __init__(self, client: AsyncClient, ends: Mapping[int, int]) -> None:
        self._client = client
        self._ends = dict(ends)
        self._applied: set[int] = set()  # partitions whose leader applied up to their end
        self._done: set[int] = set()  # partitions whose latest acquire found nothing, applied
        self.ended = asyncio.Event()

    async def acquire(
        self,
        topic: str,
        partition: int,
        group: str,
        *,
        consumer: str | None = None,
        max_messages: int = 1,
        lease_ms: int = 1,
        wait_ms: int = 0,
        max_bytes: int | None = None,
    ) -> Acquired:
        acquired = await self._client.acquire(
            topic,
            partition,
            group,
            consumer=consumer,
            max_messages=max_messages,
            lease_ms=lease_ms,
            wait_ms=wait_ms,
            max_bytes=max_bytes,
        )
        if acquired.messages:
            self._done.discard(partition)
        elif partition in self._applied:
            self._done.add(partition)
            if self._done >= self._ends.keys():
                self.ended.set()
        else:
            # found nothing: was everything up to the end applied? (If so, the next acquire
            # that finds nothing ends the partition: this one may have come before.)
            described = await self._client.describe_group(topic, partition, group)
            if described.end_index >= self._ends.get(partition, 0):
                self._applied.add(partition)
        return acquired

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)  # settling, describing: the client's own calls


async def until_end(
    consumer: GroupConsumer, watch: EmptyWatch | None
) -> AsyncGenerator[Delivery, None]:
    """`consumer`'s deliveries; with `watch`, only until its end: the deliveries acquired
    before the end are handed out, then iteration stops (closing the consumer releases any
    acquired after it). Without `watch`: until the consumer's own end (its limit, or never)."""
    iterator = aiter(consumer)
    ended: asyncio.Future[Any] | None = None
    if watch is not None:
        ended = asyncio.ensure_future(watch.ended.wait())
    getter: asyncio.Future[Delivery] | None = None
    try:
        while True:
            if getter is None:
                getter = asyncio.ensure_future(anext(iterator))
            if ended is None:
                await asyncio.wait({getter})
            elif not ended.done():
                either: set[asyncio.Future[Any]] = {getter, ended}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            else:
                # The end was seen. A delivery acquired before it is handed out in the
                # getter's first step, which runs before this task resumes (the event loop
                # runs ready callbacks in order): one yield tells "ready now" from "waits".
                await asyncio.sleep(0)
                if not getter.done():
                    return
            if getter.done():
                done, getter = getter, None
                try:
                    delivery = done.result()
                except StopAsyncIteration:
                    return
                yield delivery
    finally:
        pending: list[asyncio.Future[Any]] = [f for f in (getter, ended) if f is not None]
        for future in pending:
            if not future.done():
                future.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await future
