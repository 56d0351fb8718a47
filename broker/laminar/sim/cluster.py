"""A seeded, deterministic simulation of a multi-Raft cluster under faults.

N nodes run the real `laminar.raft` core over the real segmented log on `MemoryDirectory`
storage, so a crash loses exactly what was not fsynced (optionally leaving a torn tail). A
virtual clock drives ticks and message delivery; leaders change membership; replicas compact
their logs, so laggards need snapshots. The faults are pluggable injectors
(`laminar.sim.faults`, listed in `SimConfig.injectors` or built from its rates): the network
drops, duplicates, delays and reorders messages and partitions; nodes crash (also in the
middle of persisting a Ready, after the write and before the fsync) and restart; a node's
clock jumps ahead (a burst of ticks at once; its wall clock stays ahead); a node's disk fills
up, so that its next growing write fails with ENOSPC and the node fail-stops, to restart once
the disk has room again; a bit flips in a stored batch (then the node restarts, or reads meet
it), and the damaged replica repairs as the broker's do (`laminar.raft.repair`: opened or
reopened cut at the damage, with a repair floor), one damaged replica per group at a time.
After every step the invariants are checked: election safety, log matching, leader
completeness, state-machine safety, and that no entry acknowledged to a client is lost.

Everything random comes from one `random.Random(seed)`; iteration is over sorted keys; no
wall clock is read. A failing seed replays exactly.
"""

from __future__ import annotations

import copy
import heapq
import random
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import xxhash

from ..log.batch import BATCH_HEADER_BYTES, Record, encode_batch
from ..log.config import LogConfig
from ..log.errors import CorruptBatchError
from ..log.segmented_log import SegmentedLog
from ..log.storage import MemoryDirectory, no_space
from ..raft.config import RaftConfig
from ..raft.log_storage import LogStorage
from ..raft.messages import (
    ConfChange,
    ConfChangeKind,
    ConfState,
    Message,
    MessageType,
)
from ..raft.multi import MultiRaft
from ..raft.raft import ProposalDropped, Raft, Ready, Role
from ..raft.repair import Damage, last_entry, open_raft
from ..raft.round import plan
from ..raft.storage import StorageUnavailable, stored_entries
from .faults import (
    BitFlip,
    ClockJump,
    Crash,
    CrashMidWrite,
    Delay,
    DiskFull,
    Drop,
    Duplicate,
    FaultInjector,
    Partition,
    Reorder,
)

TICK_MS = 10
LOG_CONFIG = LogConfig(segment_bytes=4096, max_batch_bytes=2048)
TRACE_LINES = 60
#: more messages than this delivered in one tick fail the run (nodes answering each other at
#: once for ever would hang it)
MAX_DELIVERIES_PER_TICK = 100_000


class InvariantViolation(AssertionError):
    pass


@dataclass(frozen=True)
class SimConfig:
    nodes: int = 5
    #: voters of each group, as node numbers; the default mixes RF 3 and RF 5 groups
    groups: tuple[tuple[int, ...], ...] = ((0, 1, 2, 3, 4), (0, 1, 2), (2, 3, 4))
    ticks: int = 300
    #: after the faulty phase: heal, restart everyone, and run quietly this long
    settle_ticks: int = 150
    #: then at most this many more while a group has no leader (an election under way) or a
    #: member has not committed an acknowledged entry yet
    leader_grace_ticks: int = 60
    drop_rate: float = 0.05
    duplicate_rate: float = 0.02
    max_delay_ms: int = 40
    partition_rate: float = 0.01  # per tick: start a partition (lasts 5-50 ticks)
    crash_rate: float = 0.01  # per tick: crash a node (down 5-40 ticks)
    crash_in_persist_rate: float = 0.003  # per Ready: crash after writing, before fsync
    propose_rate: float = 0.5  # per group per tick
    conf_change_rate: float = 0.01  # per group per tick
    compact_rate: float = 0.005  # per node per group per tick
    #: per node per group per tick: a reader starts (or stops) reading a follower, which then
    #: wants each commit told at once and asks for the commit index first (`Raft.commit_wanted`,
    #: `ask_for_commits`); with no reader a member is told of commits lazily
    read_rate: float = 0.05
    corrupt_rate: float = 0.01  # per tick: a bit flips in a batch a node stored
    # (the faults below came later: off unless a scenario turns them on, as `SCENARIO` does)
    reorder_rate: float = 0.0  # per message: held back 50-250 ms, overtaken by later ones
    clock_jump_rate: float = 0.0  # per tick: a node's clock jumps 2-8 ticks ahead
    disk_full_rate: float = 0.0  # per tick: a node's disk fills up (for 5-40 ticks)
    raft: RaftConfig = field(
        default_factory=lambda: RaftConfig(
            election_ticks=10, heartbeat_ticks=2, max_append_bytes=4096
        )
    )
    #: the faults to inject, in this order (each run works on its own copies); None: the
    #: injectors of the rates above (`fault_injectors`)
    injectors: tuple[FaultInjector, ...] | None = None

    def fault_injectors(self) -> list[FaultInjector]:
        """The injectors of a run: `injectors` if given, else one per non-zero rate."""
        if self.injectors is not None:
            return copy.deepcopy(list(self.injectors))
        rated: list[tuple[float, FaultInjector]] = [
            (self.drop_rate, Drop(self.drop_rate)),
            (self.duplicate_rate, Duplicate(self.duplicate_rate)),
            (self.max_delay_ms, Delay(self.max_delay_ms)),
            (self.reorder_rate, Reorder(self.reorder_rate)),
            (self.partition_rate, Partition(self.partition_rate)),
            (self.crash_rate, Crash(self.crash_rate)),
            (self.corrupt_rate, BitFlip(self.corrupt_rate)),
            (self.clock_jump_rate, ClockJump(self.clock_jump_rate)),
            (self.disk_full_rate, DiskFull(self.disk_full_rate)),
            (self.crash_in_persist_rate, CrashMidWrite(self.crash_in_persist_rate)),
        ]
        return [injector for rate, injector in rated if rate > 0]


#: the Raft scenario (`python -m laminar.sim`): every fault
SCENARIO = SimConfig(reorder_rate=0.01, clock_jump_rate=0.005, disk_full_rate=0.005)


class _AskCheck:
    """A Raft's `on_commit_heard`, checked by the simulation before the node's own runs."""

    def __init__(self, check: Callable[[], None], raft: Raft) -> None:
        self.check = check
        self.then = raft.on_commit_heard

    def __call__(self) -> None:
        self.check()
        self.then()


@dataclass
class SimNode:
    id: str
    number: int
    directories: dict[str, MemoryDirectory] = field(default_factory=dict)
    storages: dict[str, LogStorage] = field(default_factory=dict)
    multi: MultiRaft | None = None
    down_until_ms: int = -1
    #: each hosted group's bootstrap configuration (reused when the node restarts)
    bootstrap: dict[str, ConfState] = field(default_factory=dict)
    #: group -> first damaged index a read met: the group reopens repaired
    damaged: dict[str, int] = field(default_factory=dict)
    #: how far its wall clock runs ahead of the simulation's (`ClockJump`)
    clock_offset_ms: int = 0
    #: groups a reader reads here; those with an ask for the commit index unanswered, with
    #: the term it was asked in and the commit index its leader had then
    reading: set[str] = field(default_factory=set)
    asked: dict[str, tuple[int, int]] = field(default_factory=dict)


class Simulation:
    replay_command = "python -m laminar.sim"

    def __init__(self, seed: int, config: SimConfig | None = None) -> None:
        self.seed = seed
        self.config = config or SCENARIO
        self.injectors = self.config.fault_injectors()
        # those that take part in sending and delivering (the others would cost a call each)
        self.senders = [i for i in self.injectors if _overrides(i, "on_send")]
        self.filters = [i for i in self.injectors if _overrides(i, "delivers")]
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.trace: deque[tuple[int, str | Message]] = deque(maxlen=TRACE_LINES)
        self.nodes = {f"n{i}": SimNode(f"n{i}", i) for i in range(self.config.nodes)}
        self.group_names = [f"g{i}" for i in range(len(self.config.groups))]
        self.in_flight: list[tuple[int, int, Message]] = []
        self.message_seq = 0
        # invariants
        self.leaders: dict[tuple[str, int], str] = {}
        self.entries_seen: dict[tuple[str, int, int], tuple[int, tuple[int, int]]] = {}
        self.committed: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)
        self.acked: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)
        self.proposals: dict[str, dict[int, tuple[int, int, str]]] = defaultdict(dict)
        self.leader_terms: dict[tuple[str, str], int] = {}
        self.next_tag = 0
        self.faulty = True
        self.stats = {
            "acked": 0,
            "elections": 0,
            "crashes": 0,
            "snapshots": 0,
            "confs": 0,
            "bit_flips": 0,
            "repairs": 0,
            "disk_full_crashes": 0,
            "commit_asks": 0,
            "commit_asks_answered": 0,
        }
        for injector in self.injectors:
            self.stats.setdefault(injector.stat, 0)
        #: group -> (node, index) of a bit flip, until that replica no longer holds it damaged
        #: (damage on a majority of a group is beyond what replication can survive)
        self.unrepaired: dict[str, tuple[str, int]] = {}
        for node in self._initial_nodes():
            for group, voters in zip(self.group_names, self.config.groups, strict=True):
                node.bootstrap[group] = ConfState(tuple(sorted(f"n{v}" for v in voters)))
            self._start(node)

    def _initial_nodes(self) -> list[SimNode]:
        return list(self.nodes.values())

    # ---- nodes -----------------------------------------------------------------------------

    def _start(self, node: SimNode) -> None:
        """Start (or restart, reopening its storage) a node with the groups it hosts."""
        node.multi = MultiRaft(node.id)
        for group, conf in sorted(node.bootstrap.items()):
            self._host(node, group, conf)

    def _host(
        self,
        node: SimNode,
        group: str,
        conf: ConfState,
        *,
        repair_at: int | None = None,
        joining: bool = False,
    ) -> None:
        """Run `group` on a live node, bootstrapped with `conf` if its storage is new (as a
        joining member: `HardState.joining`), repaired (as the broker's replicas are) where
        its log is damaged."""
        assert node.multi is not None
        node.bootstrap.setdefault(group, conf)
        if group not in node.directories:
            full = self._disk_full(node)
            node.directories[group] = MemoryDirectory(0 if full else None)
        directory = node.directories[group]
        log = SegmentedLog.open(directory, LOG_CONFIG, clock_ms=lambda: self.clock_ms(node))
        storage = LogStorage(directory, log, conf=conf, joining=joining)
        node.storages[group] = storage
        damage = None
        if repair_at is not None:
            damage = Damage(repair_at, last_entry(storage), f"damaged batch at {repair_at}")
        rng = random.Random(self.rng.getrandbits(64))
        raft, _, repairs = open_raft(
            group, node.id, storage, self.config.raft, rng, lambda: None, damage
        )
        for repaired in repairs:
            self.stats["repairs"] += 1
            self._log(f"{node.id} {group} repairs from {repaired.first_index} ({repaired.reason})")
        log.on_corrupt = lambda error: self._met_damage(node, group, error)
        raft.commit_wanted = partial(node.reading.__contains__, group)
        node.multi.add(raft)

    def _toggle_reader(self, node: SimNode, group: str) -> None:
        """A reader starts or stops reading `group` on `node`; one that starts asks for the
        commit index first, as the broker's reads do (`Replica.fresh`)."""
        if group in node.reading:
            node.reading.discard(group)
            return
        node.reading.add(group)
        raft = node.multi.groups.get(group) if node.multi is not None else None
        if raft is None or not raft.ask_for_commits():
            return
        if not isinstance(raft.on_commit_heard, _AskCheck):
            raft.on_commit_heard = _AskCheck(partial(self._commit_heard, node, group), raft)
        commit = -1  # (its leader, as this node knows it, may be down or deposed)
        multi = self.nodes[raft.lead].multi if raft.lead is not None else None
        leader = multi.groups.get(group) if multi is not None else None
        if leader is not None and leader.role is Role.LEADER and leader.term == raft.term:
            commit = leader.log.committed
        node.asked[group] = (raft.term, commit)
        self.stats["commit_asks"] += 1
        self._process(node)

    def _commit_heard(self, node: SimNode, group: str) -> None:
        """An ask's answer arrived (or its term or role ended): an answer in the term it was
        asked in tells at least the commit index the leader had when it was asked."""
        asked = node.asked.pop(group, None)
        raft = node.multi.groups.get(group) if node.multi is not None else None
        if asked is None or raft is None or raft.term != asked[0] or raft.commit_told < 0:
            return
        self.stats["commit_asks_answered"] += 1
        if raft.commit_told < asked[1]:
            self._fail(
                f"{node.id} asked for {group}'s commit index in term {asked[0]}, when its leader "
                f"had committed {asked[1]}, and was told {raft.commit_told}"
            )

    def _met_damage(self, node: SimNode, group: str, error: CorruptBatchError) -> None:
        node.damaged[group] = min(error.index, node.damaged.get(group, error.index))

    def _repair_damaged(self, node: SimNode) -> None:
        """Reopen the groups whose reads met damage, repaired (the broker does the same
        between two rounds)."""
        damaged, node.damaged = node.damaged, {}
        for group, index in sorted(damaged.items()):
            if node.multi is None or group not in node.multi.groups:
                continue
            conf = node.multi.groups[group].conf
            node.multi.remove(group)
            node.storages[group].log.close()
            self._host(node, group, conf, repair_at=index)

    def _forget_repaired(self) -> None:
        """A flipped batch is repaired once its node holds it whole again (or no longer
        holds it) and has left the repair."""
        for group, (node_id, index) in sorted(self.unrepaired.items()):
            node = self.nodes[node_id]
            raft = node.multi.groups.get(group) if node.multi is not None else None
            storage = node.storages.get(group)
            if raft is None or storage is None or node.damaged:
                continue
            if raft.repair_floor is not None or storage.hard_state.repair_floor is not None:
                continue
            log = storage.log
            if log.start_index <= index < log.next_index:
                hook, log.on_corrupt = log.on_corrupt, None  # the check is not the node's read
                try:
                    log.read(index)
                except CorruptBatchError:
                    continue
                finally:
                    log.on_corrupt = hook
            del self.unrepaired[group]

    def _crash(self, node: SimNode, *, torn: bool) -> None:
        self._log(f"crash {node.id}{' (torn)' if torn else ''}")
        self.stats["crashes"] += 1
        for _, directory in sorted(node.directories.items()):
            directory.crash(self.rng if torn else None)
        node.multi = None
        node.storages = {}
        node.reading.clear()
        node.asked.clear()
        node.down_until_ms = self.now_ms + TICK_MS * self.rng.randint(5, 40)

    def _restart_due(self) -> None:
        """Restart the crashed nodes whose downtime is over (and whose disk has room)."""
        for node in sorted(self.nodes.values(), key=lambda n: n.id):
            down = node.multi is None and 0 <= node.down_until_ms <= self.now_ms
            if down and not self._disk_full(node):
                self._log(f"restart {node.id}")
                self._start(node)

    def _alive(self) -> list[SimNode]:
        return [n for _, n in sorted(self.nodes.items()) if n.multi is not None]

    def after_ticks(self, ticks: int) -> int:
        """The virtual time `ticks` from now."""
        return self.now_ms + TICK_MS * ticks

    # ---- clocks and disks ------------------------------------------------------------------

    def clock_ms(self, node: SimNode) -> int:
        """`node`'s wall clock (ahead of the simulation's once it jumped)."""
        return self.now_ms + node.clock_offset_ms

    def jump_clock(self, node: SimNode, ticks: int) -> None:
        """`node`'s clock jumps `ticks` ahead: its wall clock stays ahead, and its groups get
        the ticks at once, before it persists anything (as the broker's round would)."""
        assert node.multi is not None
        node.clock_offset_ms += TICK_MS * ticks
        for _ in range(ticks):
            node.multi.tick()
        self._process(node)

    def _disk_full(self, node: SimNode) -> bool:
        """Whether `node`'s disk is full (`DiskFull`): a limit on its writes is set."""
        return any(d.capacity_bytes is not None for d in node.directories.values())

    def _stop_if_no_space(self, node: SimNode, error: Exception) -> None:
        """`error` interrupted storage work of `node`: re-raise it, unless it is a write
        refused for want of space (ENOSPC). That stops the node, as a broker does not go on
        from half a round: it crashes, losing what it did not fsync, and restarts only once
        its disk has room again."""
        if not no_space(error) or node.multi is None:
            raise error
        self.stats["disk_full_crashes"] += 1
        self._log(f"{node.id} stops: no space left on its disk ({error})")
        self._crash(node, torn=False)

    # ---- network ---------------------------------------------------------------------------

    def _send(self, message: Message) -> None:
        """Send through the network injectors, in order: each turns every delivery into
        none, one or more, their delays adding up."""
        deliveries = [(0, message)]
        for injector in self.senders:
            deliveries = [
                (delay + more, out)
                for delay, sent in deliveries
                for more, out in injector.on_send(self, sent)
            ]
        for delay, out in deliveries:
            self.message_seq += 1
            heapq.heappush(self.in_flight, (self.now_ms + delay, self.message_seq, out))

    def _deliver_due(self) -> None:
        delivered = 0
        while self.in_flight and self.in_flight[0][0] <= self.now_ms:
            _, _, message = heapq.heappop(self.in_flight)
            delivered += 1
            if delivered > MAX_DELIVERIES_PER_TICK:
                self._fail(f"over {MAX_DELIVERIES_PER_TICK} messages in one tick: a livelock")
            node = self.nodes[message.dst]
            if node.multi is None or not all(i.delivers(self, message) for i in self.filters):
                continue
            try:
                self._before_deliver(node, message)
                self.trace.append((self.now_ms, message))  # formatted only if a check fails
                assert node.multi is not None
                node.multi.step(message)
                self._process(node)
            except Exception as e:
                self._stop_if_no_space(node, e)

    # ---- the runtime: persist, send, advance -----------------------------------------------

    def _process(self, node: SimNode) -> None:
        self._drain(node)
        self._check_leaders(node)

    def _drain(self, node: SimNode) -> None:
        """Every Ready of `node`, each carried out as the broker does it (raft/round.py): the
        same steps in the same order, with a crash possible once entries are written and the
        early messages sent, before the sync (`CrashMidWrite`), and a full disk stopping the
        node at any write."""
        try:
            self._drain_rounds(node)
        except Exception as e:
            self._stop_if_no_space(node, e)

    def _drain_rounds(self, node: SimNode) -> None:
        while node.multi is not None:
            readies, messages = node.multi.ready()
            if not readies and not messages:
                return
            round_ = plan(readies, messages)
            for group, ready in readies.items():  # 1, 2: snapshots, entries written
                storage = node.storages[group]
                if ready.snapshot is not None:
                    storage.apply_snapshot(ready.snapshot)
                    self.stats["snapshots"] += 1
                    self._log(f"{node.id} {group} installs snapshot at {ready.snapshot.index}")
                    self._on_snapshot(node, group)
                if ready.entries:
                    storage.append(ready.entries)
                    self._on_written(node, group, ready)
            for message in round_.before:  # 3: before they are durable
                self._send(message)
            for group, ready in readies.items():  # 4: committed (durable on a majority)
                if ready.committed is not None:
                    self._check_commit(node, group, ready.committed)
                    self._on_commit(node, group, ready.committed)
            if (
                round_.written
                and self.faulty
                and any(injector.on_persist(self, node) for injector in self.injectors)
            ):
                return  # crashed: written and sent, never fsynced
            for group in round_.written:  # 5: the sync
                node.storages[group].sync()
                self._check_entries(node, group, readies[group])
            for group, ready in readies.items():  # 6: hard states
                if ready.hard_state is not None:
                    node.storages[group].set_hard_state(ready.hard_state)
            for message in round_.after:  # 7: acknowledgements and votes, once durable
                self._send(message)
            node.multi.advance(readies)  # 8

    # ---- the client ------------------------------------------------------------------------

    def _led(self) -> bool:
        """Does every group have a leader?"""
        return all(self._leader_of(group) is not None for group in self.group_names)

    def _leader_of(self, group: str) -> tuple[SimNode, Raft] | None:
        for node in self._alive():
            assert node.multi is not None
            raft = node.multi.groups.get(group)
            if raft is not None and raft.role is Role.LEADER:
                return node, raft
        return None

    def _propose(self, group: str) -> None:
        found = self._leader_of(group)
        if found is None:
            return
        node, raft = found
        tag = self.next_tag
        self.next_tag += 1
        count = self.rng.randint(1, 3)
        batch = encode_batch(
            [Record(value=f"{group}:{tag}:{i}".encode()) for i in range(count)], now_ms=tag
        )
        try:
            index = raft.propose(batch, count)
        except ProposalDropped:
            return
        self.proposals[group][index] = (raft.term, _hash(batch), node.id)
        self._on_records_proposed(node, raft)
        self._process(node)

    def _on_records_proposed(self, node: SimNode, raft: Raft) -> None:
        """The leader `node` proposed records on `raft` and has not persisted them yet (a
        scenario may propose more behind them, to go in the same Ready)."""

    def _change_membership(self, group: str) -> None:
        found = self._leader_of(group)
        if found is None:
            return
        node, raft = found
        conf = raft.conf
        outsiders = [n for n in sorted(self.nodes) if n not in conf.members()]
        if conf.learners:
            change = ConfChange(ConfChangeKind.PROMOTE, conf.learners[0])
        elif len(conf.voters) > 3:
            change = ConfChange(ConfChangeKind.REMOVE, self.rng.choice(conf.voters))
        elif outsiders:
            change = ConfChange(ConfChangeKind.ADD_LEARNER, self.rng.choice(outsiders))
        else:
            return
        self._propose_conf_change(node, raft, change)

    def _propose_conf_change(self, node: SimNode, raft: Raft, change: ConfChange) -> bool:
        """Propose a membership change on a leader; False if the core refused it for now."""
        try:
            raft.propose_conf_change(change)
        except ProposalDropped:
            return False
        self.stats["confs"] += 1
        self._log(f"{node.id} {raft.group} proposes {change.kind.name} {change.node}")
        self._process(node)
        return True

    # ---- hooks for scenarios built on this simulation --------------------------------------

    def _before_deliver(self, node: SimNode, message: Message) -> None:
        """Called before a message reaches a live node (e.g. to create a group on demand)."""

    def _on_written(self, node: SimNode, group: str, ready: Ready) -> None:
        """A Ready's entries were just written (not durable yet), before anything is applied:
        where the broker hands them to the queue applier."""

    def _on_commit(self, node: SimNode, group: str, committed: tuple[int, int]) -> None:
        """Called for a Ready that committed [first, last] of `group` (durable on a majority),
        once its entries are written and its early messages sent, before its sync."""

    def _on_snapshot(self, node: SimNode, group: str) -> None:
        """Called after a node installed a snapshot of `group` (its storage holds it)."""

    def _control(self, node: SimNode) -> None:
        """Called for every live node once a tick, after message delivery."""

    def _compact(self, node: SimNode, group: str) -> None:
        assert node.multi is not None
        storage = node.storages[group]
        commit = node.multi.groups[group].log.committed
        if commit <= storage.first_index() or commit > storage.last_index():
            return
        storage.compact(commit)
        storage.log.remove_through(commit)
        self._log(f"{node.id} {group} compacts through {commit}")

    # ---- invariants ------------------------------------------------------------------------

    def _fail(self, message: str) -> None:
        raise InvariantViolation(message)

    def _check_entries(self, node: SimNode, group: str, ready: Ready) -> None:
        """Log matching: an (index, term) names one entry with one predecessor, everywhere."""
        storage = node.storages[group]
        first = ready.entries[0]
        previous = (first.index - 1, storage.term(first.index - 1))
        for entry in ready.entries:
            key = (group, entry.index, entry.term)
            value = (_hash(entry.data), previous)
            seen = self.entries_seen.setdefault(key, value)
            if seen != value:
                self._fail(
                    f"log matching: {node.id} holds {group} entry {entry.index} of term "
                    f"{entry.term} unlike another node's"
                )
            previous = (entry.last_index, entry.term)

    def _check_commit(self, node: SimNode, group: str, committed: tuple[int, int]) -> None:
        """State-machine safety: every node commits the same entry at every index (a damaged
        one is checked when the repaired node commits it again)."""
        try:
            entries = list(stored_entries(node.storages[group], *committed))
        except StorageUnavailable:
            return
        for entry in entries:
            value = (entry.term, _hash(entry.data))
            known = self.committed[group].setdefault(entry.index, value)
            if known != value:
                self._fail(
                    f"state-machine safety: {node.id} committed {group}@{entry.index} "
                    f"term {entry.term}, others term {known[0]}"
                )
            proposal = self.proposals[group].get(entry.index)
            acked = self.acked[group]
            if proposal is not None and proposal[:2] == value and entry.index not in acked:
                acked[entry.index] = value
                self.stats["acked"] += 1

    def _check_leaders(self, node: SimNode) -> None:
        """Election safety (one leader per term) and leader completeness, for a node that
        just processed input (so a leadership however brief is seen)."""
        if node.multi is None:
            return
        for group, raft in sorted(node.multi.groups.items()):
            if raft.role is not Role.LEADER:
                continue
            holder = self.leaders.setdefault((group, raft.term), node.id)
            if holder != node.id:
                self._fail(
                    f"election safety: {holder} and {node.id} lead {group} in term {raft.term}"
                )
            if self.leader_terms.get((group, node.id)) == raft.term:
                continue
            self.leader_terms[(group, node.id)] = raft.term
            self.stats["elections"] += 1
            self._log(f"{node.id} leads {group} in term {raft.term}")
            first = raft.log.first_index()
            for index, (term, _) in sorted(self.committed[group].items()):
                if index >= first and raft.log.term(index) != term:
                    self._fail(
                        f"leader completeness: {node.id} leads {group} in term "
                        f"{raft.term} without committed entry {index} (term {term})"
                    )

    def _check_acked_everywhere(self) -> None:
        """After settling: each group has a leader, and every acknowledged entry is committed
        on every member of the leader's configuration (a removed node never learns that it
        was removed, so its own view does not count)."""
        problem = self._acked_missing()
        if problem is not None:
            self._fail(problem)

    def _acked_missing(self) -> str | None:
        """What `_check_acked_everywhere` finds wrong first, or None."""
        for group in self.group_names:
            found = self._leader_of(group)
            if found is None:
                return f"no leader for {group} after settling"
            for node_id in found[1].conf.members():
                node = self.nodes[node_id]
                raft = node.multi.groups.get(group) if node.multi is not None else None
                if raft is None:
                    return f"{node_id} is a member of {group} but is down or lacks it"
                for index, (term, _) in sorted(self.acked[group].items()):
                    if index < raft.log.first_index():
                        continue
                    if index > raft.log.committed or raft.log.term(index) != term:
                        return (
                            f"acknowledged entry lost: {group}@{index} (term {term}) is not "
                            f"committed on {node.id} (commit {raft.log.committed})"
                        )
        return None

    # ---- the run ---------------------------------------------------------------------------

    def _log(self, line: str) -> None:
        self.trace.append((self.now_ms, line))

    def _faults(self) -> None:
        self._restart_due()
        for injector in self.injectors:
            injector.on_tick(self)

    def _tick(self, *, faulty: bool) -> None:
        self.now_ms += TICK_MS
        self.faulty = faulty
        if faulty:
            self._faults()
        for node in self._alive():
            if node.damaged:
                try:
                    self._repair_damaged(node)
                except Exception as e:
                    self._stop_if_no_space(node, e)
            if node.multi is None:
                continue  # stopped: no space to repair
            node.multi.tick()
            self._process(node)
        self._deliver_due()
        self._forget_repaired()
        for node in self._alive():
            self._control(node)
        if faulty:  # the settle phase is quiet, so that every commit can reach everyone
            for group in self.group_names:
                if self.rng.random() < self.config.propose_rate:
                    self._propose(group)
                if self.rng.random() < self.config.conf_change_rate:
                    self._change_membership(group)
        if faulty:
            for node in self._alive():
                for group in self.group_names:
                    if self.rng.random() < self.config.read_rate:
                        self._toggle_reader(node, group)
                    if node.multi is not None and self.rng.random() < self.config.compact_rate:
                        try:
                            self._compact(node, group)
                        except Exception as e:
                            self._stop_if_no_space(node, e)

    def run(self) -> dict[str, int]:
        try:
            for _ in range(self.config.ticks):
                self._tick(faulty=True)
            self._log("heal everything and settle")
            for injector in self.injectors:
                injector.heal(self)
            for node in sorted(self.nodes.values(), key=lambda n: n.id):
                if node.multi is None and node.down_until_ms >= 0:
                    self._start(node)
            for _ in range(self.config.settle_ticks):
                self._tick(faulty=False)
            # The network still drops messages: an election may be under way at the end
            # (a follower woken by a suspicion, its leader's quiesce request lost). It gets
            # a bounded grace to finish, and for the commits it makes to reach every member;
            # a group still leaderless, or a member still behind, after it fails the run.
            for _ in range(self.config.leader_grace_ticks):
                if self._acked_missing() is None:
                    break
                self._tick(faulty=False)
            self._check_acked_everywhere()
            outcome = repr([sorted(self.committed[g].items()) for g in self.group_names])
            # a fingerprint of everything committed: equal runs give equal digests
            self.stats["digest"] = int(xxhash.xxh32_intdigest(outcome.encode()))
        except InvariantViolation as e:
            raise InvariantViolation(self.report(str(e))) from None
        except Exception as e:
            raise InvariantViolation(self.report(f"{type(e).__name__}: {e}")) from e
        return dict(self.stats)

    def report(self, problem: str) -> str:
        lines = [f"seed {self.seed} failed at t={self.now_ms} ms: {problem}", "last events:"]
        for at_ms, event in self.trace:
            text = event if isinstance(event, str) else _describe(event)
            lines.append(f"  t={at_ms:>6} {text}")
        lines.append(f"replay: {self.replay_command} --seed {self.seed}")
        return "\n".join(lines)


def _overrides(injector: FaultInjector, hook: str) -> bool:
    return getattr(type(injector), hook) is not getattr(FaultInjector, hook)


def _hash(data: bytes) -> int:
    """An entry's identity: its records, not the index and term the log stamps into it."""
    return int(xxhash.xxh3_64_intdigest(memoryview(data)[BATCH_HEADER_BYTES:]))


def _describe(message: Message) -> str:
    kind = message.type.name
    text = f"{message.src}->{message.dst} {kind}"
    if message.type in (MessageType.HEARTBEATS, MessageType.HEARTBEATS_RESP):
        return f"{text} x{len(message.batch)}"
    text += f" {message.group} t{message.term}"
    if message.type is MessageType.APPEND:
        text += (
            f" prev={message.index}/{message.log_term} n={len(message.entries)} c={message.commit}"
        )
    elif message.type is MessageType.APPEND_RESP:
        text += f" idx={message.index}"
        if message.reject:
            text += f" REJECT hint={message.reject_hint}"
    elif message.reject:
        text += " reject"
    return text


def run_seed(seed: int, config: SimConfig | None = None) -> dict[str, int]:
    return Simulation(seed, config).run()
