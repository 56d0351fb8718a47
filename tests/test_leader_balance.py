"""Leader balance and quiescence, on whole node cores (`NodeCore`, the class the broker runs)
over in-memory storage, with a deterministic network and a failure detector the test sets.

* Preferred leaders spread a topic's leaderships evenly, new groups are led by them from the
  start, and leadership comes back to them after a broker stops and returns.
* A broker that is stopping (leaving) hands its leaderships only to brokers that stay, and
  none is handed to it, by a handoff or a rebalance.
* Idle groups quiesce: no Raft messages at all while nothing happens; a proposal wakes its
  group, and the failure detector's word that a leader is gone wakes its followers, which
  elect another.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator

import pytest

from laminar.log.batch import Record, encode_batch
from laminar.log.storage import MemoryDirectory
from laminar.metadata import CreateTopic
from laminar.node.core import CoreConfig, Member, NodeCore
from laminar.node.store import NodeStorage
from laminar.partition.reconcile import Step, StepKind, next_step, rebalance_to
from laminar.placement import Candidate, partition_key, place, preferred_leaders
from laminar.raft.messages import ConfState, Message, MessageType
from laminar.raft.raft import Role
from laminar.swim.member import (
    Addresses,
    EventKind,
    MembershipEvent,
    MemberState,
    MemberStatus,
)
from laminar.swim.member import Member as SwimMember

TICK_MS = 100
NODES = ("n1", "n2", "n3")
TOPIC = "orders"


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="laminar")  # (put back after the test)


class Cluster:
    """Node cores on one clock. A message sent in a round is delivered at the next step;
    `status` is every node's failure detector (ALIVE or DEAD)."""

    def __init__(self, nodes: tuple[str, ...] = NODES, *, seed: int = 7) -> None:
        self.nodes = nodes
        self.seed = seed
        self.now_ms = 1_000
        self.disks: dict[str, dict[str, MemoryDirectory]] = {n: {} for n in nodes}
        self.cores: dict[str, NodeCore] = {}
        self.status = dict.fromkeys(nodes, MemberStatus.ALIVE)
        self.in_flight: list[Message] = []
        self.checkpoints = 0  # journal checkpoints carried out (with a journal)
        self.sent: Counter[MessageType] = Counter()  # Raft messages sent, by type
        for node in nodes:
            self.start(node)

    def members(self, observer: str) -> dict[str, Member]:
        return {n: (s, f"{n}:8080", f"{n}:7000") for n, s in self.status.items() if n != observer}

    def start(self, node: str) -> None:
        storage = NodeStorage(None, memory=self.disks[node])
        config = CoreConfig(node, initial_nodes=self.nodes, dead_grace_ms=600_000)
        core = NodeCore(config, storage, lambda: self.members(node), seed=self.seed)
        core.set_clock(self.now_ms, self.now_ms)
        core.open()
        self.cores[node] = core
        self.status[node] = MemberStatus.ALIVE

    def stop(self, node: str) -> None:
        """The node stops (what it synced stays) and its peers see it dead."""
        self.cores.pop(node).close()
        for directory in self.disks[node].values():
            directory.crash()
        self.status[node] = MemberStatus.DEAD
        self.in_flight = [m for m in self.in_flight if node not in (m.src, m.dst)]

    def leave(self, node: str) -> None:
        """`node` starts stopping, and the others hear so (SWIM's update of its flag)."""
        self.cores[node].leave()
        addresses = Addresses(f"{node}:8080", f"{node}:7000", f"{node}:7001")
        state = MemberState(SwimMember(node, addresses, leaving=True), MemberStatus.ALIVE, 2)
        for other, core in self.cores.items():
            if other != node:
                core.on_member_event(MembershipEvent(EventKind.UPDATED, state, self.now_ms))

    def hand_off(self, *nodes: str) -> Counter[tuple[str, str]]:
        """Each of `nodes` hands its leaderships away, as a stopping broker does, until none
        has anything left to move; how often each (group, receiver) was handed over."""
        handed: Counter[tuple[str, str]] = Counter()
        for _ in range(200):
            moving = False
            for node in nodes:
                core = self.cores[node]
                pending = {g: r.raft.transferee for g, r in core.replicas.items()}
                if core.transfer_leaderships(core.alive()):
                    moving = True
                for group, replica in core.replicas.items():
                    if replica.raft.transferee not in (None, pending[group]):
                        handed[group, replica.raft.transferee] += 1
            if not moving:
                return handed
            self.step()
        raise AssertionError(f"still handing over after 200 ticks: {handed}")

    def _carry_out(self, core: NodeCore) -> bool:
        round_ = core.begin()
        if round_ is None:
            return False
        if round_.checkpointed is not None:  # a journal checkpoint first (with a journal)
            for job in round_.checkpoint:
                assert callable(job)  # (in memory: never a DirectWrite)
                job()
            round_.checkpointed()
            self.checkpoints += 1
        self._send(round_.before)
        for sync in round_.syncs:
            run = getattr(sync, "run", sync)  # a storage's disk work
            run()
        stored = getattr(core, "stored", None)
        if stored is not None:
            stored(round_)
        for save in round_.saves:
            save()
        self._send(round_.after)
        core.finish(round_)
        if round_.background_done is not None:  # (done before the next round: in a test)
            for job in round_.background:
                assert callable(job)
                job()
            round_.background_done()
            self.checkpoints += 1
        return True

    def _send(self, messages: list[Message]) -> None:
        for message in messages:
            parts = message.batch or (message,)
            self.sent.update(part.type for part in parts)
            self.in_flight.append(message)

    def step(self) -> None:
        """One tick of every live node: deliver, tick, run rounds until none is left."""
        self.now_ms += TICK_MS
        arriving, self.in_flight = self.in_flight, []
        for message in arriving:
            core = self.cores.get(message.dst)
            if core is not None:
                core.receive([message])
        for _, core in sorted(self.cores.items()):
            core.set_clock(self.now_ms, self.now_ms)
            core.tick()
            for _ in range(100):
                if not self._carry_out(core):
                    break
        # messages sent by rounds that ran after their destination's: delivered next tick

    def run(self, ticks: int) -> None:
        for _ in range(ticks):
            self.step()

    def run_until(self, done: object, ticks: int) -> int:
        """Step until `done()` is true (at most `ticks`); the ticks taken."""
        for taken in range(ticks):
            if done():  # type: ignore[operator]
                return taken
            self.step()
        raise AssertionError(f"not done after {ticks} ticks")

    # ---- views ---------------------------------------------------------------------------

    def metadata_leader(self) -> NodeCore | None:
        for core in self.cores.values():
            if core.meta is not None and core.meta.raft.role is Role.LEADER:
                return core
        return None

    def create_topic(self, partitions: int, rf: int = 3) -> None:
        self.run_until(lambda: self.metadata_leader() is not None, 100)
        leader = self.metadata_leader()
        assert leader is not None
        leader.propose_metadata(CreateTopic(TOPIC, partitions, rf))
        self.run_until(
            lambda: all(len(c.replicas) > 0 for c in self.cores.values()) or self.all_led(),
            100,
        )

    def leaders(self) -> dict[str, str]:
        """group -> the node leading it (the highest term's, among live nodes)."""
        best: dict[str, tuple[int, str]] = {}
        for node, core in self.cores.items():
            for group, replica in core.replicas.items():
                raft = replica.raft
                if raft.role is Role.LEADER and raft.term >= best.get(group, (-1, ""))[0]:
                    best[group] = (raft.term, node)
        return {group: node for group, (_, node) in best.items()}

    def all_led(self, partitions: int | None = None) -> bool:
        wanted = partitions if partitions is not None else self.partitions()
        return wanted > 0 and len(self.leaders()) == wanted

    def partitions(self) -> int:
        for core in self.cores.values():
            topic = core.state.topics.get(TOPIC)
            if topic is not None:
                return topic.partitions
        return 0

    def quiet(self) -> bool:
        """Every group of every live node quiesced."""
        return all(c.multi.quiesced() == len(c.multi.groups) for c in self.cores.values())

    def counts(self) -> dict[str, int]:
        counted = Counter(self.leaders().values())
        return {node: counted.get(node, 0) for node in self.cores}

    def groups(self) -> Iterator[tuple[str, str]]:
        for node, core in self.cores.items():
            for group in core.replicas:
                yield node, group


def balanced(partitions: int) -> Cluster:
    """Three node cores with a topic of `partitions`, every one led, the leaderships even."""
    cluster = Cluster()
    cluster.create_topic(partitions)
    cluster.run_until(lambda: cluster.all_led() and skew(cluster.counts()) == 1.0, 300)
    return cluster


def skew(counts: dict[str, int]) -> float:
    mean = sum(counts.values()) / len(counts)
    return max(counts.values()) / mean


# ---- placement -----------------------------------------------------------------------------


def test_preferred_leaders_spread_a_topic_evenly_whatever_the_hash() -> None:
    candidates = [Candidate(n) for n in ("a", "b", "c")]
    for partitions in (1, 7, 100, 1000):
        sets = [place(partition_key("t", p), candidates, 3) for p in range(partitions)]
        counts = Counter(preferred_leaders(sets))
        assert max(counts.values()) - min(counts.values(), default=0) <= 1, counts
        # the hash's own first places are not that even
    sets = [place(partition_key("t", p), candidates, 3) for p in range(1000)]
    firsts = Counter(s[0] for s in sets)
    assert max(firsts.values()) - min(firsts.values()) > 1


def test_preferred_leaders_follow_weights_and_only_pick_replicas() -> None:
    candidates = [Candidate("a", 1), Candidate("b", 1), Candidate("c", 2), Candidate("d", 1)]
    sets = [place(partition_key("w", p), candidates, 3) for p in range(2000)]
    weights = {c.id: c.weight for c in candidates}
    preferred = preferred_leaders(sets, weights)
    assert all(p in s for p, s in zip(preferred, sets, strict=True))
    counts = Counter(preferred)
    assert abs(counts["c"] / 2000 - 2 / 5) < 0.02, counts
    assert preferred_leaders([[], ["a"]]) == [None, "a"]


# ---- leader balance ------------------------------------------------------------------------


def test_a_new_topic_is_led_by_its_preferred_leaders_evenly() -> None:
    cluster = Cluster()
    cluster.create_topic(30)  # (the hash's first places: 13, 9 and 8)
    cluster.run_until(cluster.all_led, 100)
    counts = cluster.counts()
    assert counts == {"n1": 10, "n2": 10, "n3": 10}, counts


def test_leadership_comes_back_to_balance_after_a_broker_returns() -> None:
    cluster = balanced(60)
    cluster.stop("n2")
    # the others take over n2's partitions (their followers are woken by its death)
    cluster.run_until(lambda: cluster.all_led(), 100)
    assert "n2" not in cluster.leaders().values()
    cluster.start("n2")
    taken = cluster.run_until(lambda: cluster.counts() == {"n1": 20, "n2": 20, "n3": 20}, 400)
    n1 = cluster.cores["n1"]
    assert n1.counters["leader_rebalances"] > 0
    # ... once n2 has been alive a while: not at once
    assert taken >= n1.balance.alive_ticks


def test_a_restart_of_every_broker_elects_the_preferred_leaders_at_once() -> None:
    cluster = balanced(30)
    for node in NODES:
        cluster.stop(node)
    for node in NODES:
        cluster.start(node)
    taken = cluster.run_until(lambda: cluster.all_led(30), 100)
    assert cluster.counts() == {"n1": 10, "n2": 10, "n3": 10}
    assert taken < 10  # before any election timeout (10 to 20 ticks) ran out


def test_a_rebalance_waits_for_a_configuration_change_and_a_lagging_preferred() -> None:
    cluster = balanced(9)
    cluster.run_until(cluster.quiet, 100)
    group, leader = next(iter(sorted(cluster.leaders().items())))
    raft = cluster.cores[leader].replicas[group].raft
    other = next(n for n in NODES if n != leader)
    ready = frozenset(NODES)
    assert rebalance_to(raft, other, ready=ready, lag_indexes=0) == other
    assert rebalance_to(raft, leader, ready=ready, lag_indexes=0) is None  # it is preferred
    assert rebalance_to(raft, other, ready=frozenset({leader}), lag_indexes=0) is None
    raft.pending_conf_index = raft.log.committed + 1  # a change in flight
    assert rebalance_to(raft, other, ready=ready, lag_indexes=0) is None
    raft.pending_conf_index = -1
    raft.progress[other].match = -1  # it lags
    assert rebalance_to(raft, other, ready=ready, lag_indexes=0) is None


def test_brokers_stopping_together_hand_their_leaderships_only_to_one_that_stays() -> None:
    cluster = balanced(30)
    cluster.leave("n1")
    cluster.leave("n2")
    handed = cluster.hand_off("n1", "n2")
    # each of their 20 groups went once, to n3: never from one leaving broker to the other
    assert {receiver for _, receiver in handed} == {"n3"}, handed
    assert sorted(handed.values()) == [1] * 20, handed
    cluster.run_until(cluster.all_led, 100)  # (its elections end)
    assert cluster.counts() == {"n1": 0, "n2": 0, "n3": 30}


def test_brokers_that_all_stop_hand_over_nothing() -> None:
    cluster = balanced(9)
    for node in NODES:
        cluster.leave(node)
    assert cluster.hand_off(*NODES) == Counter()
    assert cluster.counts() == {"n1": 3, "n2": 3, "n3": 3}


def test_no_rebalance_hands_a_leadership_back_to_a_leaving_preferred_leader() -> None:
    cluster = balanced(30)
    cluster.leave("n2")
    handed = cluster.hand_off("n2")
    assert len(handed) == 10 and cluster.counts()["n2"] == 0, handed
    stayers = [cluster.cores["n1"], cluster.cores["n3"]]
    rebalances = sum(c.counters["leader_rebalances"] for c in stayers)
    # long past the rebalance's wait for a preferred leader alive a while, and its retry pause
    balance = stayers[0].balance
    cluster.run(balance.alive_ticks + 2 * balance.retry_ticks)
    assert cluster.all_led() and cluster.counts()["n2"] == 0
    assert sum(c.counters["leader_rebalances"] for c in stayers) == rebalances
    assert not any(r.raft.eager for r in cluster.cores["n2"].replicas.values())


# ---- quiescence ----------------------------------------------------------------------------


def test_idle_groups_quiesce_and_send_nothing() -> None:
    cluster = Cluster()
    cluster.create_topic(30)
    cluster.run_until(cluster.quiet, 200)
    cluster.sent.clear()
    cluster.run(50)  # five seconds: a heartbeat each tick per group, were they awake
    assert sum(cluster.sent.values()) == 0, cluster.sent


def test_a_proposal_wakes_its_group_and_it_quiesces_again() -> None:
    cluster = Cluster()
    cluster.create_topic(6)
    cluster.run_until(cluster.quiet, 200)
    group, leader = sorted(cluster.leaders().items())[0]
    replica = cluster.cores[leader].replicas[group]
    assert replica.raft.quiesced
    index = replica.raft.propose(encode_batch([Record(value=b"x")]), 1)
    assert not replica.raft.quiesced
    cluster.run_until(
        lambda: all(
            c.replicas[group].raft.log.committed >= index
            for c in cluster.cores.values()
            if group in c.replicas
        ),
        20,
    )
    cluster.run_until(cluster.quiet, 20)


def test_a_dead_leader_wakes_its_quiesced_followers_which_elect_another() -> None:
    cluster = Cluster()
    cluster.create_topic(12)
    cluster.run_until(cluster.quiet, 200)
    led_by_n1 = sorted(g for g, n in cluster.leaders().items() if n == "n1")
    assert led_by_n1
    cluster.stop("n1")
    cluster.run_until(lambda: all(cluster.leaders().get(g) for g in led_by_n1), 100)
    assert all(cluster.leaders()[g] != "n1" for g in led_by_n1)
    assert sum(c.counters["quiesce_wakes"] for c in cluster.cores.values()) >= len(led_by_n1)


def test_without_the_failure_detectors_word_quiesced_followers_wait() -> None:
    """The check above can fail: a leader gone while SWIM still counts it alive leaves its
    quiesced followers waiting (they are not ticked), until SWIM says otherwise."""
    cluster = Cluster()
    cluster.create_topic(12)
    cluster.run_until(cluster.quiet, 200)
    led_by_n1 = sorted(g for g, n in cluster.leaders().items() if n == "n1")
    cluster.stop("n1")
    cluster.status["n1"] = MemberStatus.ALIVE  # the failure detector has not noticed
    cluster.run(60)  # three times the longest election timeout
    assert not any(cluster.leaders().get(g) for g in led_by_n1)
    cluster.status["n1"] = MemberStatus.SUSPECT
    cluster.run_until(lambda: all(cluster.leaders().get(g) for g in led_by_n1), 100)


def test_a_leader_seeing_only_itself_removes_no_live_voter() -> None:
    """A leader just restarted, whose SWIM view holds only itself, sees a target of itself:
    removing another voter would leave a configuration without a live majority (seed 64 of
    the node simulation, with quiescence, hit it: the metadata group lost its leader)."""
    conf = ConfState(("a", "b", "c"))
    everyone = frozenset({"a", "b", "c"})
    step = next_step(conf, ["a"], leader="a", caught_up=everyone, alive=frozenset({"a"}))
    assert step is None
    step = next_step(conf, ["a", "b"], leader="a", caught_up=everyone, alive=everyone)
    assert step == Step(StepKind.REMOVE, "c")
