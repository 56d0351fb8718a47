"""The placement scenario: 3 nodes and a 50-partition topic; 2 nodes join, one is drained,
one changes weight, the metadata leader crashes; replicas removed from their groups are
dropped a while later, as the broker does. Everything converges to placement and no
acknowledged record is lost (the simulation's invariants hold throughout)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from laminar.raft.messages import MessageType
from laminar.sim import InvariantViolation, placement_cluster
from laminar.sim.placement_cluster import PARTITIONS, PlacementSimulation


@pytest.fixture(autouse=True)
def _quiet_recovery_reports() -> None:
    logging.getLogger("laminar.log").setLevel(logging.ERROR)


@pytest.mark.parametrize("seed", [1, 2])
def test_partitions_follow_placement_through_joins_drains_weights_and_a_crash(seed: int) -> None:
    stats = PlacementSimulation(seed).run()
    assert stats["converged_partitions"] == PARTITIONS
    assert stats["crashes"] == 1 and stats["acked"] > 1000
    assert stats["confs"] > 2 * PARTITIONS  # every move is a sequence of single steps
    assert stats["transfers"] > 0  # leaders on the drained node handed over before leaving
    assert stats["metadata_snapshots"] >= 2  # the joiners learned the topic from snapshots
    assert stats["dropped"] > 0  # removed replicas were dropped (messages may still come)


def test_the_convergence_check_catches_a_reconciler_that_does_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(placement_cluster, "leader_step", lambda *args, **kwargs: None)
    with pytest.raises(InvariantViolation, match=r"is a member of|voters"):
        PlacementSimulation(1, partitions=10).run()


def test_the_simulation_catches_replicas_made_again_after_their_removal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker's hosting before the fix (any message for a group it did not host made a
    voting member with the initial voters): members dropped after their removal come back
    empty and elect a leader beside the real one."""
    monkeypatch.setattr(placement_cluster, "LEADER_MESSAGES", frozenset(MessageType))
    host = PlacementSimulation._host

    def voting(self: PlacementSimulation, *args: Any, **kwargs: Any) -> None:
        host(self, *args, **{**kwargs, "joining": False})

    monkeypatch.setattr(PlacementSimulation, "_host", voting)
    with pytest.raises(InvariantViolation, match=r"leader completeness|election safety"):
        PlacementSimulation(1).run()
