"""A node core with a journal (`CoreConfig.journal_bytes`), over in-memory disks that a power
cut takes back to what was synced: what it applied survives, through checkpoints and wraps
of a small journal, and a journal left by a run with one is replayed by a run without.
(The node simulator, `laminar.sim --node`, runs the same with faults.)"""

from __future__ import annotations

import logging

import pytest

from laminar.log.errors import StorageError
from laminar.log.journal import JOURNAL_FILE, MIN_JOURNAL_BYTES
from laminar.log.storage import MemoryDirectory
from laminar.metadata import CreateTopic
from laminar.node.core import CoreConfig, NodeCore
from laminar.node.store import JOURNAL_DIR, NodeStorage
from laminar.raft.raft import Role

from .test_leader_balance import Cluster

NODE = "solo"


class Journaled(Cluster):
    """One node started alone, with a journal of `journal_bytes` (0: none); `Cluster` carries
    out its rounds as the broker's driver does, with their journal checkpoints."""

    journal_bytes = MIN_JOURNAL_BYTES

    def start(self, node: str) -> None:
        storage = NodeStorage(None, memory=self.disks[node])
        config = CoreConfig(node, journal_bytes=self.journal_bytes)
        core = NodeCore(config, storage, lambda: self.members(node), seed=self.seed)
        core.set_clock(self.now_ms, self.now_ms)
        core.open()
        self.cores[node] = core

    def power_cut(self) -> None:
        """Every disk back to what was synced, the core gone without closing; started again."""
        self.cores.pop(NODE)
        for directory in self.disks[NODE].values():
            directory.crash()
        self.start(NODE)


def lead(cluster: Cluster) -> NodeCore:
    core = cluster.cores[NODE]
    for _ in range(100):
        if core.meta is not None and core.meta.raft.role is Role.LEADER:
            return core
        cluster.step()
    raise AssertionError("no metadata leader")


def create_topics(cluster: Cluster, names: list[str]) -> None:
    """Each topic's creation proposed and applied, one at a time."""
    for name in names:
        core = lead(cluster)
        core.propose_metadata(CreateTopic(name, 1, 1))
        for _ in range(50):
            if name in core.state.topics:
                break
            cluster.step()
        assert name in core.state.topics


def test_what_was_applied_survives_power_cuts_through_checkpoints() -> None:
    cluster = Journaled((NODE,))
    applied: list[str] = []
    for cut in range(3):
        names = [f"t{cut}-{n}" for n in range(100)]
        create_topics(cluster, names)
        applied += names
        cluster.power_cut()
        assert sorted(lead(cluster).state.topics) == sorted(applied)
    assert cluster.checkpoints >= 2  # the small journal filled and was checkpointed


def test_a_journal_left_by_a_run_with_one_is_replayed_by_a_run_without() -> None:
    cluster = Journaled((NODE,))
    create_topics(cluster, ["kept"])
    disk = cluster.disks[NODE]
    assert JOURNAL_FILE in disk[JOURNAL_DIR].names()
    cluster.journal_bytes = 0
    cluster.power_cut()
    assert "kept" in lead(cluster).state.topics
    assert JOURNAL_FILE not in disk[JOURNAL_DIR].names()
    create_topics(cluster, ["after"])  # each log syncs itself again
    cluster.power_cut()
    assert sorted(lead(cluster).state.topics) == ["after", "kept"]


def test_with_no_room_for_a_new_journal_the_node_runs_without_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker upgraded on a full disk still starts: the journal it cannot make (ENOSPC)
    leaves no half-made file behind, and every log fdatasyncs itself, so what it applied
    survives a power cut. Once there is room, the next start makes the journal."""
    cluster = Journaled((NODE,))
    full = MemoryDirectory(capacity_bytes=MIN_JOURNAL_BYTES // 2)
    cluster.disks[NODE][JOURNAL_DIR] = full
    with caplog.at_level(logging.WARNING, logger="laminar.node.core"):
        cluster.start(NODE)
    assert "no room for a journal" in caplog.text
    assert cluster.cores[NODE].journal is None and full.names() == []
    create_topics(cluster, ["kept"])
    cluster.power_cut()
    assert sorted(lead(cluster).state.topics) == ["kept"]
    assert cluster.cores[NODE].journal is None
    full.capacity_bytes = None  # room again
    cluster.power_cut()
    assert cluster.cores[NODE].journal is not None and JOURNAL_FILE in full.names()
    assert sorted(lead(cluster).state.topics) == ["kept"]


def test_a_journal_that_fails_otherwise_stops_the_node() -> None:
    """Only a missing journal that has no room is left out: one that is there and damaged is
    not (what it holds is unknown), nor is another failure to make one."""
    cluster = Journaled((NODE,))
    create_topics(cluster, ["kept"])
    journal = cluster.disks[NODE][JOURNAL_DIR]
    journal.files[JOURNAL_FILE].data[:] = bytes(len(journal.files[JOURNAL_FILE].data))
    journal.files[JOURNAL_FILE].durable[:] = journal.files[JOURNAL_FILE].data
    with pytest.raises(StorageError, match="no valid header"):
        cluster.power_cut()
