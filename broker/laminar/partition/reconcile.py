"""One step at a time from a group's Raft configuration toward its rendezvous target.

The seed's join / leave / update_weight rules: a partition's leader compares the voters and
learners of its Raft configuration with the placement target and proposes one single-server
change at a time: add a learner, promote it once caught up, then remove the replica that
fell out of the target. The replication factor never drops below the target while a
replacement catches up, unless a replica is actually dead. A leader that falls out of the
target hands its leadership to a caught-up target voter before removing itself.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass
from enum import Enum

from ..raft.messages import ConfChange, ConfChangeKind, ConfState
from ..raft.raft import Raft


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
) -> Step | None:
    """The next change toward `target` voters, or None once the configuration matches it.

    `caught_up`: members whose log matches the leader's closely enough to be promoted or to
    take over leadership; `alive`: members the failure detector believes alive;
    `followers`: nodes that should follow the group as learners when they are not target
    voters (the metadata group: every live node).
    """
    voters, learners = set(conf.voters), set(conf.learners)
    wanted = set(target)
    # 1. A caught-up learner the target wants becomes a voter.
    for node in sorted(learners & wanted):
        if node in caught_up:
            return Step(StepKind.PROMOTE, node)
    # 2. Learners neither voters-to-be nor followers go (they vote for nothing: safe).
    for node in sorted(learners - wanted - set(followers)):
        return Step(StepKind.REMOVE, node)
    # 3. A dead voter outside the target goes at once: it can neither vote nor catch up.
    #    Only while the voters left keep a majority that is alive and caught up (the
    #    leader's own evidence: a failure detector can be wrong both ways, and a "dead"
    #    voter may be the one holding what the others lack) and are at least a majority of
    #    the target (a group of one voter survives nothing). Past that, its replacement
    #    catches up and votes first.
    floor = len(wanted) // 2 + 1
    for node in sorted(voters - wanted):
        rest = voters - {node}
        live_majority = len(rest & alive & caught_up) > len(rest) // 2
        if node not in alive and node != leader and len(rest) >= floor and live_majority:
            return Step(StepKind.REMOVE, node)
    # 4. Add the next missing target node, one learner catching up at a time.
    missing = [node for node in target if node not in voters | learners]
    if missing and not learners & wanted:
        return Step(StepKind.ADD_LEARNER, missing[0])
    # 5. Remove a live voter outside the target only once every target node votes, so the
    #    replication factor never drops below the target.
    extra = sorted(voters - wanted)
    if extra and wanted <= voters:
        victim = extra[0] if leader not in extra else leader
        if victim != leader:
            return Step(StepKind.REMOVE, victim)
        successors = [n for n in target if n in caught_up and n in alive and n != leader]
        if successors:
            return Step(StepKind.TRANSFER_LEADERSHIP, successors[0])
        return None
    # 6. Followers that are not members yet join as learners.
    for node in sorted(set(followers) - voters - learners):
        return Step(StepKind.ADD_LEARNER, node)
    return None


def leader_step(
    raft: Raft,
    target: Sequence[str],
    *,
    alive: Set[str],
    followers: Set[str] = frozenset(),
    lag_indexes: int,
) -> Step | None:
    """The next step for the group `raft` leads (None while a change is pending): members
    within `lag_indexes` of the leader's log count as caught up."""
    if raft.pending_conf_index > raft.log.committed or not target:
        return None
    caught_up = {n for n in raft.progress if raft.caught_up(n, lag_indexes)}
    return next_step(
        raft.conf, target, leader=raft.id, caught_up=caught_up, alive=alive, followers=followers
    )
