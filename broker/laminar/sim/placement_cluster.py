"""The placement scenario: partitions follow weighted rendezvous placement while nodes join,
drain, change weight and crash, all driven through the `__cluster` metadata group.

Three nodes start with the metadata group; a topic of 50 partitions (RF 3) is created through
it; two more nodes join; one node is drained; one node's weight changes; then the metadata
group's leader crashes for good, after which the group must still accept a weight change.
Every partition leader moves its Raft configuration one step at a time toward its rendezvous
target (`laminar.partition.reconcile`), and the metadata group's leader does the same for the
metadata voters (every other live node follows it as a learner). On top of the base
simulation's invariants, after settling: every partition and the metadata group match their
targets, and every acknowledged record is still committed.

Membership (who is alive) comes from the simulation itself here; SWIM supplies it for real.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..log.batch import Record, decode_batch, encode_batch
from ..metadata import (
    METADATA_GROUP,
    ClusterState,
    Command,
    CreateTopic,
    SetDraining,
    SetWeight,
    metadata_voters,
)
from ..metadata.state import decode_command, encode_command
from ..partition.reconcile import StepKind, leader_step
from ..placement import Candidate, partition_key, place
from ..raft.config import RaftConfig
from ..raft.messages import ConfState, EntryKind, Message, MessageType
from ..raft.raft import ProposalDropped, Raft, Role
from ..raft.storage import stored_entries
from .cluster import SimConfig, SimNode, Simulation

METADATA = METADATA_GROUP
TOPIC = "events"
PARTITIONS = 50
REPLICATION_FACTOR = 3
CATCH_UP_LAG_INDEXES = 64
RETRY_ADMIN_TICKS = 50
LEADER_MESSAGES = frozenset({MessageType.APPEND, MessageType.HEARTBEAT, MessageType.SNAPSHOT})
#: how long a replica its leader no longer counts runs on before it is dropped
DROP_AFTER_TICKS = 40

SCENARIO = SimConfig(
    nodes=5,
    groups=(),
    ticks=1200,
    settle_ticks=400,
    drop_rate=0.02,
    duplicate_rate=0.01,
    max_delay_ms=30,
    partition_rate=0.0,
    crash_rate=0.0,  # the one crash is scripted
    crash_in_persist_rate=0.0,
    propose_rate=0.2,
    conf_change_rate=0.0,  # membership changes come from reconciliation only
    compact_rate=0.0,
    corrupt_rate=0.0,
    raft=RaftConfig(
        election_ticks=10,
        heartbeat_ticks=2,
        max_append_bytes=8192,
        promote_lag_indexes=CATCH_UP_LAG_INDEXES,
    ),
)


def group_of(partition: int) -> str:
    return partition_key(TOPIC, partition)


class PlacementSimulation(Simulation):
    replay_command = "python -m laminar.sim --placement"

    def __init__(
        self, seed: int, config: SimConfig = SCENARIO, *, partitions: int = PARTITIONS
    ) -> None:
        self.partitions = partitions
        self.states: dict[str, ClusterState] = {}
        self.joined: list[str] = []
        self.initial_metadata = ConfState(("n0", "n1", "n2"))
        self.admin: list[Command] = []
        self.admin_sent: tuple[int, int, int] | None = None  # (index, term, tick) in flight
        self.ticks = 0
        #: (node, group) -> the tick its leader was first seen not counting it
        self.excluded_since: dict[tuple[str, str], int] = {}
        super().__init__(seed, config)
        self.group_names = []  # partition groups, added when the topic exists

    # ---- nodes -----------------------------------------------------------------------------

    def _initial_nodes(self) -> list[SimNode]:
        return [self.nodes[n] for n in self.initial_metadata.voters]

    def _start(self, node: SimNode) -> None:
        if node.id not in self.joined:
            self.joined.append(node.id)
            node.bootstrap[METADATA] = self.initial_metadata
        super()._start(node)
        # The metadata state machine is rebuilt from its snapshot and the committed log.
        self._restore_metadata(node)
        storage = node.storages[METADATA]
        commit = storage.initial_state()[0].commit
        if commit >= storage.first_index():
            self._apply_metadata(node, (storage.first_index(), commit))

    def _restore_metadata(self, node: SimNode) -> None:
        data = node.storages[METADATA].snapshot().data
        self.states[node.id] = ClusterState.restore(data) if data else ClusterState()

    def _candidates(self, state: ClusterState) -> list[Candidate]:
        return [
            Candidate(
                n,
                state.weight(n),
                alive=self.nodes[n].multi is not None,
                draining=n in state.draining,
            )
            for n in sorted(self.joined)
        ]

    # ---- metadata --------------------------------------------------------------------------

    def _on_commit(self, node: SimNode, group: str, committed: tuple[int, int]) -> None:
        if group == METADATA:
            self._apply_metadata(node, committed)

    def _on_snapshot(self, node: SimNode, group: str) -> None:
        if group == METADATA:
            self._restore_metadata(node)
            self.stats["metadata_snapshots"] = self.stats.get("metadata_snapshots", 0) + 1

    def _compact_metadata(self) -> None:
        """Every node compacts its metadata log, snapshotting the state machine: nodes that
        join later must learn the topics from a snapshot."""
        for node in self._alive():
            assert node.multi is not None
            storage = node.storages[METADATA]
            commit = node.multi.groups[METADATA].log.committed
            state = self.states[node.id]
            if commit < storage.first_index() or commit > storage.last_index():
                continue
            storage.compact(commit, state.snapshot())
            storage.log.remove_through(commit)
            self._log(f"{node.id} compacts {METADATA} through {commit}")

    def _apply_metadata(self, node: SimNode, committed: tuple[int, int]) -> None:
        state = self.states[node.id]
        created = False
        for entry in stored_entries(node.storages[METADATA], *committed):
            if entry.index > state.applied_index and entry.kind is EntryKind.NORMAL:
                (record,) = decode_batch(entry.data)
                assert record.value is not None
                command = decode_command(record.value)
                created |= state.apply(entry.index, command) is None and isinstance(
                    command, CreateTopic
                )
        if created:  # as the broker: only the command that made the partitions hosts them
            self._host_assigned(node)

    def _host_assigned(self, node: SimNode) -> None:
        """Host the partitions whose initial voters include this node."""
        topic = self.states[node.id].topics.get(TOPIC)
        if topic is None:
            return
        if not self.group_names:
            self.group_names = [group_of(p) for p in range(topic.partitions)]
        for partition, voters in enumerate(topic.assignment):
            group = group_of(partition)
            if node.id in voters and node.multi is not None and group not in node.multi.groups:
                self._host(node, group, ConfState(tuple(sorted(voters))))

    def _before_deliver(self, node: SimNode, message: Message) -> None:
        """A node added to a group learns of it from the leader's first message (as the
        broker does: only a leader's message creates a replica, and it starts joining)."""
        assert node.multi is not None
        folded = (MessageType.HEARTBEATS, MessageType.HEARTBEATS_RESP)
        parts = message.batch if message.type in folded else (message,)
        topic = self.states[node.id].topics.get(TOPIC)
        for part in parts:
            if part.group in node.multi.groups:
                continue
            if part.group == METADATA:
                self._host(node, METADATA, self.initial_metadata)
            elif (
                topic is not None
                and part.group.startswith(TOPIC + "/")
                and part.type in LEADER_MESSAGES
            ):
                partition = int(part.group.rsplit("/", 1)[1])
                voters = topic.assignment[partition]
                self._host(node, part.group, ConfState(tuple(sorted(voters))), joining=True)

    # ---- control: admin commands and reconciliation ----------------------------------------

    def _control(self, node: SimNode) -> None:
        assert node.multi is not None
        self._drop_removed(node)
        state = self.states[node.id]
        for group, raft in sorted(node.multi.groups.items()):
            if raft.role is not Role.LEADER:
                continue
            if group == METADATA:
                self._send_admin(node, raft, state)
                target = metadata_voters(self._candidates(state))
            else:
                topic = state.topics.get(TOPIC)
                if topic is None:
                    continue
                target = place(group, self._candidates(state), topic.replication_factor)
            self._reconcile(node, raft, target, followers=group == METADATA)

    def _drop_removed(self, node: SimNode) -> None:
        """As the broker collects them: a replica that its group's leader (of a term at least
        its own) no longer counts is dropped with its data. A message still in flight may
        reach the node afterwards (`_before_deliver`). Like the broker's, the collection
        lags: a removed replica runs on for a while (and campaigns, unheard by its leader)."""
        assert node.multi is not None
        for group, raft in sorted(node.multi.groups.items()):
            if group == METADATA or raft.role is Role.LEADER:
                continue
            found = self._leader_of(group)
            excluded = found is not None and (
                node.id not in found[1].conf.members() and found[1].term >= raft.term
            )
            if not excluded:
                self.excluded_since.pop((node.id, group), None)
                continue
            since = self.excluded_since.setdefault((node.id, group), self.ticks)
            if self.ticks - since < DROP_AFTER_TICKS:
                continue
            del self.excluded_since[(node.id, group)]
            assert found is not None
            leader = found[1]
            self._log(f"{node.id} {group}: dropped (not in {leader.conf})")
            self.stats["dropped"] = self.stats.get("dropped", 0) + 1
            node.multi.remove(group)
            node.directories.pop(group, None)
            node.storages.pop(group, None)
            node.bootstrap.pop(group, None)

    def _reconcile(self, node: SimNode, raft: Raft, target: list[str], *, followers: bool) -> None:
        alive = {n for n in self.joined if self.nodes[n].multi is not None}
        step = leader_step(
            raft,
            target,
            alive=alive,
            followers=alive if followers else frozenset(),
            lag_indexes=CATCH_UP_LAG_INDEXES,
        )
        if step is None:
            return
        if step.kind is StepKind.TRANSFER_LEADERSHIP:
            try:
                raft.transfer_leadership(step.node)
            except ProposalDropped:
                return
            self._log(f"{node.id} {raft.group}: transfer leadership to {step.node}")
            self.stats["transfers"] = self.stats.get("transfers", 0) + 1
            self._process(node)
            return
        self._propose_conf_change(node, raft, step.conf_change())

    def _send_admin(self, node: SimNode, raft: Raft, state: ClusterState) -> None:
        if not self.admin:
            return
        if self.admin_sent is not None:
            index, term, tick = self.admin_sent
            if self.committed[METADATA].get(index, (None,))[0] == term:
                self.admin.pop(0)
                self.admin_sent = None
            elif self.ticks - tick < RETRY_ADMIN_TICKS:
                return
        if not self.admin:
            return
        command = self.admin[0]
        if isinstance(command, CreateTopic) and not command.assignment:
            command = replace(
                command,
                assignment=tuple(
                    tuple(place(group_of(p), self._candidates(state), command.replication_factor))
                    for p in range(command.partitions)
                ),
            )
            self.admin[0] = command
        batch = encode_batch([Record(value=encode_command(command))], now_ms=self.now_ms)
        try:
            index = raft.propose(batch, 1)
        except ProposalDropped:
            return
        self.admin_sent = (index, raft.term, self.ticks)
        self._log(f"{node.id} proposes {type(command).__name__}")
        self._process(node)

    # ---- the script ------------------------------------------------------------------------

    def _tick(self, *, faulty: bool) -> None:
        self.ticks += 1
        script: dict[int, Callable[[], None]] = {
            30: lambda: self.admin.append(CreateTopic(TOPIC, self.partitions, REPLICATION_FACTOR)),
            100: self._compact_metadata,
            150: self._join_two_nodes,
            300: lambda: self.admin.append(SetDraining("n1", True)),
            450: lambda: self.admin.append(SetWeight("n2", 3)),
            600: self._crash_metadata_leader,
            # the metadata group must still take writes without its old leader
            750: lambda: self.admin.append(SetWeight("n3", 2)),
        }
        action = script.get(self.ticks)
        if action is not None:
            self._log(f"script at tick {self.ticks}")
            action()
        super()._tick(faulty=faulty)

    def _join_two_nodes(self) -> None:
        for name in ("n3", "n4"):
            self._start(self.nodes[name])

    def _crash_metadata_leader(self) -> None:
        found = self._leader_of(METADATA)
        if found is not None:
            node = found[0]
            self._crash(node, torn=True)
            node.down_until_ms = -1  # for good

    def run(self) -> dict[str, int]:
        super().run()
        try:
            self._check_converged()
        except AssertionError as e:
            raise type(e)(self.report(str(e))) from None
        return dict(self.stats)

    def _check_converged(self) -> None:
        leader = self._leader_of(METADATA)
        if leader is None:
            self._fail("the metadata group has no leader after settling")
            return
        state = self.states[leader[0].id]
        if (
            TOPIC not in state.topics
            or state.draining != {"n1"}
            or state.weight("n2") != 3
            or state.weight("n3") != 2
        ):
            self._fail(f"admin commands missing from metadata: {state.snapshot()!r}")
        candidates = self._candidates(state)
        metadata_target = set(metadata_voters(candidates))
        metadata_conf = leader[1].conf
        followers = {c.id for c in candidates if c.alive} - metadata_target
        if set(metadata_conf.voters) != metadata_target or set(metadata_conf.learners) != followers:
            self._fail(f"metadata group {metadata_conf} != voters {metadata_target} + {followers}")
        for partition in range(self.partitions):
            group = group_of(partition)
            found = self._leader_of(group)
            if found is None:
                self._fail(f"{group} has no leader after settling")
                return
            conf = found[1].conf
            target = set(place(group, candidates, REPLICATION_FACTOR))
            if set(conf.voters) != target or conf.learners:
                self._fail(f"{group}: voters {conf.voters} learners {conf.learners} != {target}")
        if self.stats.get("metadata_snapshots", 0) < 2:
            self._fail("the joining nodes did not learn the metadata from a snapshot")
        self.stats["converged_partitions"] = self.partitions


def run_placement_seed(seed: int, *, partitions: int = PARTITIONS) -> dict[str, int]:
    return PlacementSimulation(seed, partitions=partitions).run()
