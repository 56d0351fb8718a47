"""misplaced_partitions: what the brokers report as rebalancingPartitions (the operator's
Rebalancing condition)."""

from __future__ import annotations

from typing import Any

from laminar.metadata.state import Topic
from laminar.partition.status_table import misplaced_partitions
from laminar.placement import Candidate, partition_key, place

NODES = [Candidate("n1"), Candidate("n2"), Candidate("n3"), Candidate("n4")]
TOPICS = {"orders": Topic("orders", partitions=6, replication_factor=2)}


def report(topic: str, partition: int, voters: list[str]) -> dict[str, Any]:
    """What a leader reports of its partition (GET /v1/nodes/{id}/partitions)."""
    return {
        "topic": topic,
        "partition": partition,
        "role": "leader",
        "term": 3,
        "voters": voters,
        "learners": [],
    }


def placed_view(candidates: list[Candidate]) -> dict[str, list[dict[str, Any]]]:
    """Every partition led by its first choice, its voters exactly placement's choice."""
    view: dict[str, list[dict[str, Any]]] = {c.id: [] for c in candidates}
    for p in range(6):
        target = place(partition_key("orders", p), candidates, 2)
        view[target[0]].append(report("orders", p, target))
    return view


def test_converged_placement_counts_nothing() -> None:
    assert misplaced_partitions(placed_view(NODES), TOPICS, NODES) == 0


def test_a_new_broker_makes_the_partitions_it_should_host_move() -> None:
    three = NODES[:3]
    view = placed_view(three)  # placed before n4 joined
    should_move = sum(1 for p in range(6) if "n4" in place(partition_key("orders", p), NODES, 2))
    assert should_move > 0
    assert misplaced_partitions(view, TOPICS, NODES) == should_move


def test_a_learner_catching_up_is_still_moving_and_leaderless_partitions_are_not() -> None:
    view = placed_view(NODES)
    leader = next(node for node, items in view.items() if items)
    first = view[leader][0]
    first["learners"] = ["n9"]
    assert misplaced_partitions(view, TOPICS, NODES) == 1
    view[leader].remove(first)  # its leader is gone: under-replicated, not rebalancing
    assert misplaced_partitions(view, TOPICS, NODES) == 0


def test_a_drained_broker_must_be_emptied() -> None:
    drained = [Candidate(c.id, draining=c.id == "n2") for c in NODES]
    hosting_n2 = sum(1 for p in range(6) if "n2" in place(partition_key("orders", p), NODES, 2))
    assert hosting_n2 > 0
    assert misplaced_partitions(placed_view(NODES), TOPICS, drained) == hosting_n2
