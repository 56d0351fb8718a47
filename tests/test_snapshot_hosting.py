"""A node that learns a topic from a metadata snapshot, never from the command that made it,
hosts the partitions it is an initial voter of, as applying the command would have made it
do; on whole node cores (`NodeCore`) over in-memory storage. Before, only the command did:
two voters of a partition that learned its topic from a snapshot left it without a leader
for good (node simulator seed 133)."""

from __future__ import annotations

import pytest

import laminar.node.core
from laminar.metadata import CreateTopic

from .test_leader_balance import TOPIC, Cluster

NODES = ("n1", "n2", "n3", "n4", "n5")
PARTITIONS = 12


def test_voters_that_learn_a_topic_from_a_snapshot_host_its_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(laminar.node.core, "METADATA_COMPACT_ENTRIES", 1)  # compact at once
    cluster = Cluster(NODES)
    cluster.run_until(lambda: cluster.metadata_leader() is not None, 100)
    leader = cluster.metadata_leader()
    assert leader is not None
    away = tuple(n for n in NODES if n != leader.id)[:2]

    def cut_off() -> None:  # nothing reaches or leaves the two nodes away
        cluster.in_flight = [m for m in cluster.in_flight if not {m.src, m.dst} & set(away)]
        cluster.step()

    def compacted_past_the_topic() -> bool:
        made = leader.state.topics.get(TOPIC)
        meta = leader.meta
        return (
            made is not None
            and meta is not None
            and meta.storage.first_index() > made.created_index
        )

    leader.propose_metadata(CreateTopic(TOPIC, PARTITIONS, 3))
    for _ in range(100):
        if compacted_past_the_topic():
            break
        cut_off()
    assert compacted_past_the_topic()
    topic = leader.state.topics[TOPIC]
    both_away = [p for p, voters in enumerate(topic.assignment) if set(away) <= set(voters)]
    assert both_away, "the hash placed no partition on both nodes away: pick another seed"
    for node in away:
        assert TOPIC not in cluster.cores[node].state.topics

    cluster.run_until(lambda: cluster.all_led(PARTITIONS), 300)
    for node in away:
        core = cluster.cores[node]
        assert core.meta is not None and core.meta.storage.first_index() > topic.created_index
        hosted = {r.partition for r in core.replicas.values()}
        assert hosted >= {p for p, voters in enumerate(topic.assignment) if node in voters}
