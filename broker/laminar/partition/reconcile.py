"""One step at a time from a group's Raft configuration toward its rendezvous target.

The seed's join / leave / update_weight rules: a partition's leader compares the voters and
learners of its Raft configuration with the placement target and proposes one single-server
change at a time: add a learner, promote it once caught up, then remove the replica that
fell out of the target (first a replica moving between two workers of one broker, whose
broker would otherwise hold two votes). The replication factor never drops below the target while a
replacement catches up, unless a replica is actually dead. A leader that falls out of the
target hands its leadership to a caught-up target voter before removing itself.

Leader balance (`rebalance_to`, `LeaderBalance`), as Kafka's auto leader rebalance: each
partition has a preferred leader (`laminar.placement.preferred_leaders`: spread evenly over
a topic's partitions). A leader that is not its group's preferred leader hands leadership to
it, once the preferred one has been alive a while, is a caught-up voter and the group is not
changing its configuration; a limited number of moves per pass, and a group whose move did
not happen is retried only after a pause. A preferred leader whose group has no leader
campaigns after a short timeout (`Raft.eager`), and the other members of a new group (or of
every group, just after a start) defer their own elections to it for a while
(`Raft.defer_election`), so that new groups, and groups after a restart of their brokers,
start out balanced.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from enum import Enum

from ..placement import Candidate, place, preferred_leaders, worker_of
from ..raft.messages import ConfChange, ConfChangeKind, ConfState
from ..raft.raft import Raft, Role, quorum
from ..workers import broker_of


class StepKind(Enum):
    ADD_LEARNER = "add_learner"
    PROMOTE = "promote"
    REMOVE = "remove"
    TRANSFER_LEADERSHIP = "transfer_leadership"


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    node: str

    def conf_change(self) -> ConfChange:
        kinds = {
            StepKind.ADD_LEARNER: ConfChangeKind.ADD_LEARNER,
            StepKind.PROMOTE: ConfChangeKind.PROMOTE,
            StepKind.REMOVE: ConfChangeKind.REMOVE,
        }
        return ConfChange(kinds[self.kind], self.node)


def next_step(
    conf: ConfState,
    target: Sequence[str],
    *,
    leader: str,
    caught_up: Set[str],
    alive: Set[str],
    followers: Set[str] = frozenset(),
    leaving: Set[str] = frozenset(),
) -> Step | None:
    """The next change toward `target` voters, or None once the configuration matches it.

    `caught_up`: members whose log matches the leader's closely enough to be promoted or to
    take over leadership; `alive`: members the failure detector believes alive;
    `followers`: nodes that should follow the group as learners when they are not target
    voters (the metadata group: every live node); `leaving`: members that are stopping, to
    which no leadership is handed (the leader waits for another successor, or their stop).
    """
    voters, learners = set(conf.voters), set(conf.learners)
    wanted = set(target)
    # 1. A caught-up learner the target wants becomes a voter, if the failure detector
    #    counts it alive: a dead one would add a vote the majority needs and cannot have.
    for node in sorted(learners & wanted):
        if node in caught_up and node in alive:
            return Step(StepKind.PROMOTE, node)
    # 2. Learners neither voters-to-be nor followers go (they vote for nothing: safe).
    for node in sorted(learners - wanted - set(followers)):
        return Step(StepKind.REMOVE, node)
    # 3. A voter outside the target whose broker has a target voter in the configuration
    #    too (a partition moving between workers of one broker) goes first: it adds no
    #    broker's vote, and while it stays one broker's crash takes two votes. Removing any
    #    other voter first could leave a majority that one broker's loss ends for good.
    floor = quorum(len(wanted))
    voting_brokers = {broker_of(node) for node in voters & wanted}
    for node in sorted(voters - wanted):
        if broker_of(node) not in voting_brokers:
            continue
        rest = voters - {node}
        if node != leader:
            if len(rest) >= floor and _live_majority(rest, alive, caught_up):
                return Step(StepKind.REMOVE, node)
            continue
        successor = _successor(target, leader, caught_up, alive, leaving)
        if successor is not None:
            return Step(StepKind.TRANSFER_LEADERSHIP, successor)
    # 4. A dead voter outside the target goes at once: it can neither vote nor catch up.
    #    Only while the voters left keep a majority that is alive and caught up (the
    #    leader's own evidence: a failure detector can be wrong both ways, and a "dead"
    #    voter may be the one holding what the others lack) and are at least a majority of
    #    the target (a group of one voter survives nothing). Past that, its replacement
    #    catches up and votes first.
    for node in sorted(voters - wanted):
        rest = voters - {node}
        removable = node not in alive and node != leader and len(rest) >= floor
        if removable and _live_majority(rest, alive, caught_up):
            return Step(StepKind.REMOVE, node)
    # 5. Add the next missing target node, one learner catching up at a time.
    missing = [node for node in target if node not in voters | learners]
    if missing and not learners & wanted:
        return Step(StepKind.ADD_LEARNER, missing[0])
    # 6. Remove a live voter outside the target only once every target node votes, so the
    #    replication factor never drops below the target, and only while the voters left
    #    keep a live, caught-up majority (a leader whose view of the members is partial,
    #    just after a restart, may see a target of itself alone).
    extra = sorted(voters - wanted)
    if extra and wanted <= voters:
        victim = extra[0] if leader not in extra else leader
        if victim != leader:
            rest = voters - {victim}
            if _live_majority(rest, alive, caught_up):
                return Step(StepKind.REMOVE, victim)
            return None
        successor = _successor(target, leader, caught_up, alive, leaving)
        if successor is not None:
            return Step(StepKind.TRANSFER_LEADERSHIP, successor)
        return None
    # 7. Followers that are not members yet join as learners.
    for node in sorted(set(followers) - voters - learners):
        return Step(StepKind.ADD_LEARNER, node)
    return None


def _live_majority(voters: Set[str], alive: Set[str], caught_up: Set[str]) -> bool:
    """Whether a majority of `voters` is alive and caught up (the leader's evidence)."""
    return len(voters & alive & caught_up) >= quorum(len(voters))


def _successor(
    target: Sequence[str], leader: str, caught_up: Set[str], alive: Set[str], leaving: Set[str]
) -> str | None:
    """The target voter a leader outside the target hands its leadership to, if any."""
    for node in target:
        if node in caught_up and node in alive and node not in leaving and node != leader:
            return node
    return None


def leader_step(
    raft: Raft,
    target: Sequence[str],
    *,
    alive: Set[str],
    followers: Set[str] = frozenset(),
    leaving: Set[str] = frozenset(),
    lag_indexes: int,
) -> Step | None:
    """The next step for the group `raft` leads (None while a change is pending): members
    within `lag_indexes` of the leader's log count as caught up (`next_step` for the rest)."""
    if raft.pending_conf_index > raft.log.committed or not target:
        return None
    caught_up = {n for n in raft.progress if raft.caught_up(n, lag_indexes)}
    return next_step(
        raft.conf,
        target,
        leader=raft.id,
        caught_up=caught_up,
        alive=alive,
        followers=followers,
        leaving=leaving,
    )


def rebalance_to(
    raft: Raft, preferred: str | None, *, ready: Set[str], lag_indexes: int
) -> str | None:
    """The voter the leader `raft` should hand its leadership to: `preferred`, when that is
    another voter, `ready` (alive for a while, not draining), within `lag_indexes` of the
    leader's log, and the group is settled (no learners, no configuration change or
    transfer in flight); None otherwise."""
    if preferred is None or preferred == raft.id or raft.role is not Role.LEADER:
        return None
    if raft.transferee is not None or raft.pending_conf_index > raft.log.committed:
        return None
    if raft.conf.learners or preferred not in raft.conf.voters or preferred not in ready:
        return None
    if not raft.caught_up(preferred, lag_indexes):
        return None
    return preferred


@dataclass
class LeaderBalance:
    """The node's rate limits on moving leaderships toward preferred leaders, and on
    campaigning early as one. Time is counted in Raft ticks (`now`: the node's count), as
    election timeouts are."""

    #: leadership transfers a node starts per control pass at most
    transfers_per_pass: int = 25
    #: a group whose transfer did not happen is tried again after this many ticks
    retry_ticks: int = 100
    #: a preferred leader takes leadership back only once alive this long (no flapping)
    alive_ticks: int = 50
    #: the others defer their own elections to an alive preferred leader this long at most
    defer_ticks: int = 50
    tried: dict[str, int] = field(default_factory=dict)
    alive_since: dict[str, int] = field(default_factory=dict)

    def observe(self, alive: Set[str], now: int) -> frozenset[str]:
        """Note which nodes the failure detector counts alive now; returns those alive for
        at least `alive_ticks`."""
        for node in [n for n in self.alive_since if n not in alive]:
            del self.alive_since[node]
        for node in alive:
            self.alive_since.setdefault(node, now)
        return frozenset(
            n for n, since in self.alive_since.items() if now - since >= self.alive_ticks
        )

    def may_try(self, group: str, now: int) -> bool:
        """May a move of `group`'s leadership start now? (Noted if so.)"""
        last = self.tried.get(group)
        if last is not None and now - last < self.retry_ticks:
            return False
        self.tried[group] = now
        return True

    def forget(self, keep: Set[str]) -> None:
        """Drop what is remembered of groups not in `keep` (once that is most of it)."""
        if len(self.tried) > 2 * len(keep) + 64:
            self.tried = {g: t for g, t in self.tried.items() if g in keep}


@dataclass(frozen=True, slots=True)
class TopicPlan:
    """Where a topic's partitions belong for one view of the candidates: each partition's
    target voters (best first, and sorted as a configuration lists them) and its preferred
    leader."""

    key: tuple[object, ...]
    targets: tuple[tuple[str, ...], ...]
    voters: tuple[tuple[str, ...], ...]
    preferred: tuple[str | None, ...]


def plan_topic(
    name: str, partitions: int, replication_factor: int, candidates: Sequence[Candidate]
) -> TopicPlan:
    """The plan of topic `name` (`key`: what it was computed from, but for the name)."""
    brokers = tuple(
        tuple(place(f"{name}/{p}", candidates, replication_factor)) for p in range(partitions)
    )
    weights = {c.id: c.weight for c in candidates}
    workers = {c.id: c.workers for c in candidates}
    targets = tuple(
        tuple(worker_of(f"{name}/{p}", b, workers[b]) for b in chosen)
        for p, chosen in enumerate(brokers)
    )
    preferred = tuple(  # the preferred broker's worker that holds the partition
        None if leader is None else worker_of(f"{name}/{p}", leader, workers[leader])
        for p, leader in enumerate(preferred_leaders(brokers, weights))
    )
    return TopicPlan(
        key=(partitions, replication_factor, tuple(candidates)),
        targets=targets,
        voters=tuple(tuple(sorted(t)) for t in targets),
        preferred=preferred,
    )
