"""A broker started alone (no initial nodes, no seeds) with more than one worker, on whole node
cores (`NodeCore`) over in-memory storage: worker 0 founds the metadata group, and the other
workers learn it from worker 0 (docs/workers.md). Each worker once founded a metadata group of
its own, and two groups of one name then fought over it. That made a restarted two-worker
broker unready for 30 s (CI46)."""

from __future__ import annotations

from laminar.metadata import CreateTopic
from laminar.node.core import CoreConfig, NodeCore
from laminar.node.store import NodeStorage
from laminar.raft.raft import Role

from .test_leader_balance import Cluster

WORKERS = ("solo", "solo~1")


class Alone(Cluster):
    """`Cluster`, its nodes started as `laminar serve` starts a broker alone."""

    def start(self, node: str) -> None:
        storage = NodeStorage(None, memory=self.disks[node])
        core = NodeCore(CoreConfig(node), storage, lambda: self.members(node), seed=self.seed)
        core.set_clock(self.now_ms, self.now_ms)
        core.open()
        self.cores[node] = core


def metadata_leaders(cluster: Cluster) -> set[str]:
    return {
        node
        for node, core in cluster.cores.items()
        if core.meta is not None and core.meta.raft.role is Role.LEADER
    }


def test_worker_0_founds_the_metadata_group_and_the_other_workers_learn_it() -> None:
    cluster = Alone(WORKERS)
    assert [core.initial_metadata_voters() for core in cluster.cores.values()] == [("solo",)] * 2
    assert cluster.cores["solo~1"].meta is None  # nothing to found: it learns the group
    for _ in range(100):
        cluster.step()
        assert metadata_leaders(cluster) <= {"solo"}
        if metadata_leaders(cluster):
            break
    cluster.cores["solo"].propose_metadata(CreateTopic("t", 2, 1))

    def learned() -> bool:
        worker = cluster.cores["solo~1"]
        return worker.meta is not None and "t" in worker.state.topics

    for _ in range(200):
        if learned():
            break
        cluster.step()
        assert metadata_leaders(cluster) == {"solo"}
    assert learned()
    meta = cluster.cores["solo~1"].meta
    assert meta is not None
    assert (meta.raft.lead, meta.raft.conf.voters) == ("solo", ("solo",))
    assert "solo~1" in meta.raft.conf.learners
