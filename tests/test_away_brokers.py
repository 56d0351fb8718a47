"""A broker that is away keeps its place in placement, on whole node cores (`NodeCore`, the
class the broker runs) over in-memory storage, with the failure detector's events given by
hand (issue 26: "a restart must not move data unless the broker was drained").

* One that left (a graceful stop) keeps its replicas for as long as it is away, however long
  past `dead_grace_ms`; back, it is in sync again and nothing moved.
* One that died is replaced once `dead_grace_ms` have passed (a machine that never returns
  does not leave its partitions under-replicated for good).
* Draining one that left moves its replicas off it.
* A topic created while a broker is away gets a leader for every partition.
* One the first brokers up have not heard from yet keeps its metadata vote for the grace, as
  one that died.
"""

from __future__ import annotations

import logging

import pytest

from laminar.metadata import CreateTopic, SetDraining
from laminar.node.core import CONTROL_SWEEP_PASSES, CoreConfig, NodeCore, counts_for_placement
from laminar.node.store import NodeStorage
from laminar.swim.member import Addresses, EventKind, Member, MembershipEvent, MemberState
from laminar.swim.member import MemberStatus as S

from .test_leader_balance import TOPIC, Cluster

GRACE_MS = 1_000
NODES = ("n1", "n2", "n3", "n4")
PARTITIONS = 12


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="laminar")  # (put back after the test)


class AwayCluster(Cluster):
    """`Cluster` with a short dead grace, and the failure detector's events delivered."""

    grace_ms = GRACE_MS

    def start(self, node: str) -> None:
        storage = NodeStorage(None, memory=self.disks[node])
        config = CoreConfig(node, initial_nodes=self.nodes, dead_grace_ms=self.grace_ms)
        core = NodeCore(config, storage, lambda: self.members(node), seed=self.seed)
        core.set_clock(self.now_ms, self.now_ms)
        core.open()
        self.cores[node] = core
        was = self.status.get(node)
        self.status[node] = S.ALIVE
        if was is not None and was is not S.ALIVE:
            self._tell(node, EventKind.JOINED)

    def go(self, node: str, status: S) -> None:
        """`node` stops; its peers see it dead or left (`status`)."""
        self.stop(node)
        self.status[node] = status
        self._tell(node, EventKind.LEFT if status is S.LEFT else EventKind.DEAD)

    def _tell(self, node: str, kind: EventKind) -> None:
        member = Member(node, Addresses(f"{node}:8080", f"{node}:7000", f"{node}:7946"))
        event = MembershipEvent(kind, MemberState(member, self.status[node], 1), self.now_ms)
        for observer, core in self.cores.items():
            if observer != node:
                core.on_member_event(event)

    def voters(self) -> dict[str, frozenset[str]]:
        """Each partition's voters, as its leader has them."""
        out = {}
        for group, node in self.leaders().items():
            conf = self.cores[node].replicas[group].raft.conf
            out[group] = frozenset(conf.voters)
        return out

    def settled(self, rf: int = 3) -> bool:
        """Every partition led, with `rf` voters (and no learners) that are all in sync."""
        leaders = self.leaders()
        if len(leaders) != self.partitions():
            return False
        for group, node in leaders.items():
            raft = self.cores[node].replicas[group].raft
            in_sync = self.cores[node].in_sync(raft, self.cores[node].alive())
            if raft.conf.learners or len(raft.conf.voters) != rf or len(in_sync) != rf:
                return False
        return True

    def passes(self) -> dict[str, int]:
        return {n: c.counters["control_passes"] for n, c in self.cores.items()}

    def past_the_grace(self, gone_at_ms: int) -> None:
        """Step until every live core has seen a broker that went at `gone_at_ms` away for
        longer than the grace, and has run a whole control sweep since (each of its
        replicas visited at least once)."""
        self.run_until(lambda: self.now_ms - gone_at_ms > GRACE_MS, 100)
        start = self.passes()
        self.run_until(
            lambda: all(p > start[n] + CONTROL_SWEEP_PASSES for n, p in self.passes().items()),
            200,
        )

    def away_then(self, gone: str, status: S) -> dict[str, frozenset[str]]:
        """A topic settled on all four; `gone` goes (dead or left) and the grace runs out.
        Returns the voters from before it went."""
        self.create_topic(PARTITIONS)
        self.run_until(self.settled, 300)
        before = self.voters()
        assert any(gone in voters for voters in before.values())
        gone_at_ms = self.now_ms
        self.go(gone, status)
        self.past_the_grace(gone_at_ms)
        return before


def test_a_broker_that_left_keeps_its_replicas_past_the_grace_and_comes_back_to_them() -> None:
    cluster = AwayCluster(NODES)
    before = cluster.away_then("n4", S.LEFT)
    assert cluster.voters() == before  # nothing moved
    for core in cluster.cores.values():
        state, away_ms, kept = core.away()["n4"]
        assert state is S.LEFT and away_ms > GRACE_MS and kept
        assert next(c for c in core.candidates() if c.id == "n4").eligible
    cluster.start("n4")
    cluster.run_until(cluster.settled, 300)  # every replica in sync again
    assert cluster.voters() == before
    assert all("n4" not in core.away() for core in cluster.cores.values())


def test_a_broker_that_died_is_replaced_once_the_grace_is_over() -> None:
    cluster = AwayCluster(NODES)
    before = cluster.away_then("n4", S.DEAD)
    cluster.run_until(lambda: cluster.settled() and cluster.voters() != before, 300)
    assert all("n4" not in voters for voters in cluster.voters().values())
    for core in cluster.cores.values():
        state, away_ms, kept = core.away()["n4"]
        assert state is S.DEAD and away_ms > GRACE_MS and not kept


def test_draining_a_broker_that_left_moves_its_replicas_off_it() -> None:
    cluster = AwayCluster(NODES)
    before = cluster.away_then("n4", S.LEFT)
    assert cluster.voters() == before
    leader = cluster.metadata_leader()
    assert leader is not None
    leader.propose_metadata(SetDraining("n4", True))
    cluster.run_until(
        lambda: cluster.settled() and all("n4" not in v for v in cluster.voters().values()),
        300,
    )
    moved = {g for g, voters in before.items() if "n4" in voters}
    assert {g for g, v in cluster.voters().items() if v != before[g]} == moved


def test_a_topic_created_while_a_broker_is_away_has_a_leader_for_every_partition() -> None:
    """Placement would put some of an RF 1 topic's partitions on the broker that left alone:
    those go to brokers that are up instead, and every partition is led."""
    cluster = AwayCluster(NODES)
    # (every broker follows the metadata first: one that would learn the topic from a
    # snapshot would not create its initial replicas, as a broker not ready yet)
    cluster.run_until(lambda: all(c.readiness() is None for c in cluster.cores.values()), 200)
    cluster.go("n4", S.LEFT)
    leader = cluster.metadata_leader()
    assert leader is not None
    leader.propose_metadata(CreateTopic(TOPIC, PARTITIONS, 1))
    cluster.run_until(lambda: cluster.all_led(PARTITIONS), 300)
    assigned = leader.state.topics[TOPIC].assignment
    assert len(assigned) == PARTITIONS and all(voters != ("n4",) for voters in assigned)


class LateCluster(AwayCluster):
    """`AwayCluster` whose broker `late` has not started: no failure detector has heard of
    it (the first brokers of a cluster up see only each other)."""

    grace_ms = 20 * GRACE_MS  # (an election and some control sweeps fit in it)

    def __init__(self, nodes: tuple[str, ...], late: str) -> None:
        self.late: str | None = late
        super().__init__(nodes)

    def start(self, node: str) -> None:
        if node == self.late:
            self.late = None  # (later starts are real)
            del self.status[node]
            return
        super().start(node)

    def metadata_voters(self) -> set[str]:
        leader = self.metadata_leader()
        assert leader is not None and leader.meta is not None
        return set(leader.meta.raft.conf.voters)


def test_a_broker_not_heard_from_yet_keeps_its_metadata_vote_and_votes_once_up() -> None:
    """n2 and n3 elect a metadata leader before n1 is up. It used to drop n1 from the voters
    at once (a dead voter outside a target placed over the brokers it knew), leaving a
    two-voter group that the loss of either stopped; n1 came back only as a learner to
    catch up and be promoted (a kill in that window stalled every metadata write)."""
    cluster = LateCluster(NODES[:3], late="n1")
    cluster.run_until(lambda: cluster.metadata_leader() is not None, 300)
    start = cluster.passes()
    cluster.run_until(
        lambda: all(p > start[n] + CONTROL_SWEEP_PASSES for n, p in cluster.passes().items()),
        200,
    )
    leader = cluster.metadata_leader()
    assert leader is not None
    status, away_ms, kept = leader.away()["n1"]
    assert status is S.DEAD and 0 < away_ms < cluster.grace_ms and kept
    assert cluster.metadata_voters() == {"n1", "n2", "n3"}
    cluster.start("n1")
    cluster.run_until(lambda: all(c.readiness() is None for c in cluster.cores.values()), 300)
    assert cluster.metadata_voters() == {"n1", "n2", "n3"}
    assert all(core.unheard() == {} for core in cluster.cores.values())


def test_a_broker_never_heard_from_is_taken_out_once_the_grace_is_over() -> None:
    cluster = LateCluster(NODES[:3], late="n1")
    cluster.run_until(lambda: cluster.metadata_leader() is not None, 300)
    first_ms = cluster.now_ms
    cluster.run_until(lambda: "n1" not in cluster.metadata_voters(), 500)
    assert cluster.now_ms - first_ms >= cluster.grace_ms - 1_000  # (first looked for earlier)
    leader = cluster.metadata_leader()
    assert leader is not None and "n1" not in leader.away()  # (no longer a member)


@pytest.mark.parametrize(
    "status, away_ms, counted",
    [
        (S.ALIVE, 0, True),
        (S.SUSPECT, 0, True),
        (S.LEFT, 0, True),
        (S.LEFT, 10 * GRACE_MS, True),
        (S.DEAD, GRACE_MS - 1, True),
        (S.DEAD, GRACE_MS, False),
    ],
)
def test_what_counts_for_placement(status: S, away_ms: int, counted: bool) -> None:
    assert counts_for_placement(status, away_ms, GRACE_MS) is counted
