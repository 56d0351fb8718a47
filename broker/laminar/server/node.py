"""The broker runtime: the asyncio shell that drives every Raft group a node hosts.

One driver task owns the cores. It steps messages from peers, ticks, runs the control loop
(placement reconciliation, hosting and dropping replicas, metadata compaction), then drains
Ready: writes entries to the logs, sends a leader's appends at once, fdatasyncs every log
that took entries in one worker-thread call (group commit: proposals arriving meanwhile
join the next round), persists hard state, sends the rest (acknowledgements go out only once
durable), applies what was committed and advances. Messages from peers that arrive while a
round is being persisted wait in the inbox for the next round.

Membership comes from SWIM; topics, weights and drains from the `__cluster` metadata group,
whose state machine (`ClusterState`) every node applies.

A replica's data is removed only after a committed change this node has applied says so: a
deletion of its topic (known by identity: the metadata index that created it, recorded beside
the replica), or a configuration that no longer counts this node. Metadata that may be stale
(a restart replays only what it saved) never removes anything. A replica whose log is found
damaged is reopened repaired (`laminar.raft.repair`): cut at the damage and fetched again from
the leader; a damaged leader so steps down. Other replicas are not touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from ..client import AsyncClient
from ..credentials import internal_token
from ..log.batch import Record, decode_batch, encode_batch
from ..log.config import FsyncPolicy, LogConfig
from ..log.errors import CorruptBatchError
from ..metadata import (
    METADATA_GROUP,
    AlterTopic,
    ClusterState,
    Command,
    CreateTopic,
    MetadataError,
    decode_command,
    encode_command,
    metadata_voters,
    validate_proposal,
)
from ..metadata.state import LOG_CONFIG_KEYS, MAX_PARTITIONS, MAX_REPLICATION_FACTOR, Topic
from ..partition.errors import NotLeader, Overloaded, ReplicaClosed
from ..partition.groups import now_ms
from ..partition.reconcile import StepKind, leader_step
from ..partition.replica import Replica, topic_identity
from ..partition.signal import Signal
from ..partition.status_table import leaders as view_leaders
from ..placement import Candidate, partition_key, place
from ..queue.state import QueueConfig
from ..raft.config import RaftConfig
from ..raft.log_storage import LogStorage
from ..raft.messages import ConfState, EntryKind, Message, MessageType
from ..raft.multi import MultiRaft
from ..raft.raft import ProposalDropped, Raft, Ready, Role
from ..raft.round import plan
from ..raft.storage import StorageUnavailable, stored_entries
from ..swim.address import format_address
from ..swim.member import EventKind, MembershipEvent, MemberStatus
from ..tls import CertificateStore, TlsError
from .config import BrokerConfig
from .dead_letters import DeadLetterMover
from .status_gossip import StatusGossip
from .swim_runtime import SwimNode
from .transport import PeerTransport

log = logging.getLogger(__name__)
#: what can meet malformed records (`Broker.report_malformed`)
MALFORMED_PATHS = ("read", "acquire", "dead_letter")
#: batches whose report is remembered (beyond it, reports start over)
MALFORMED_SEEN_LIMIT = 10_000

MT = MessageType
#: The messages that may create a replica here (a leader reaching a member it added).
LEADER_MESSAGES = frozenset({MT.APPEND, MT.HEARTBEAT, MT.SNAPSHOT})
CONTROL_INTERVAL_S = 0.25
#: A learner within this many indexes of the leader's log may be promoted.
CATCH_UP_LAG_INDEXES = 256
#: Compact the metadata log once this many entries sit behind the commit.
METADATA_COMPACT_ENTRIES = 256
NODE_FILE = "node.json"
#: replicas of topics that were never known here, moved aside (never deleted)
QUARANTINE_DIR = "quarantine"
#: a metadata barrier (read index) not answered within this is asked again
BARRIER_RETRY_MS = 1_000
SYNC_THREADS = 4
RETENTION_INTERVAL_MS = 2_000
DEFAULT_MAX_DELIVERIES = QueueConfig().max_deliveries


class BrokerError(Exception):
    pass


@dataclass(slots=True)
class GroupStatus:
    role: Role
    lead: str | None
    term: int


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.id = config.node_id
        self.data_dir = config.data_dir
        self.raft_config = RaftConfig(
            election_ticks=config.election_ticks,
            heartbeat_ticks=1,
            max_inflight_appends=16,
            max_append_bytes=1 << 20,
            promote_lag_indexes=CATCH_UP_LAG_INDEXES,
        )
        self.multi = MultiRaft(self.id)
        self.replicas: dict[str, Replica] = {}  # data partitions, by group
        self.meta: Replica | None = None
        self.state = ClusterState()
        #: TLS (config.tls): the contexts of the API, the peer transport and this broker's
        #: own calls to other brokers, reloaded when their files change
        self.tls: CertificateStore | None = None
        if config.tls_files is not None:
            try:
                self.tls = CertificateStore(config.tls_files)
            except TlsError as e:
                raise BrokerError(f"TLS: {e}") from e
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
        self.api_addr = format_address(config.public_host, config.api_port)
        self.peer_addr = ""
        self._inbox: list[Message] = []
        self._wake = asyncio.Event()
        self._ticks_due = 0
        self._control_due = True
        self._tasks: list[asyncio.Task[None]] = []
        self._sync_pool = ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix=f"fsync-{self.id}")
        self.meta_applied_index = -1  # last metadata-group index applied (no-ops included)
        self._meta_waiters: dict[int, tuple[int, asyncio.Future[MetadataError | None]]] = {}
        #: notified whenever meta_applied_index advances
        self._meta_advanced = Signal()
        self._dead_since_ms: dict[str, int] = {}
        self._status: dict[str, GroupStatus] = {}
        self._was_member: set[str] = set()
        self._hosted_at_ms: dict[str, int] = {}
        self._excluded: set[str] = set()  # groups a leader excluded us from at the last check
        self._retained_at_ms = 0
        self._movers: dict[str, asyncio.Task[None]] = {}  # dead-letter tasks, by group
        self._client: AsyncClient | None = None
        self._next_sync_ms = 0
        self._replaying = False  # re-applying the metadata log at start
        self._damaged: dict[str, int] = {}  # group -> first damaged index: reopen repaired
        # metadata barriers: waiting for a read index to be asked, asked (context, when,
        # waiters), and answered (index to apply, waiters)
        self._barrier_next: list[asyncio.Future[None]] = []
        self._barrier_asked: tuple[bytes, int, list[asyncio.Future[None]]] | None = None
        self._barrier_points: list[tuple[int, list[asyncio.Future[None]]]] = []
        self._barrier_seq = 0
        self._barrier_done_ms = -1  # when a barrier last completed (monotonic)
        self._stopping = False
        self._running = False
        #: counters read by the metrics module
        self.counters: dict[str, int] = {
            "elections": 0,
            "leader_changes": 0,
            "fsyncs": 0,
            "ready_rounds": 0,
            "dropped_messages": 0,
            "bad_status_reports": 0,
            # storage damage (laminar_storage_*)
            "corrupt_batches": 0,
            "repairs": 0,
            "data_loss_repairs": 0,
            "quarantined_replicas": 0,
        }
        #: records of malformed batches skipped, by what met them (read, acquire,
        #: dead_letter), each counted once (laminar_malformed_records_total)
        self.malformed_records: dict[str, int] = dict.fromkeys(MALFORMED_PATHS, 0)
        self._malformed_seen: set[tuple[str, str, int, str]] = set()
        #: seconds spent in Ready rounds and in their fsyncs (metrics)
        self.timers: dict[str, float] = {"round_seconds": 0.0, "fsync_seconds": 0.0}

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._check_node_file()
        self._open_metadata()
        self._open_replicas()
        self.peer_addr = await self.transport.start(self.config.host, self.config.peer_port)
        _, peer_port = self.peer_addr.rsplit(":", 1)
        self.peer_addr = format_address(self.config.public_host, int(peer_port))
        self.swim = SwimNode(
            self.id,
            cluster_id=self.config.cluster_id,
            secret=self.config.secret,
            seeds=self.config.seeds,
            bind_host=self.config.host,
            bind_port=self.config.gossip_port,
            advertise_host=self.config.public_host,
            api_addr=self.api_addr,
            peer_addr=self.peer_addr,
            on_event=self._on_member_event,
        )
        await self.swim.start()
        if self.tls is not None:
            self.tls.start()
        self._running = True
        self._tasks = [
            asyncio.create_task(self._drive(), name=f"drive-{self.id}"),
            asyncio.create_task(self._tick_timer(), name=f"tick-{self.id}"),
            asyncio.create_task(self.status.run(), name=f"status-{self.id}"),
        ]
        log.info("broker %s up: api %s peer %s", self.id, self.api_addr, self.peer_addr)

    def set_api_addr(self, address: str) -> None:
        """The HTTP server's bound address (before `start`, when the port was 0)."""
        self.api_addr = address

    async def stop(self, *, graceful: bool = True) -> None:
        """Hand leaderships to caught-up voters, leave the gossip group, persist, close."""
        if not self._running:
            return
        if graceful:
            await self._transfer_leaderships(timeout_s=3.0)
        self._stopping = True
        for replica in self._all_replicas():
            replica.refuse_proposals()
        self._wake.set()
        if self.swim is not None:
            await self.swim.stop(leave=graceful)
        tasks = [*self._tasks, *self._movers.values()]
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
        for replica in self._all_replicas():
            replica.close()
        self._sync_pool.shutdown(wait=True)
        self._running = False

    def _check_node_file(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / NODE_FILE
        identity = {"node_id": self.id, "cluster_id": self.config.cluster_id}
        if path.exists():
            found = json.loads(path.read_text())
            if found != identity:
                raise BrokerError(
                    f"{self.data_dir} belongs to node {found.get('node_id')!r} of cluster "
                    f"{found.get('cluster_id')!r}, not {self.id!r} of {self.config.cluster_id!r}"
                )
        else:
            path.write_text(json.dumps(identity))

    # ---- hosting groups --------------------------------------------------------------------

    def _log_config(self, overrides: dict[str, object] | None = None) -> LogConfig:
        settings: dict[str, object] = {"segment_bytes": self.config.segment_bytes}
        settings.update((k, v) for k, v in (overrides or {}).items() if k in LOG_CONFIG_KEYS)
        settings["fsync"] = self.config.fsync
        return LogConfig(**settings)  # type: ignore[arg-type]

    def initial_metadata_voters(self) -> tuple[str, ...]:
        nodes = self.config.initial_nodes or (() if self.config.seeds else (self.id,))
        return tuple(sorted(metadata_voters(Candidate(n) for n in nodes)))

    def _open_metadata(self) -> None:
        path = self.data_dir / "metadata"
        voters = self.initial_metadata_voters()
        if path.exists() or self.id in voters:
            self._host_metadata(ConfState(voters if self.id in voters else ()))

    def _host_metadata(self, bootstrap: ConfState, *, repair_at: int | None = None) -> None:
        replica = Replica(
            METADATA_GROUP,
            0,
            self.id,
            self.data_dir / "metadata",
            self._log_config(),
            self.raft_config,
            bootstrap,
            group=METADATA_GROUP,
            queues=False,
            commit_save_indexes=1,  # a restart replays the metadata up to its commit
            repair_at=repair_at,
        )
        self._opened(replica)
        self.meta = replica
        self.multi.add(replica.raft)
        state, applied = self.state, self.meta_applied_index
        self._restore_metadata()
        storage = replica.storage
        commit = storage.initial_state()[0].commit
        if commit >= storage.first_index():
            # replaying what this node applied before: its replicas are on disk already
            self._replaying = True
            try:
                self._apply_metadata(storage.first_index(), commit)
            finally:
                self._replaying = False
        if state.applied_index > self.state.applied_index:
            # reopened after a repair cut committed entries: what was applied stays applied
            self.state, self.meta_applied_index = state, applied

    def _restore_metadata(self) -> None:
        assert self.meta is not None
        snapshot = self.meta.storage.snapshot()
        self.state = ClusterState.restore(snapshot.data) if snapshot.data else ClusterState()
        self.meta_applied_index = snapshot.index

    def _partition_path(self, topic: str, partition: int) -> Path:
        return self.data_dir / "partitions" / topic / str(partition)

    def _open_replicas(self) -> None:
        root = self.data_dir / "partitions"
        if not root.exists():
            return
        for topic_dir in sorted(root.iterdir()):
            for part_dir in sorted(topic_dir.iterdir()):
                if not (part_dir.name.isascii() and part_dir.name.isdigit()):
                    continue
                topic, partition = topic_dir.name, int(part_dir.name)
                created = topic_identity(part_dir)
                if created is not None and self._topic_deleted(topic, created):
                    log.info(
                        "removing %s/%d: its topic (created at metadata index %d) was deleted",
                        topic,
                        partition,
                        created,
                    )
                    shutil.rmtree(part_dir, ignore_errors=True)
                    continue
                # a topic the metadata does not know (yet): its replica is hosted all the
                # same; the metadata this node replayed may be behind the cluster's
                self._host(topic, partition, self._reopen_bootstrap(topic, partition, created))

    def _reopen_bootstrap(self, topic: str, partition: int, created: int | None) -> ConfState:
        """The configuration a replica found on disk is opened with, used only when it never
        saved its Raft state (created just before a crash): the partition's initial voters,
        as when it was created (safe for a member with an empty log: nothing it never
        persisted was counted in a quorum), or none while the topic is unknown."""
        known = self.state.topics.get(topic)
        found = self._assignment_conf(f"{topic}/{partition}")
        if known is None or found is None or created not in (None, known.created_index):
            return ConfState(())
        return found[2]

    def _topic_deleted(self, topic: str, created_index: int) -> bool:
        """Has this node applied the deletion of the topic created at `created_index`?"""
        state = self.state
        current = state.topics.get(topic)
        replaced = current is None or current.created_index != created_index
        return state.applied_index >= created_index and replaced

    def _host(
        self,
        topic: str,
        partition: int,
        bootstrap: ConfState,
        *,
        repair_at: int | None = None,
        joining: bool = False,
    ) -> Replica:
        replica = Replica(
            topic,
            partition,
            self.id,
            self._partition_path(topic, partition),
            self._log_config(),
            self.raft_config,
            bootstrap,
            max_pending_bytes=self.config.max_pending_bytes_per_partition,
            repair_at=repair_at,
            joining=joining,
        )
        self._opened(replica)
        self.replicas[replica.group] = replica
        if replica.groups is not None:
            replica.groups.on_propose = self.wake
            replica.groups.on_malformed = partial(self.report_malformed, replica.group)
        self._hosted_at_ms[replica.group] = _now_ms()
        self.multi.add(replica.raft)
        if (topic_state := self.state.topics.get(topic)) is not None:
            self._adopt(replica, topic_state)
        log.info("%s hosts %s (conf %s)", self.id, replica.group, replica.raft.conf)
        return replica

    def _adopt(self, replica: Replica, topic: Topic) -> None:
        """`replica` belongs to `topic` (unless it is marked as another topic of the same
        name): record that, and take the topic's log settings."""
        if replica.topic_created_index is None:
            replica.bind_topic(topic.created_index)
        if replica.topic_created_index == topic.created_index:
            replica.log.config = self._log_config(dict(topic.config))

    def _opened(self, replica: Replica) -> None:
        """Report what opening `replica` repaired; listen for damage found later."""
        replica.on_damage = self._on_damage
        for damage in replica.repairs:
            self.counters["repairs"] += 1
            if damage.data_loss:
                self.counters["data_loss_repairs"] += 1
                log.error(
                    "%s: %s: %s; records from %d on are lost (it has no other voter to fetch "
                    "them from)",
                    self.id,
                    replica.group,
                    damage.reason,
                    damage.first_index,
                )
            else:
                log.error(
                    "%s: %s: %s; the log is cut at %d and fetched again from the leader (it "
                    "had reached %s; until then this replica neither leads nor votes below it)",
                    self.id,
                    replica.group,
                    damage.reason,
                    damage.first_index,
                    damage.floor,
                )

    def report_malformed(self, group: str, path: str, first: int, end: int, reason: str) -> None:
        """Records [first, end) of `group` are malformed (a valid checksum, broken framing:
        stored before appends checked records) and `path` went past them: a read answered 422,
        an acquire skipped them, the dead-letter mover moved a letter without its record. Log
        and count each once (a reader that retries is not news; `reason` names the consumer
        group that skipped them)."""
        key = (group, path, first, reason)
        if key in self._malformed_seen:
            return
        if len(self._malformed_seen) >= MALFORMED_SEEN_LIMIT:
            self._malformed_seen.clear()
        self._malformed_seen.add(key)
        self.malformed_records[path] = self.malformed_records.get(path, 0) + end - first
        log.warning(
            "%s: %s: records %d..%d are malformed and skipped (%s): %s",
            self.id,
            group,
            first,
            end - 1,
            path,
            reason,
        )

    def _on_damage(self, replica: Replica, index: int) -> None:
        """A read met a damaged batch of `replica`: reopen it repaired (next round), unless
        it is its group's only voter (then reads of that batch are refused, and it stays)."""
        self.counters["corrupt_batches"] += 1
        repairable = replica.repairable
        log.error(
            "%s: %s: batch %d is damaged on disk%s",
            self.id,
            replica.group,
            index,
            "; repairing the replica" if repairable else " and this is its only replica",
        )
        if repairable:
            self._repair_later(replica, index)

    def _repair_later(self, replica: Replica, index: int) -> None:
        self._damaged[replica.group] = min(index, self._damaged.get(replica.group, index))
        self._wake.set()

    def _repair_damaged(self) -> None:
        """Reopen each damaged replica with its log cut at the damage (between rounds)."""
        damaged, self._damaged = self._damaged, {}
        for group, index in sorted(damaged.items()):
            replica = self._replica_of(group)
            if replica is None or replica.closed or self._stopping:
                continue
            self.multi.remove(group)
            self._status.pop(group, None)
            mover = self._movers.pop(group, None)
            if mover is not None:
                mover.cancel()
            replica.close()
            conf = replica.raft.conf  # bootstraps the reopened group if it never saved one
            if group == METADATA_GROUP:
                self._host_metadata(conf, repair_at=index)
            else:
                self._host(replica.topic, replica.partition, conf, repair_at=index)

    def _drop(self, replica: Replica) -> None:
        log.info("%s drops %s", self.id, replica.group)
        self.multi.remove(replica.group)
        self.replicas.pop(replica.group, None)
        self._status.pop(replica.group, None)
        self._was_member.discard(replica.group)
        replica.destroy()

    def collect_removed(self, view: View) -> list[str]:
        """Drop replicas whose group's leader (in `view`, every member's hosted replicas) no
        longer counts us as a member, seen twice in a row: a removed replica may never learn
        of its removal from Raft (the leader stops talking to it once the change commits)."""
        leaders = view_leaders({n: h for n, h in view.items() if n != self.id})
        excluded = set()
        now = _now_ms()
        for group, replica in self.replicas.items():
            report = leaders.get(group)
            if report is None or replica.raft.role is Role.LEADER:
                continue
            members = set(report["voters"]) | set(report["learners"])
            old_enough = now - self._hosted_at_ms.get(group, now) > 10_000
            current = int(report["term"]) >= replica.raft.term
            if self.id not in members and current and old_enough:
                excluded.add(group)
        dropped = sorted(excluded & self._excluded)
        self._excluded = excluded - set(dropped)
        for group in dropped:
            found = self.replicas.get(group)
            if found is not None:
                self._drop(found)
        return dropped

    def _assignment_conf(self, group: str) -> tuple[str, int, ConfState] | None:
        topic_name, _, number = group.rpartition("/")
        topic = self.state.topics.get(topic_name)
        if topic is None or not (number.isascii() and number.isdigit()):
            return None
        if int(number) >= len(topic.assignment):
            return None  # (the assignment lists every partition of a topic it knows)
        partition = int(number)
        return topic_name, partition, ConfState(tuple(sorted(topic.assignment[partition])))

    def _maybe_host_for(self, group: str, kind: MT) -> bool:
        """A message for a group we do not host: a leader added us to it, if a leader sent
        it. The replica starts joining (it neither campaigns nor votes until it holds an
        entry a leader wrote): the message may be a stale one, reaching us after our removal
        from the group (and after we dropped our replica), and the configuration it starts
        with is only the group's initial one. Nothing else creates a replica: a removed
        member still campaigning must find no voter here."""
        if group == METADATA_GROUP:
            if self.meta is None:
                self._host_metadata(ConfState(()))
            return True
        found = self._assignment_conf(group)
        if found is None or self._stopping or kind not in LEADER_MESSAGES:
            return False
        topic, partition, conf = found
        self._host(topic, partition, conf, joining=True)
        return True

    def _all_replicas(self) -> list[Replica]:
        return ([self.meta] if self.meta is not None else []) + list(self.replicas.values())

    def replica(self, topic: str, partition: int) -> Replica | None:
        return self.replicas.get(f"{topic}/{partition}")

    # ---- membership ------------------------------------------------------------------------

    def _on_member_event(self, event: MembershipEvent) -> None:
        now = _now_ms()
        if event.kind in (EventKind.DEAD, EventKind.LEFT):
            self._dead_since_ms.setdefault(event.state.id, now)
            self.status.forget(event.state.id)
        elif event.kind in (EventKind.JOINED, EventKind.ALIVE):
            self._dead_since_ms.pop(event.state.id, None)
        self._control_due = True
        self._wake.set()

    def members(self) -> dict[str, tuple[MemberStatus, str, str]]:
        """id -> (status, api address, peer address), ourselves included."""
        out: dict[str, tuple[MemberStatus, str, str]] = {}
        if self.swim is not None and self.swim.running:
            for node_id, member in self.swim.members().items():
                addresses = member.member.addresses
                out[node_id] = (member.status, addresses.api, addresses.peer)
        out[self.id] = (MemberStatus.ALIVE, self.api_addr, self.peer_addr)
        return out

    def swim_alive(self) -> set[str]:
        alive = {
            node
            for node, (status, _, _) in self.members().items()
            if status in (MemberStatus.ALIVE, MemberStatus.SUSPECT)
        }
        return alive | {self.id}

    def candidates(self) -> list[Candidate]:
        """Every known member, alive for placement if SWIM says so or it died recently."""
        now = _now_ms()
        out = []
        for node, (status, _, _) in sorted(self.members().items()):
            alive = status in (MemberStatus.ALIVE, MemberStatus.SUSPECT) or (
                now - self._dead_since_ms.get(node, now) < self.config.dead_grace_ms
            )
            out.append(
                Candidate(
                    node,
                    self.state.weight(node),
                    alive=alive or node == self.id,
                    draining=node in self.state.draining,
                )
            )
        return out

    def api_url(self, address: str) -> str:
        """The base URL of the API at `address` ("host:port"): https when TLS is on (every
        broker of a cluster serves the same scheme)."""
        return f"{self.config.api_scheme}://{address}"

    def api_address_of(self, node: str | None) -> str | None:
        if node is None:
            return None
        member = self.members().get(node)
        return member[1] if member is not None else None

    # ---- the driver ------------------------------------------------------------------------

    def _on_messages(self, messages: list[Message]) -> None:
        for message in messages:
            if message.type is MT.STATUS:
                self.status.on_message(message)
            else:
                self._inbox.append(message)
        self._wake.set()

    def send_node_messages(self, messages: Iterable[Message]) -> None:
        """Node-level messages (not of a Raft group) to their destinations."""
        self._send(messages)

    def wake(self) -> None:
        self._wake.set()

    async def _tick_timer(self) -> None:
        interval = self.config.tick_ms / 1000
        control_every = max(1, round(CONTROL_INTERVAL_S / interval))
        count = 0
        while True:
            await asyncio.sleep(interval)
            self._ticks_due += 1
            count += 1
            if count % control_every == 0:
                self._control_due = True
            self._wake.set()

    async def _drive(self) -> None:
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            try:
                while not self._stopping and await self._round():
                    pass
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: driver round failed", self.id)
                await asyncio.sleep(0.1)

    async def _round(self) -> bool:
        """Repair, step what arrived, tick, control, persist one Ready; False when idle."""
        if self._damaged:
            self._repair_damaged()
        self._step_inbox()
        ticks, self._ticks_due = min(self._ticks_due, 3), 0
        for _ in range(ticks):
            self.multi.tick()
        if self._control_due:
            self._control_due = False
            self._control()
        self._ask_barrier()
        busy = await self._persist_ready()
        if self.config.fsync is FsyncPolicy.INTERVAL and _now_ms() >= self._next_sync_ms:
            await self._sync_everything()
        return busy

    async def _sync_everything(self) -> None:
        """fsync policy `interval`: fdatasync every log now (acks went out before)."""
        self._next_sync_ms = _now_ms() + self.config.fsync_interval_ms
        loop = asyncio.get_running_loop()
        storages = [r.storage for r in self._all_replicas()]
        self.counters["fsyncs"] += len(storages)
        await asyncio.gather(*(loop.run_in_executor(self._sync_pool, s.sync) for s in storages))

    def _step_inbox(self) -> None:
        inbox, self._inbox = self._inbox, []
        for message in inbox:
            folded = message.type in (MT.HEARTBEATS, MT.HEARTBEATS_RESP)
            for part in message.batch if folded else (message,):
                if part.group not in self.multi.groups and not self._maybe_host_for(
                    part.group, part.type
                ):
                    self.counters["dropped_messages"] += 1
            self.multi.step(message)

    async def _persist_ready(self) -> bool:
        """One Ready of every group: persist, send, apply, advance. Messages that arrive
        meanwhile are stepped before the next one (acknowledgements never wait behind a
        stream of new proposals)."""
        readies, messages = self.multi.ready()
        if not readies and not messages:
            return False
        self.counters["ready_rounds"] += 1
        started = time.perf_counter()
        gone = {group for group in readies if self._storage(group) is None}
        round_ = plan(readies, messages, gone)  # raft/round.py: the steps, in their order
        to_sync: list[LogStorage] = []
        for group, ready in readies.items():
            storage = self._storage(group)
            if storage is None:
                continue
            if ready.snapshot is not None:
                storage.apply_snapshot(ready.snapshot)
                if group == METADATA_GROUP:
                    self._restore_metadata()
                elif (replica := self.replicas.get(group)) and replica.groups is not None:
                    replica.groups.reset()
            if ready.entries:
                storage.append(ready.entries)
                to_sync.append(storage)
                if (replica := self.replicas.get(group)) and replica.groups is not None:
                    replica.groups.applier.written(ready.entries)
        self._send(round_.before)
        # Committed entries are durable on a majority already (the leader counts its own
        # log only once persisted) and written here: answer their appends now, not
        # after this round's fsync of newer entries.
        for group, ready in readies.items():
            if ready.committed is not None:
                self._apply(group, *ready.committed)
        if (meta_ready := readies.get(METADATA_GROUP)) is not None and meta_ready.read_states:
            self._answered_barrier(meta_ready.read_states)
        if self._barrier_points:
            self._release_barriers()
        if to_sync and self.config.fsync is FsyncPolicy.ALWAYS:
            # concurrent fdatasyncs of different logs share the file system's journal
            # commits: one round costs about one sync, however many logs took entries
            self.counters["fsyncs"] += len(to_sync)
            loop = asyncio.get_running_loop()
            synced = time.perf_counter()
            await asyncio.gather(*(loop.run_in_executor(self._sync_pool, s.sync) for s in to_sync))
            self.timers["fsync_seconds"] += time.perf_counter() - synced
        saves = []  # term, vote or configuration changed: written and fsynced off the loop
        for group, ready in readies.items():
            storage = self._storage(group)
            if storage is not None and ready.hard_state is not None:
                if storage.saves_durably(ready.hard_state):
                    saves.append(partial(storage.set_hard_state, ready.hard_state))
                else:
                    storage.set_hard_state(ready.hard_state)  # memory, or the unsynced hint
        if saves:
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(loop.run_in_executor(self._sync_pool, save) for save in saves))
        self._send(round_.after)
        self.multi.advance(readies)
        self._observe(readies)
        self.timers["round_seconds"] += time.perf_counter() - started
        return True

    def _replica_of(self, group: str) -> Replica | None:
        return self.meta if group == METADATA_GROUP else self.replicas.get(group)

    def _storage(self, group: str) -> LogStorage | None:
        replica = self._replica_of(group)
        return replica.storage if replica is not None else None

    def _send(self, messages: Iterable[Message]) -> None:
        by_dst: dict[str, list[Message]] = {}
        for message in messages:
            by_dst.setdefault(message.dst, []).append(message)
        members = self.members()
        for dst, batch in by_dst.items():
            member = members.get(dst)
            if member is None or not member[2]:
                self.counters["dropped_messages"] += len(batch)
                continue
            self.transport.send(dst, member[2], batch)

    def _observe(self, readies: dict[str, Ready]) -> None:
        """Count elections and leader changes; tell replicas about leadership."""
        for group in readies:
            raft = self.multi.groups.get(group)
            if raft is None:
                continue
            before = self._status.get(group)
            if (before is None or before.lead != raft.lead) and raft.lead is not None:
                self.counters["leader_changes"] += 1
            if raft.role is Role.CANDIDATE and (before is None or before.term != raft.term):
                self.counters["elections"] += 1
            self._status[group] = GroupStatus(raft.role, raft.lead, raft.term)
            replica = self._replica_of(group)
            if replica is not None:
                if self.id in raft.conf.members():
                    self._was_member.add(group)
                with contextlib.suppress(CorruptBatchError):
                    # a new leader reads its newest batch headers: damage there was reported
                    # (on_damage) and the replica reopens repaired next round
                    replica.on_leadership()

    # ---- applying committed entries --------------------------------------------------------

    def _apply(self, group: str, first: int, last: int) -> None:
        replica = self._replica_of(group)
        try:
            if group == METADATA_GROUP:
                self._apply_metadata(first, last)
            if replica is not None:
                replica.on_committed(first, last)
        except (CorruptBatchError, StorageUnavailable):
            # a committed entry its state machine must read is damaged: the replica reopens
            # with its log cut there (an only voter loses what follows), then applies again
            if replica is None or replica.damaged_at is None:
                raise
            self._repair_later(replica, replica.damaged_at)

    def _apply_metadata(self, first: int, last: int) -> None:
        assert self.meta is not None
        storage = self.meta.storage
        first = max(first, storage.first_index(), self.meta_applied_index + 1)
        if first > last:
            return
        for entry in stored_entries(storage, first, last):
            self.meta_applied_index = entry.last_index
            if entry.index <= self.state.applied_index:
                continue
            if entry.kind is not EntryKind.NORMAL:
                continue
            (record,) = decode_batch(entry.data)
            assert record.value is not None
            command = decode_command(record.value)
            result = self.state.apply(entry.index, command)
            waiter = self._meta_waiters.pop(entry.index, None)
            if waiter is not None and not waiter[1].done():
                if waiter[0] == entry.term:
                    waiter[1].set_result(result)
                else:
                    waiter[1].set_exception(NotLeader(self.meta.raft.lead))
            if result is None:
                self._after_metadata(command)
        self.meta_applied_index = max(self.meta_applied_index, last)
        self._control_due = True
        self._meta_advanced.notify()

    async def metadata_applied(self, index: int, timeout_s: float) -> bool:
        """Wait until this node has applied the metadata group up to `index` (False: not
        within `timeout_s`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.meta_applied_index < index:
            remaining = deadline - loop.time()
            if remaining <= 0 or not await self._meta_advanced.wait(remaining):
                return False
        return True

    def _after_metadata(self, command: Command) -> None:
        """Host a created topic's partitions; a deleted topic's replicas go in `_control`."""
        if not isinstance(command, CreateTopic | AlterTopic):
            return
        topic = self.state.topics[command.name]
        for replica in self.replicas.values():
            if replica.topic == command.name:
                self._adopt(replica, topic)
        if self._replaying:
            return
        # host the partitions this command made that this node is an initial voter of
        # (replicas placed later are created when their leader first reaches this node).
        # Only those: a partition this node left since has a group without it, and a
        # replica made again from its initial voters would be a voter with an empty log,
        # which could elect another such member beside the group's real leader.
        made = len(command.assignment) if isinstance(command, AlterTopic) else topic.partitions
        for partition in range(topic.partitions - made, topic.partitions):
            voters = topic.assignment[partition]
            group = f"{topic.name}/{partition}"
            if self.id in voters and group not in self.replicas and not self._stopping:
                self._host(topic.name, partition, ConfState(tuple(sorted(voters))))

    # ---- metadata commands -----------------------------------------------------------------

    @property
    def metadata_leader(self) -> str | None:
        return self.meta.raft.lead if self.meta is not None else None

    async def propose_metadata(self, command: Command, timeout_s: float) -> None:
        """Commit an admin command through the metadata group (leader only); raises
        MetadataError (invalid / exists / not_found), NotLeader, ReplicaClosed or
        TimeoutError."""
        meta = self.meta
        if meta is not None and (meta.closed or meta.closing):
            raise ReplicaClosed(f"{meta.group} is closed")
        if meta is None or meta.raft.role is not Role.LEADER:
            raise NotLeader(self.metadata_leader)
        if (
            isinstance(command, CreateTopic)
            and not command.assignment
            and _valid_int(command.partitions, MAX_PARTITIONS)
            and _valid_int(command.replication_factor, MAX_REPLICATION_FACTOR)
        ):
            command = replace(command, assignment=self._assign(command.name, 0, command))
        if isinstance(command, AlterTopic) and _valid_int(command.partitions, MAX_PARTITIONS):
            topic = self.state.topics.get(command.name)
            assert command.partitions is not None
            if topic is not None and command.partitions > topic.partitions:
                extra = self._assign(command.name, topic.partitions, command)
                command = replace(command, assignment=extra)
        validate_proposal(command)
        batch = encode_batch([Record(value=encode_command(command))])
        try:
            index = meta.raft.propose(batch, 1)
        except ProposalDropped as e:
            raise NotLeader(meta.raft.lead) from e
        future: asyncio.Future[MetadataError | None] = asyncio.get_running_loop().create_future()
        self._meta_waiters[index] = (meta.raft.term, future)
        self._wake.set()
        try:
            result = await asyncio.wait_for(future, timeout_s)
        finally:
            self._meta_waiters.pop(index, None)
        if result is not None:
            raise result

    def _assign(
        self, topic: str, first: int, command: CreateTopic | AlterTopic
    ) -> tuple[tuple[str, ...], ...]:
        if isinstance(command, CreateTopic):
            partitions, rf = command.partitions, command.replication_factor
        else:
            assert command.partitions is not None
            partitions, rf = command.partitions, self.state.topics[topic].replication_factor
        candidates = self.candidates()
        eligible = [c for c in candidates if c.eligible]
        if len(eligible) < rf:
            raise MetadataError(
                "invalid",
                f"replication_factor={rf} but only {len(eligible)} brokers can host replicas",
            )
        return tuple(tuple(place(f"{topic}/{p}", candidates, rf)) for p in range(first, partitions))

    # ---- control: placement, hosting, compaction -------------------------------------------

    def _control(self) -> None:
        if self._stopping:
            return
        candidates = self.candidates()
        alive = self.swim_alive()
        meta = self.meta
        if meta is not None:
            if meta.raft.role is Role.LEADER:
                target = metadata_voters(candidates)
                self._reconcile(meta, target, alive, followers=alive)
            self._compact_metadata()
        retain = _now_ms() - self._retained_at_ms >= RETENTION_INTERVAL_MS
        if retain:
            self._retained_at_ms = _now_ms()
        for replica in list(self.replicas.values()):
            raft = replica.raft
            if self._collect_unowned(replica):
                continue
            if retain:
                self._apply_retention(replica)
            topic_state = self.state.topics.get(replica.topic)
            if raft.role is Role.LEADER and topic_state is not None:
                target = place(replica.group, candidates, topic_state.replication_factor)
                self._reconcile(replica, target, alive, followers=frozenset())
                self._queue_duties(replica, topic_state)
            elif (
                replica.group in self._was_member
                and self.id not in raft.conf.members()
                and raft.role is not Role.LEADER
            ):
                self._drop(replica)

    def _collect_unowned(self, replica: Replica) -> bool:
        """Drop `replica` if its topic's deletion is applied here; move it aside if it has no
        recorded topic and the metadata, caught up since it was hosted, does not know its
        topic. True if it went."""
        created = replica.topic_created_index
        if created is not None:
            if not self._topic_deleted(replica.topic, created):
                return False
            log.info("%s: %s: its topic was deleted", self.id, replica.group)
            self._drop(replica)
            return True
        if replica.topic in self.state.topics:
            return False  # hosted before its topic was known: _adopt records it
        if self._barrier_done_ms <= self._hosted_at_ms.get(replica.group, 0):
            self.request_barrier()  # is the metadata behind, or is the topic unknown?
            return False
        self._quarantine(replica)
        return True

    def _quarantine(self, replica: Replica) -> None:
        """Move a replica of a topic the cluster does not know out of the way, keeping it."""
        target = self.data_dir / QUARANTINE_DIR / replica.topic / f"{replica.partition}"
        target = target.with_name(f"{target.name}-{time.time_ns()}")
        self.multi.remove(replica.group)
        self.replicas.pop(replica.group, None)
        self._status.pop(replica.group, None)
        replica.close()
        target.parent.mkdir(parents=True, exist_ok=True)
        replica.path.rename(target)
        self.counters["quarantined_replicas"] += 1
        log.error(
            "%s: %s belongs to no topic the cluster knows and recorded none itself: moved "
            "to %s (kept, not deleted)",
            self.id,
            replica.group,
            target,
        )

    def _queue_duties(self, replica: Replica, topic: Topic) -> None:
        """A partition leader's part in its consumer groups: settings, lease expiry, and
        moving dead letters to `<topic>.dlq`."""
        groups = replica.groups
        assert groups is not None
        try:
            groups.configure(int(topic.config.get("max_deliveries", DEFAULT_MAX_DELIVERIES)))
            groups.expire_due(now_ms())  # the leases' clock: wall time
        except (NotLeader, Overloaded):
            return
        if groups.dead_letters() and replica.group not in self._movers:
            mover = DeadLetterMover(self.internal_client(), replica, topic)
            task = asyncio.get_running_loop().create_task(mover.run(lambda: self.state.topics))
            self._movers[replica.group] = task
            task.add_done_callback(partial(self._mover_done, replica.group))

    def _mover_done(self, group: str, task: asyncio.Task[None]) -> None:
        self._movers.pop(group, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: dead-letter mover failed", group, exc_info=task.exception())

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

    def _apply_retention(self, replica: Replica) -> None:
        """Remove whole committed segments past the topic's retention: first record the
        snapshot point at their end (replicas needing older entries get a snapshot)."""
        config = replica.log.config
        if config.retention_bytes is None and config.retention_ms is None:
            return
        groups = replica.groups
        assert groups is not None
        # the snapshot carries the consumer groups as applied (at or after the point)
        applied = min(replica.commit_index, groups.applier.applied_index)
        point = replica.log.retention_point(limit_index=applied)
        if point is None or point < replica.log.start_index:
            return
        replica.storage.compact(point, groups.applier.snapshot_data())
        report = replica.log.remove_through(point)
        groups.applier.trim()
        removed = len(report.removed_base_indexes)
        log.info("%s: retention removed %d segments", replica.group, removed)

    def _reconcile(
        self, replica: Replica, target: list[str], alive: set[str], *, followers: Iterable[str]
    ) -> None:
        raft = replica.raft
        step = leader_step(
            raft,
            target,
            alive=alive,
            followers=frozenset(followers),
            lag_indexes=CATCH_UP_LAG_INDEXES,
        )
        if step is None:
            return
        try:
            if step.kind is StepKind.TRANSFER_LEADERSHIP:
                raft.transfer_leadership(step.node)
            else:
                if step.kind is StepKind.ADD_LEARNER and replica is self.meta:
                    # a joining node learns the metadata (and the group's configuration)
                    # from a snapshot, never from a log that starts before its bootstrap
                    self._compact_metadata(force=True)
                raft.propose_conf_change(step.conf_change())
        except ProposalDropped:
            return
        log.info("%s %s: %s %s", self.id, replica.group, step.kind.value, step.node)

    def _compact_metadata(self, *, force: bool = False) -> None:
        meta = self.meta
        if meta is None:
            return
        storage = meta.storage
        commit = min(meta.raft.log.committed, self.meta_applied_index)
        if commit < storage.first_index() or commit > storage.last_index():
            return
        if self.state.applied_index > commit:
            return  # the state is ahead of the log (kept through a repair): not a snapshot
        if not force and commit - storage.first_index() < METADATA_COMPACT_ENTRIES:
            return
        if storage.log.batch_range(commit)[1] - 1 != commit:
            return
        storage.compact(commit, self.state.snapshot())
        storage.log.remove_through(commit)

    async def hand_off_leaderships(self, timeout_s: float) -> int:
        """Hand every leadership to a caught-up voter (a broker about to stop: the pod's
        preStop); returns how many groups it still leads after at most `timeout_s`."""
        await self._transfer_leaderships(timeout_s)
        return sum(1 for r in self._all_replicas() if r.raft.role is Role.LEADER)

    async def _transfer_leaderships(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        alive = self.swim_alive()
        while loop.time() < deadline:
            leading = [r for r in self._all_replicas() if r.raft.role is Role.LEADER]
            moved = False
            for replica in leading:
                raft = replica.raft
                if raft.transferee is not None:
                    moved = True
                    continue
                last = raft.log.last_index()
                successors = [
                    n
                    for n in raft.conf.voters
                    if n != self.id and n in alive and raft.progress[n].match >= last - 1
                ] or [n for n in raft.conf.voters if n != self.id and n in alive]
                if successors:
                    with contextlib.suppress(ProposalDropped):
                        raft.transfer_leadership(successors[0])
                        moved = True
                        log.info("%s hands %s to %s", self.id, replica.group, successors[0])
            if not moved:
                return
            self._wake.set()
            await asyncio.sleep(0.05)

    # ---- views for the API -----------------------------------------------------------------

    def _in_sync(self, raft: Raft, alive: set[str]) -> list[str]:
        """A leader's voters within CATCH_UP_LAG_INDEXES of its log (itself included); a
        follower reports only itself."""
        if raft.role is not Role.LEADER:
            return [self.id]
        return sorted(
            n
            for n in raft.progress
            if n in raft.conf.voters
            and (n == self.id or (n in alive and raft.caught_up(n, CATCH_UP_LAG_INDEXES)))
        )

    def group_status(self, replica: Replica) -> dict[str, object]:
        raft: Raft = replica.raft
        in_sync = self._in_sync(raft, self.swim_alive())
        return {
            "topic": replica.topic,
            "partition": replica.partition,
            "role": raft.role.name.lower(),
            "leader": raft.lead,
            "term": raft.term,
            "voters": list(raft.conf.voters),
            "learners": list(raft.conf.learners),
            "in_sync": in_sync,
            "log_start": replica.log_start,
            "commit_index": replica.commit_index,
            "log_end": replica.log_end,
            "bytes": replica.log.size_bytes,
        }

    def hosted(self) -> list[dict[str, object]]:
        return [self.group_status(r) for r in sorted(self.replicas.values(), key=_order)]

    def hosted_structure(self) -> tuple[tuple[object, ...], ...]:
        """What a change of is published at once (status_gossip): the replicas hosted, with
        each one's role, leader, term, configuration and (leaders) in-sync set; not the
        indexes, which move with every write."""
        alive = self.swim_alive()
        shape = []
        for group, replica in self.replicas.items():
            raft = replica.raft
            in_sync = tuple(self._in_sync(raft, alive)) if raft.role is Role.LEADER else ()
            shape.append((group, raft.role, raft.lead, raft.term, raft.conf, in_sync))
        return tuple(shape)

    async def readiness(self, timeout_s: float) -> tuple[bool, str]:
        """Ready: serving, and caught up with the metadata the cluster has committed (a
        metadata barrier completes within `timeout_s`)."""
        if not self._running:
            return False, "starting"
        if self.meta is None:
            return False, "waiting to join the metadata group"
        if self.meta.raft.lead is None:
            return False, "no metadata leader known"
        if not await self.metadata_barrier(timeout_s):
            return False, "not caught up with the cluster metadata"
        return True, "ready"

    # ---- metadata barriers -----------------------------------------------------------------

    async def metadata_barrier(self, timeout_s: float) -> bool:
        """Wait until this node has applied every metadata entry committed before the call
        (Raft's read index, confirmed by the metadata leader with a quorum); False if that
        was not confirmed within `timeout_s` (no leader known, partitioned, far behind)."""
        future = self.request_barrier()
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            return False
        return True

    def request_barrier(self) -> asyncio.Future[None]:
        """A future done once a metadata barrier asked after now completes (see
        `metadata_barrier`); concurrent requests share one read index."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._barrier_next.append(future)
        self._wake.set()
        return future

    def _ask_barrier(self) -> None:
        """Ask the metadata group for a read index for the barriers waiting (a request lost
        on the way is asked again after BARRIER_RETRY_MS)."""
        asked = self._barrier_asked
        now = _now_ms()
        if asked is not None and now - asked[1] >= BARRIER_RETRY_MS:
            self._barrier_next[:0] = asked[2]
            self._barrier_asked = asked = None
        if asked is not None or not self._barrier_next or self.meta is None:
            return
        waiters = [f for f in self._barrier_next if not f.done()]
        if not waiters:
            self._barrier_next = []
            return
        self._barrier_seq += 1
        context = f"barrier-{self._barrier_seq}".encode()
        try:
            self.meta.raft.read_index(context)
        except ProposalDropped:
            return  # no leader known (yet): the waiters stay, bounded by their timeouts
        self._barrier_next = []
        self._barrier_asked = (context, now, waiters)

    def _answered_barrier(self, read_states: list[tuple[bytes, int]]) -> None:
        asked = self._barrier_asked
        for context, index in read_states:
            if asked is not None and context == asked[0]:
                self._barrier_points.append((index, asked[2]))
                self._barrier_asked = None

    def _release_barriers(self) -> None:
        """Complete the barriers whose read index this node has applied."""
        waiting = []
        for index, waiters in self._barrier_points:
            if index > self.meta_applied_index:
                waiting.append((index, waiters))
                continue
            self._barrier_done_ms = _now_ms()
            for future in waiters:
                if not future.done():
                    future.set_result(None)
        self._barrier_points = waiting


#: every member's hosted replicas, as `GET /v1/nodes/{id}/partitions` reports them
View = Mapping[str, list[dict[str, Any]]]


def misplaced_partitions(
    view: View, topics: Mapping[str, Topic], candidates: Sequence[Candidate]
) -> int:
    """How many led partitions are not yet where placement wants them: their leader's Raft
    configuration has learners (replicas catching up) or voters other than the placement's
    choice. 0 once a rebalance (a broker added, drained or reweighted) has converged.
    Leaderless partitions are not counted: they are under-replicated, not moving."""
    leaders = view_leaders(view)
    moving = 0
    for name, topic in topics.items():
        for partition in range(topic.partitions):
            key = partition_key(name, partition)
            report = leaders.get(key)
            if report is None:
                continue
            target = place(key, candidates, topic.replication_factor)
            if report["learners"] or set(report["voters"]) != set(target):
                moving += 1
    return moving


def _valid_int(value: object, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= high


def _order(replica: Replica) -> tuple[str, int]:
    return replica.topic, replica.partition


def _now_ms() -> int:
    return time.monotonic_ns() // 1_000_000
