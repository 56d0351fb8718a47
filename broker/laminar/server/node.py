"""The broker runtime: the asyncio shell that carries out what the node core decides.

`laminar.node.core.NodeCore` decides everything (Raft groups, metadata, placement, hosting,
repair, barriers). This shell feeds it (peer messages from the transport, ticks from a
timer, SWIM's membership) and carries out each round it returns (`NodeCore.begin`): starts
the round's disk work in worker threads (each storage's log writes, then its fdatasync: the
event loop never writes a log), sends the messages that may go before durability, answers
the waiting admin proposals and metadata barriers, starts dead-letter movers, has the core
publish what was written (`NodeCore.stored`), runs the durable hard-state saves in worker
threads (group commit: proposals arriving meanwhile join the next round), sends the rest,
and calls `finish`. Nothing else changes a log while a round's writes are in flight: the
collection of removed replicas waits for the round's end, and `stop` for its threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from ..client import AsyncClient
from ..credentials import internal_token
from ..log.errors import STORAGE_FAILURES
from ..log.storage import DirectWrite
from ..node.core import Member, NodeCore
from ..node.store import NodeStorage, StorageIdentityError
from ..partition.status_table import View
from ..partition.status_table import leaders as view_leaders
from ..raft.messages import Message, MessageType
from ..swim.address import format_address
from ..swim.member import EventKind, MembershipEvent, MemberState, MemberStatus
from ..tls import CertificateStore, TlsError
from ..workers import broker_of, expand, peer_address, worker_ids
from .config import BrokerConfig, core_config
from .dead_letters import DeadLetterMovers
from .disk_threads import DiskThreads
from .status_gossip import StatusGossip
from .swim_runtime import SwimNode
from .transport import PeerTransport
from .waits import CoreWaits
from .worker_feed import FeedClient, FeedServer

log = logging.getLogger(__name__)
#: threads for a round's disk work: its logs' fdatasyncs run at once, and concurrent ones share
#: the file system's journal commits. A round of an RF 3 broker with 192 partitions syncs up to
#: 192 logs: 16 threads took 4-17 % more appends a second there than 4 did, in five interleaved
#: pairs (bench/RESULTS.md, issue 22, nineteenth sitting). Idle ones cost nothing.
SYNC_THREADS = 16
#: a journal checkpoint beside the rounds syncs its logs a lane each: one lane for every this
#: many logs, up to CHECKPOINT_LANES. One at a time, a checkpoint of 60-200 logs (RF 3, 192
#: partitions) fell behind the rounds, whose ring then filled, and a round checkpointed itself
#: (every log synced at once inside it): the append p99 was 267-384 ms against 216-245 without
#: a journal (bench/RESULTS.md, issue 22, twenty-ninth sitting)
CHECKPOINT_LOGS_A_LANE = 16
CHECKPOINT_LANES = 8
HANDOFF_POLL_S = 0.05
#: how much longer than a handoff's own deadline worker 0 waits for the other workers' answers
FEED_ANSWER_S = 2.0


class BrokerError(Exception):
    pass


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        #: this worker's node id (`laminar.workers`: the broker's id for worker 0)
        self.id = config.raft_id
        #: TLS (config.tls): the contexts of the API, the peer transport and this broker's
        #: own calls to other brokers, reloaded when their files change
        self.tls: CertificateStore | None = None
        if config.tls_files is not None:
            try:
                self.tls = CertificateStore(config.tls_files)
            except TlsError as e:
                raise BrokerError(f"TLS: {e}") from e
        self.core = NodeCore(core_config(config), NodeStorage(config.worker_data_dir), self.members)
        self.core.wake = self.wake
        self._stopping = False
        #: when a handoff's leaving ends (`hand_off_leaderships` with `hold_s`)
        self._leaving_ends: asyncio.TimerHandle | None = None
        #: the partition status table: what every other broker hosts and leads
        self.status = StatusGossip(self)
        self.transport = PeerTransport(
            self.id,
            cluster_id=config.cluster_id,
            secret=config.secret,
            on_messages=self._on_messages,
            tls=self.tls,
        )
        self.swim: SwimNode | None = None
        #: the broker's workers (docs/workers.md): worker 0 serves the others the members
        #: SWIM reports (`feed`); they follow it (`follow`, `_followed`)
        self.feed: FeedServer | None = None
        self.follow: FeedClient | None = None
        self._followed: dict[str, Member] = {}
        #: this worker's metrics as OpenMetrics text (the API sets it; the feed sends it)
        self.render_metrics: Callable[[], str] | None = None
        self.api_addr = format_address(config.public_host, config.worker_api_port)
        self.peer_addr = ""
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        #: the rounds' disk work (`stop` waits for it before closing logs)
        self._disk = DiskThreads(SYNC_THREADS, f"fsync-{self.id}")
        self._in_round = False
        #: leaders' reports of a collection asked for during a round (run at its end)
        self._removals: Mapping[str, Mapping[str, object]] | None = None
        self.waits = CoreWaits(self.core, self.wake)
        self.movers = DeadLetterMovers(self.internal_client)
        self._client: AsyncClient | None = None
        self._running = False
        #: set when storage failed: the process must stop (app.serve exits non-zero)
        self.failed = asyncio.Event()
        #: seconds spent in Ready rounds and in their disk work (log writes and fsyncs, in
        #: the I/O threads; `fsync_seconds`, the name it always had) (metrics)
        self.timers: dict[str, float] = {"round_seconds": 0.0, "fsync_seconds": 0.0}

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            self.core.storage.claim(self.id, self.config.cluster_id)
        except StorageIdentityError as e:
            raise BrokerError(str(e)) from e
        self._set_clock()
        self.core.open()
        config = self.config
        self.peer_addr = await self.transport.start(config.host, config.worker_peer_port)
        _, peer_port = self.peer_addr.rsplit(":", 1)
        self.peer_addr = format_address(config.public_host, int(peer_port))
        if config.worker == 0:
            await self._start_swim()
        else:
            self.follow = FeedClient(
                config.data_dir,
                config.worker,
                self._on_table,
                self._on_member_event,
                lambda: self.render_metrics() if self.render_metrics else "# EOF\n",
                lambda hold_s, timeout_s: self.hand_off_leaderships(timeout_s, hold_s=hold_s),
            )
            # (kept in _tasks: a task nothing refers to may be collected while it runs)
            self._tasks.append(asyncio.create_task(self.follow.run(), name=f"feed-{self.id}"))
        if self.tls is not None:
            self.tls.start()
        self._running = True
        self._tasks += [
            asyncio.create_task(self._drive(), name=f"drive-{self.id}"),
            asyncio.create_task(self._tick_timer(), name=f"tick-{self.id}"),
            asyncio.create_task(self.status.run(), name=f"status-{self.id}"),
        ]
        log.info("broker %s up: api %s peer %s", self.id, self.api_addr, self.peer_addr)

    async def _start_swim(self) -> None:
        """Worker 0: the broker's SWIM member, advertising its workers (all but worker 0
        down until they connect to the feed), and the feed the others follow."""
        config = self.config
        down = (1 << config.workers) - 2
        self.swim = SwimNode(
            config.node_id,
            cluster_id=config.cluster_id,
            secret=config.secret,
            seeds=config.seeds,
            bind_host=config.host,
            bind_port=config.gossip_port,
            advertise_host=config.public_host,
            api_addr=self.api_addr,
            peer_addr=self.peer_addr,
            workers=config.workers,
            workers_down=down,
            on_event=self._on_member_event,
        )
        await self.swim.start()
        if config.workers > 1:
            swim = self.swim
            self.feed = FeedServer(
                config.data_dir,
                config.workers,
                lambda: list(swim.members().values()),
                self._on_workers,
            )
            await self.feed.start()

    def _on_workers(self, down: int) -> None:
        """Worker 0: the workers connected to the feed changed."""
        if self.swim is not None and self.swim.running:
            self.swim.update_self(workers_down=down)
        if self.feed is not None:
            self.feed.publish()  # (this broker's own record changed)
        self._wake.set()

    def _on_table(self, states: list[MemberState]) -> None:
        """Worker w > 0: worker 0 sent the member table."""
        self._followed = expand(states)
        self._wake.set()

    def set_api_addr(self, address: str) -> None:
        """The HTTP server's bound address (before `start`, when the port was 0)."""
        self.api_addr = address

    async def stop(self, *, graceful: bool = True) -> None:
        """Hand leaderships to caught-up voters, leave the gossip group, persist, close."""
        if not self._running:
            return
        self._stopping = True
        if self._leaving_ends is not None:
            self._leaving_ends.cancel()
        if graceful:
            await self.hand_off_leaderships(timeout_s=3.0)
        self.core.refuse_proposals()
        self._wake.set()
        if self.feed is not None:
            await self.feed.stop()
        if self.swim is not None:
            await self.swim.stop(leave=graceful)
        tasks = [*self._tasks, *self.movers.tasks.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._client is not None:
            await self._client.close()
        if self.tls is not None:
            await self.tls.stop()
        await self.transport.stop()
        # a cancelled round's disk work may still run: the logs close once it is done
        self._disk.unwatch()
        await asyncio.get_running_loop().run_in_executor(None, self._disk.close)
        self.core.close()
        self._running = False

    # ---- membership ------------------------------------------------------------------------

    def members(self) -> dict[str, Member]:
        """id -> (status, api address, peer address), ourselves included."""
        out: dict[str, Member] = {}
        if self.swim is not None and self.swim.running:
            out.update(expand(self.swim.members().values()))
        else:
            out.update(self._followed)
        out[self.id] = (MemberStatus.ALIVE, self.api_addr, self.peer_addr)
        return out

    def peer_address(self, node: str) -> str | None:
        """`members()[node]`'s peer address (None: no such member), without building every
        member's entry, as `send` needs it for each destination of every round."""
        if node == self.id:
            return self.peer_addr
        if self.swim is not None and self.swim.running:
            return peer_address(self.swim.member(broker_of(node)), node)
        followed = self._followed.get(node)
        return None if followed is None else followed[2]

    def _on_member_event(self, event: MembershipEvent) -> None:
        if event.kind in (EventKind.DEAD, EventKind.LEFT):
            for node in worker_ids(event.state.id, event.state.member.workers):
                self.status.forget(node)
        self.core.on_member_event(event)
        if self.feed is not None:
            self.feed.publish([event])
        self._wake.set()

    def api_url(self, address: str) -> str:
        """The base URL of the API at `address` ("host:port"): https when TLS is on (every
        broker of a cluster serves the same scheme)."""
        return f"{self.config.api_scheme}://{address}"

    def api_address_of(self, node: str | None) -> str | None:
        member = self.members().get(node) if node is not None else None
        return member[1] if member is not None else None

    # ---- the driver ------------------------------------------------------------------------

    def _on_messages(self, messages: list[Message]) -> None:
        status = [m for m in messages if m.type is MessageType.STATUS]
        for message in status:
            self.status.on_message(message)
        self.core.receive(m for m in messages if m.type is not MessageType.STATUS)
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    def _set_clock(self) -> None:
        self.core.set_clock(time.monotonic_ns() // 1_000_000, time.time_ns() // 1_000_000)

    async def _tick_timer(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_ms / 1000)
            self.core.tick()
            self._wake.set()

    async def _drive(self) -> None:
        while not self.core.stopping:
            await self._wake.wait()
            self._wake.clear()
            try:
                while not self.core.stopping and await self._round():
                    pass
            except asyncio.CancelledError:
                raise
            except STORAGE_FAILURES as e:
                # fail-stop: a round half persisted (a failed write or fdatasync) cannot be
                # retried safely (the kernel may have dropped the unsynced pages already)
                log.critical("%s: storage failed; stopping the broker: %s", self.id, e)
                self.failed.set()
                return
            except Exception:
                log.exception("%s: driver round failed", self.id)
                await asyncio.sleep(0.1)

    async def _round(self) -> bool:
        """Carry out one round of the core's; False when it had none."""
        self._set_clock()
        started = time.perf_counter()
        round_ = self.core.begin()
        if round_ is None:
            return False
        self._in_round = True
        try:
            if round_.checkpointed is not None:
                # a journal checkpoint: its logs synced, then its start moved past their
                # records, before this round's record may be written over them
                await self._disk.run(round_.checkpoint)
                await self._disk.run([round_.checkpointed])
            # the disk work first: each storage's writes, then its fdatasync (one group
            # commit for every log written, or the journal's), in threads while the loop
            # goes on
            writing = self._disk.run([flush.job() for flush in round_.syncs])
            if round_.background_done is not None:
                self._beside(round_.background, round_.background_done)
            self.send(round_.before)
            self.waits.answer(round_)
            for group in round_.movers:
                if (replica := self.core.replicas.get(group)) is not None:
                    self.movers.start(replica, lambda: self.core.state.topics)
            synced = time.perf_counter()
            await writing
            self.timers["fsync_seconds"] += time.perf_counter() - synced
            self.core.stored(round_)  # the entries written are part of the logs now
            self.waits.answer(round_)
            if round_.saves:
                await self._disk.run(round_.saves)
            self.send(round_.after)
            self.core.finish(round_)
        finally:
            self._in_round = False
        if self._removals is not None:
            removals, self._removals = self._removals, None
            try:
                self.core.collect_removed(removals)
            except Exception:  # as the API's collector: the next collection tries again
                log.exception("collecting removed replicas failed")
        self.timers["round_seconds"] += time.perf_counter() - started
        return True

    def _beside(
        self, jobs: list[DirectWrite | Callable[[], None]], done: Callable[[], None]
    ) -> None:
        """Run a journal checkpoint's log syncs beside the rounds, a few at a time (one up to
        CHECKPOINT_LOGS_A_LANE logs; each writes its bytes back in pieces: `FileStorage.direct`);
        `done` once they are. All at once, they stalled the rounds' journal syncs: the RF 3 p99
        at 5,000 msg/s was 43-53 ms against 12-24 without a journal, 33 one at a time
        (bench/RESULTS.md, issue 22, twenty-seventh sitting)."""
        lanes = -(-len(jobs) // CHECKPOINT_LOGS_A_LANE)  # (rounded up)
        width = max(1, min(CHECKPOINT_LANES, lanes))

        async def run() -> None:
            try:
                await self._disk.run_in_turn(jobs, width)
            except STORAGE_FAILURES as e:  # fail-stop, as a round's
                log.critical("%s: storage failed; stopping the broker: %s", self.id, e)
                self.failed.set()
                return
            done()

        task = asyncio.create_task(run(), name=f"checkpoint-{self.id}")
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

    def send(self, messages: Iterable[Message]) -> None:
        """Messages (of Raft groups, or node-level ones) to their destinations."""
        by_dst: dict[str, list[Message]] = {}
        for message in messages:
            by_dst.setdefault(message.dst, []).append(message)
        for dst, batch in by_dst.items():
            address = self.peer_address(dst)
            if not address:
                self.core.counters["dropped_messages"] += len(batch)
                continue
            self.transport.send(dst, address, batch)

    def internal_client(self) -> AsyncClient:
        """A client of this cluster (through this broker's API) for the broker's own needs."""
        if self._client is None:
            self._client = AsyncClient(
                [self.api_url(self.api_addr)],
                # principal laminar-broker (an admin): its token derives from the secret
                token=internal_token(self.config.secret, self.config.cluster_id),
                ssl_context=None if self.tls is None else self.tls.client,
            )
        return self._client

    async def readiness(self, timeout_s: float) -> tuple[bool, str]:
        """Ready: serving, with every worker of the broker running (worker 0 answers for
        them), and caught up with the metadata the cluster has committed (a metadata barrier
        completes within `timeout_s`)."""
        reason = "starting" if not self._running else self.core.readiness()
        if reason is not None:
            return False, reason
        if self.feed is not None and self.feed.down:  # (the pod is ready with all its workers)
            down = [w for w in range(self.config.workers) if self.feed.down >> w & 1]
            return False, f"workers {down} are not running"
        if not await self.waits.metadata_barrier(timeout_s):
            return False, "not caught up with the cluster metadata"
        return True, "ready"

    async def hand_off_leaderships(self, timeout_s: float, *, hold_s: float | None = None) -> int:
        """Hand every leadership to a caught-up voter (a broker about to stop: the pod's
        preStop, or SIGTERM); returns how many groups it still leads after at most
        `timeout_s`. The broker is leaving from then on: it advertises so (SWIM), and takes
        no leadership handed over or handed back by a rebalance, until it stops, or for
        `hold_s` after the handoff if it is not stopping."""
        self._leave(True)
        loop = asyncio.get_running_loop()
        if self._leaving_ends is not None:
            self._leaving_ends.cancel()
            self._leaving_ends = None
        deadline = loop.time() + timeout_s
        # (who is alive and who is leaving too are read again each pass)
        while loop.time() < deadline and self.core.transfer_leaderships(self.core.alive()):
            self._wake.set()
            await asyncio.sleep(HANDOFF_POLL_S)
        if hold_s is not None and not self._stopping:
            self._leaving_ends = loop.call_later(hold_s, self._leave, False)
        return self.core.leading()

    async def hand_off_broker(self, timeout_s: float, *, hold_s: float | None = None) -> int:
        """`hand_off_leaderships` on this worker and, from worker 0, on every other worker of
        the broker at once (asked over the local feed: no network address is needed, so a
        pod's preStop works while its cluster's Services are being deleted); how many groups
        they still lead, counting a worker that did not answer in time as leading none."""
        if self.feed is None:
            return await self.hand_off_leaderships(timeout_s, hold_s=hold_s)
        own, others = await asyncio.gather(
            self.hand_off_leaderships(timeout_s, hold_s=hold_s),
            self.feed.handoff(hold_s, timeout_s, answer_s=FEED_ANSWER_S),
        )
        return own + sum(others.values())

    def _leave(self, leaving: bool) -> None:
        if not leaving and self._stopping:
            return
        self.core.leave(leaving)
        if self.swim is not None and self.swim.running:
            self.swim.update_self(leaving=leaving)

    def collect_removed(self, view: View) -> list[str]:
        """Drop replicas that their group's leader (in `view`) no longer counts; during a
        round (whose writes may be in flight on them) at its end instead (returns [])."""
        self._set_clock()
        others = view_leaders({n: h for n, h in view.items() if n != self.id})
        if self._in_round:
            self._removals = others
            return []
        return self.core.collect_removed(others)
