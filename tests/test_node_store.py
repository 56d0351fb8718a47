"""A node's storage service: real directories under the data directory or in-memory ones
(the simulator's), opened through the same calls; identity checked; nothing deleted that was
not asked for."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar.log.storage import MemoryDirectory
from laminar.node.store import NodeStorage, StorageIdentityError


@pytest.mark.parametrize("on_disk", [True, False])
def test_partitions_are_found_removed_and_quarantined(tmp_path: Path, on_disk: bool) -> None:
    store = NodeStorage(tmp_path / "data" if on_disk else None)
    assert store.partitions() == [] and not store.exists(None)
    for topic, partition in [("b", 1), ("a", 10), ("a", 2)]:
        directory = store.directory(topic, partition)
        directory.open("x", create=True).close()
    store.directory(None)  # the metadata group's: not a partition
    assert store.exists(None)
    assert store.partitions() == [("a", 2), ("a", 10), ("b", 1)]
    store.remove("a", 10)
    where = store.quarantine("b", 1, stamp=7)
    assert "quarantine" in where and "b" in where
    assert store.partitions() == [("a", 2)]
    assert store.directory("a", 2).names() == ["x"]  # kept


def test_a_data_directory_belongs_to_one_node_of_one_cluster(tmp_path: Path) -> None:
    store = NodeStorage(tmp_path)
    store.claim("n1", "c1")
    store.claim("n1", "c1")  # the same node again: fine
    with pytest.raises(StorageIdentityError, match="belongs to node 'n1' of cluster 'c1'"):
        NodeStorage(tmp_path).claim("n2", "c1")


def test_in_memory_directories_are_the_callers_and_made_by_its_factory() -> None:
    disks: dict[str, MemoryDirectory] = {}
    store = NodeStorage(None, memory=disks, new_memory=lambda: MemoryDirectory(0))
    directory = store.directory("t", 0)
    assert disks == {"t/0": directory}
    with pytest.raises(OSError):  # its capacity: 0 bytes
        directory.open("f", create=True).write(0, (b"data",))
