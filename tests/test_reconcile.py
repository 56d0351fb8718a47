"""Reconciliation moves a Raft configuration to its placement target one safe step at a time."""

from __future__ import annotations

from collections.abc import Sequence

from laminar.partition.reconcile import Step, StepKind, next_step
from laminar.raft import ConfState


def converge(
    voters: Sequence[str],
    target: Sequence[str],
    *,
    leader: str,
    alive: set[str] | None = None,
) -> list[Step]:
    """Apply steps (learners catch up at once) until none is left; check the invariants."""
    conf = ConfState(tuple(sorted(voters)))
    alive = set(voters) | set(target) if alive is None else alive
    rf = len(target)
    steps: list[Step] = []
    for _ in range(50):
        step = next_step(conf, target, leader=leader, caught_up=set(conf.members()), alive=alive)
        if step is None:
            assert set(conf.voters) == set(target) and not conf.learners
            return steps
        steps.append(step)
        if step.kind is StepKind.TRANSFER_LEADERSHIP:
            leader = step.node
            continue
        conf = conf.apply(step.conf_change())
        live_voters = set(conf.voters) & alive
        # never below the target while replacing live replicas
        assert len(live_voters) >= min(rf, len(set(voters) & alive)), (step, conf)
    raise AssertionError("did not converge")


def test_matching_configuration_needs_nothing() -> None:
    assert converge(["a", "b", "c"], ["b", "c", "a"], leader="a") == []


def test_replacing_a_replica_adds_catches_up_promotes_then_removes() -> None:
    steps = converge(["a", "b", "c"], ["a", "b", "d"], leader="a")
    assert steps == [
        Step(StepKind.ADD_LEARNER, "d"),
        Step(StepKind.PROMOTE, "d"),
        Step(StepKind.REMOVE, "c"),
    ]


def test_a_learner_that_has_not_caught_up_is_not_promoted() -> None:
    conf = ConfState(("a", "b", "c"), ("d",))
    step = next_step(
        conf, ["a", "b", "d"], leader="a", caught_up={"a", "b"}, alive={"a", "b", "c", "d"}
    )
    assert step is None  # wait: nothing may go before d votes


def test_a_learner_the_failure_detector_counts_dead_is_not_promoted() -> None:
    """Its vote would count in every majority and it cannot give it."""
    conf = ConfState(("a", "b", "c"), ("d",))
    everyone = {"a", "b", "c", "d"}
    step = next_step(conf, ["a", "b", "d"], leader="a", caught_up=everyone, alive=everyone - {"d"})
    assert step is None
    step = next_step(conf, ["a", "b", "d"], leader="a", caught_up=everyone, alive=everyone)
    assert step == Step(StepKind.PROMOTE, "d")


def test_a_dead_replica_goes_first() -> None:
    steps = converge(["a", "b", "c"], ["a", "b", "d"], leader="a", alive={"a", "b", "d"})
    assert steps[0] == Step(StepKind.REMOVE, "c")
    assert steps[1:] == [Step(StepKind.ADD_LEARNER, "d"), Step(StepKind.PROMOTE, "d")]


def test_a_leader_outside_the_target_hands_over_before_leaving() -> None:
    steps = converge(["a", "b", "c"], ["b", "c", "d"], leader="a")
    assert steps == [
        Step(StepKind.ADD_LEARNER, "d"),
        Step(StepKind.PROMOTE, "d"),
        Step(StepKind.TRANSFER_LEADERSHIP, "b"),
        Step(StepKind.REMOVE, "a"),
    ]


def test_a_leader_outside_the_target_hands_over_to_no_broker_that_is_stopping() -> None:
    conf = ConfState(("a", "b", "c", "d"))
    everyone = {"a", "b", "c", "d"}
    step = next_step(conf, ["b", "c", "d"], leader="a", caught_up=everyone, alive=everyone,
                     leaving={"b"})  # fmt: skip
    assert step == Step(StepKind.TRANSFER_LEADERSHIP, "c")
    # every successor stopping: the leader keeps leading until one is not, or is gone
    step = next_step(conf, ["b", "c", "d"], leader="a", caught_up=everyone, alive=everyone,
                     leaving={"b", "c", "d"})  # fmt: skip
    assert step is None


def test_growing_and_shrinking_the_replication_factor() -> None:
    assert [s.kind for s in converge(["a"], ["a", "b", "c"], leader="a")] == [
        StepKind.ADD_LEARNER,
        StepKind.PROMOTE,
        StepKind.ADD_LEARNER,
        StepKind.PROMOTE,
    ]
    assert converge(["a", "b", "c"], ["a"], leader="a") == [
        Step(StepKind.REMOVE, "b"),
        Step(StepKind.REMOVE, "c"),
    ]


def test_a_stray_learner_is_removed() -> None:
    conf = ConfState(("a", "b", "c"), ("x",))
    step = next_step(conf, ["a", "b", "c"], leader="a", caught_up=set(), alive={"a", "b", "c"})
    assert step == Step(StepKind.REMOVE, "x")


def test_followers_join_as_learners_and_are_not_churned() -> None:
    """The metadata group: target voters plus every other live node as a learner."""
    conf = ConfState(("a", "b", "c"))
    alive = {"a", "b", "c", "d", "e"}
    steps = []
    for _ in range(10):
        step = next_step(
            conf, ["a", "b", "c"], leader="a", caught_up=alive, alive=alive, followers=alive
        )
        if step is None:
            break
        steps.append(step)
        conf = conf.apply(step.conf_change())
    assert steps == [Step(StepKind.ADD_LEARNER, "d"), Step(StepKind.ADD_LEARNER, "e")]
    assert conf == ConfState(("a", "b", "c"), ("d", "e"))
    # a follower that dies is dropped; a voter that leaves the target becomes a follower
    step = next_step(
        conf,
        ["a", "b", "c"],
        leader="a",
        caught_up=alive,
        alive=alive - {"e"},
        followers=alive - {"e"},
    )
    assert step == Step(StepKind.REMOVE, "e")
    conf = ConfState(("a", "b", "c"), ("d",))
    step = next_step(
        conf, ["a", "b", "d"], leader="a", caught_up=alive, alive=alive, followers=alive
    )
    assert step == Step(StepKind.PROMOTE, "d")
    conf = conf.apply(step.conf_change())
    assert next_step(
        conf, ["a", "b", "d"], leader="a", caught_up=alive, alive=alive, followers=alive
    ) == Step(StepKind.REMOVE, "c")
    conf = conf.apply(Step(StepKind.REMOVE, "c").conf_change())
    assert next_step(
        conf, ["a", "b", "d"], leader="a", caught_up=alive, alive=alive, followers=alive
    ) == Step(StepKind.ADD_LEARNER, "c")


def test_a_dead_voter_stays_while_the_rest_lacks_a_caught_up_live_majority() -> None:
    """ "Dead" is the failure detector's word, and it can be wrong: with voters a, b, c and
    both b and c thought dead, removing either would leave a group whose commits need a node
    the leader has no evidence of; the replacement d is added instead."""
    conf = ConfState(("a", "b", "c"))
    step = next_step(conf, ["a", "b", "d"], leader="a", caught_up={"a"}, alive={"a", "d"})
    assert step == Step(StepKind.ADD_LEARNER, "d")
    # b caught up (it acknowledges the leader): c may go
    step = next_step(conf, ["a", "b", "d"], leader="a", caught_up={"a", "b"}, alive={"a", "b"})
    assert step == Step(StepKind.REMOVE, "c")


def test_dead_voters_never_shrink_a_group_below_a_majority_of_its_target() -> None:
    conf = ConfState(("a", "b"))
    step = next_step(conf, ["a", "c", "d"], leader="a", caught_up={"a"}, alive={"a", "c", "d"})
    assert step == Step(StepKind.ADD_LEARNER, "c")


def test_a_partition_moving_between_workers_of_one_broker_leaves_its_old_worker_first() -> None:
    """n2's partition moves from its worker n2~1 to n2~2 while n1 drains: voters n0, n1,
    n2~1, n2~2 and n3 (n2~2 just promoted). Removing n1 first would leave four voters, two
    on n2, whose majority n2's crash ends; the old worker goes first, then n1."""
    voters = ("n0", "n1", "n2~1", "n2~2", "n3")
    target = ["n0", "n2~2", "n3"]
    conf = ConfState(voters)
    step = next_step(conf, target, leader="n0", caught_up=set(voters), alive=set(voters))
    assert step == Step(StepKind.REMOVE, "n2~1")
    conf = conf.apply(step.conf_change())
    step = next_step(conf, target, leader="n0", caught_up=set(voters), alive=set(voters))
    assert step == Step(StepKind.REMOVE, "n1")
    # also before a dead voter, and a leader on the old worker hands over first
    dead = {"n0", "n2~1", "n2~2", "n3"}
    step = next_step(ConfState(voters), target, leader="n0", caught_up=dead, alive=dead)
    assert step == Step(StepKind.REMOVE, "n2~1")
    step = next_step(ConfState(voters), target, leader="n2~1", caught_up=dead, alive=dead)
    assert step == Step(StepKind.TRANSFER_LEADERSHIP, "n0")
