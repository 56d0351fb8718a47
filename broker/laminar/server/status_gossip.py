"""The partition status table's I/O (laminar.partition.status_table): this broker's report
published to its peers over the peer transport, and theirs merged as they arrive.

Every CHECK_INTERVAL_S the broker compares the structure of what it hosts (groups, roles,
leaders, terms, configurations, in-sync sets; `NodeCore.hosted_structure`, which looks only
at the groups that took an input since) with what it last published: a change is published
at once, anything else at least every REFRESH_MS, so that a lost report heals. A report is
one node-level STATUS message to each alive peer (`index`: the report's version; one entry:
the compressed rows).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from ..partition import status_table
from ..partition.signal import Signal
from ..partition.status_table import ReportError, Row, StatusPublisher, StatusTable
from ..raft.messages import Message, MessageType

if TYPE_CHECKING:
    from .node import Broker

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 0.1
WARNING_INTERVAL_S = 60.0


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class StatusGossip:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.table = StatusTable()
        # versions grow across restarts too: microseconds of the wall clock at start, then +1
        self.publisher = StatusPublisher(broker.id, time.time_ns() // 1_000)
        self._warned = 0.0
        #: notified whenever a newer report is merged
        self._merged = Signal()
        self._refreshing: asyncio.Future[None] | None = None

    def view(self, max_age_ms: int = status_table.STALE_MS) -> dict[str, list[Row]]:
        """Every alive member's hosted replicas: this broker's live, the others' reports no
        older than `max_age_ms`."""
        return {self.broker.id: self.broker.core.hosted(), **self.peers_view(max_age_ms)}

    def peers_view(self, max_age_ms: int = status_table.STALE_MS) -> dict[str, list[Row]]:
        """`view` without this broker's own rows (which cost a look at every replica)."""
        broker = self.broker
        view = self.table.view(broker.core.alive(), _now_ms(), max_age_ms)
        view.pop(broker.id, None)
        return view

    def on_message(self, message: Message) -> None:
        """A peer's STATUS message: its report, or (no entry) its request for this one's."""
        if status_table.is_request(message):
            self.publish(force=True, only=message.src)
            return
        try:
            merged = self.table.receive(message, _now_ms())
        except ReportError as e:
            self.broker.core.counters["bad_status_reports"] += 1
            now = time.monotonic()
            if now - self._warned >= WARNING_INTERVAL_S:
                self._warned = now
                log.warning("status report from %s ignored: %s", message.src, e)
            return
        if merged:
            self._merged.notify()

    async def merged(self, timeout_s: float) -> bool:
        """Wait for the next newer report of any peer (False: none within `timeout_s`)."""
        return await self._merged.wait(timeout_s)

    async def refresh(self, timeout_s: float) -> None:
        """Ask every alive peer for its report now, and wait (up to `timeout_s`) until each
        has sent one: what `GET /v1/topics/{t}` shows is then as fresh as a round trip. One
        refresh at a time: callers meanwhile share it (requests cannot multiply the reports
        peers send)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh(timeout_s))
        await asyncio.shield(self._refreshing)

    async def _refresh(self, timeout_s: float) -> None:
        broker = self.broker
        peers = sorted(broker.core.alive() - {broker.id})
        if not peers:
            return
        before = {peer: self.table.version_of(peer) for peer in peers}
        broker.send(Message(MessageType.STATUS, "", broker.id, peer, 0) for peer in peers)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while any(self.table.version_of(p) == before[p] for p in peers):
            remaining = deadline - loop.time()
            if remaining <= 0 or not await self._merged.wait(remaining):
                return  # a peer that does not answer: its last report stands

    def forget(self, node: str) -> None:
        self.table.forget(node)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_INTERVAL_S)
            try:
                self.publish()
            except Exception:  # a bug here must not stop the broker; the next round retries
                log.exception("publishing the status report failed")

    def publish(self, *, force: bool = False, only: str | None = None) -> bool:
        """Send this broker's report to every alive peer if it changed, or is due (`force`:
        now; `only`: to that peer alone, which asked for it)."""
        core = self.broker.core
        now = _now_ms()
        if only is not None:
            shape = None
            peers = [only] if only in core.alive() else []
        else:
            shape = core.hosted_structure()
            if not (force or self.publisher.due(shape, now)):
                return False
            peers = sorted(core.alive() - {core.id})
        # unchanged since the last report (no input to any group hosted): its bytes again
        reuse = None if only is not None else core.hosted_changes
        messages = self.publisher.publish(shape, core.hosted, peers, now, reuse=reuse)
        self.broker.send(messages)
        return bool(messages)
