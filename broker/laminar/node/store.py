"""One node's storage: where each group it hosts keeps its log and Raft state.

Every replica gets its directory from here, never a path of its own, so the broker (real
directories under `data_dir`, fsynced) and the simulator (`MemoryDirectory`, which loses what
was not synced when a node crashes) open replicas through the same code. Layout on disk:

    <data_dir>/journal/ring                  the node's journal, if it has one
    <data_dir>/metadata/                     the `__cluster` group
    <data_dir>/partitions/<topic>/<n>/       one data partition's replica
    <data_dir>/quarantine/<topic>/<n>-<k>/   a replica of a topic the cluster never knew

Every fsync of a group's running files (its log, its hard state, the queue checkpoint and the
topic file) goes through the node's one group-commit round (`NodeCore.begin`): the storages a
round wrote, or staged files in (`LogStorage.stage_file`), are its `syncs`, the durable hard
states its `saves`, and the shell runs both off the event loop. Opening, closing and
compaction (the metadata log's, and retention's: rare) still sync where they happen.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from ..log.journal import JOURNAL_FILE
from ..log.storage import Directory, FileDirectory, MemoryDirectory
from ..metadata.group import METADATA_GROUP

METADATA_DIR = "metadata"
JOURNAL_DIR = "journal"  # the node's journal (`laminar.log.journal`)
PARTITIONS_DIR = "partitions"
QUARANTINE_DIR = "quarantine"
#: beside a replica's log: which topic (by its identity, the metadata index of its
#: creation) the replica belongs to, so that only a committed deletion of *that* topic
#: removes it
TOPIC_FILE = "topic.json"


def parse_identity(document: bytes | None) -> int | None:
    """The created_index a TOPIC_FILE records (None: no file, a replica from before it was
    recorded)."""
    return int(json.loads(document)["created_index"]) if document is not None else None


NODE_FILE = "node.json"


class StorageIdentityError(Exception):
    pass


class NodeStorage:
    """The directories of one node's groups: real ones under `root`, or (`root` None) in
    memory, surviving `crash()` only as far as they were synced."""

    def __init__(
        self,
        root: Path | None,
        *,
        memory: dict[str, MemoryDirectory] | None = None,
        new_memory: Callable[[], MemoryDirectory] = MemoryDirectory,
    ) -> None:
        """In memory (`root` None): `memory` holds the directories by group ("__cluster",
        "topic/partition"; the simulator's disks), made by `new_memory`."""
        self.root = root
        self._memory = memory if memory is not None else {}
        self._new_memory = new_memory
        self._quarantined = 0

    def claim(self, node_id: str, cluster_id: str) -> None:
        """Record whose data this is, or check it is this node's of this cluster."""
        if self.root is None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / NODE_FILE
        identity = {"node_id": node_id, "cluster_id": cluster_id}
        if not path.exists():
            path.write_text(json.dumps(identity))
            return
        found = json.loads(path.read_text())
        if found != identity:
            raise StorageIdentityError(
                f"{self.root} belongs to node {found.get('node_id')!r} of cluster "
                f"{found.get('cluster_id')!r}, not {node_id!r} of {cluster_id!r}"
            )

    def _path(self, topic: str | None, partition: int) -> Path:
        assert self.root is not None
        if topic is None:
            return self.root / METADATA_DIR
        return self.root / PARTITIONS_DIR / topic / str(partition)

    def exists(self, topic: str | None, partition: int = 0) -> bool:
        if self.root is None:
            return _group(topic, partition) in self._memory
        return self._path(topic, partition).exists()

    def directory(self, topic: str | None, partition: int = 0) -> Directory:
        """The directory of a partition's replica (`topic` None: the metadata group's),
        created if missing."""
        if self.root is None:
            group = _group(topic, partition)
            if group not in self._memory:
                self._memory[group] = self._new_memory()
            return self._memory[group]
        path = self._path(topic, partition)
        path.mkdir(parents=True, exist_ok=True)
        return FileDirectory(str(path))

    def has_journal(self) -> bool:
        """A journal was made here (by a run with one)."""
        if self.root is None:
            found = self._memory.get(JOURNAL_DIR)
            return found is not None and JOURNAL_FILE in found.names()
        return (self.root / JOURNAL_DIR / JOURNAL_FILE).exists()

    def journal_directory(self) -> Directory:
        """The directory of the node's journal, created if missing."""
        if self.root is None:
            if JOURNAL_DIR not in self._memory:
                self._memory[JOURNAL_DIR] = self._new_memory()
            return self._memory[JOURNAL_DIR]
        path = self.root / JOURNAL_DIR
        if not path.exists():
            path.mkdir(parents=True)
            _sync_path(self.root)
        return FileDirectory(str(path))

    def partitions(self) -> list[tuple[str, int]]:
        """Every (topic, partition) with a replica stored here, in order."""
        if self.root is None:
            found = [g.rpartition("/") for g in self._memory if g != METADATA_GROUP]
            return sorted((t, int(p)) for t, _, p in found if p.isdigit())
        root = self.root / PARTITIONS_DIR
        if not root.exists():
            return []
        return sorted(
            (topic_dir.name, int(part_dir.name))
            for topic_dir in root.iterdir()
            for part_dir in topic_dir.iterdir()
            if part_dir.name.isascii() and part_dir.name.isdigit()
        )

    def topic_identity(self, topic: str, partition: int) -> int | None:
        """The created_index of the topic the stored replica belongs to (None: not recorded,
        a replica from before it was recorded)."""
        directory = self.directory(topic, partition)
        if TOPIC_FILE not in directory.names():
            return None
        storage = directory.open(TOPIC_FILE, create=False)
        try:
            return parse_identity(bytes(storage.read(0, storage.size)))
        finally:
            storage.close()

    def remove(self, topic: str, partition: int) -> None:
        """Delete a replica's data (closed first by its owner)."""
        if self.root is None:
            self._memory.pop(_group(topic, partition), None)
        else:
            shutil.rmtree(self._path(topic, partition), ignore_errors=True)

    def quarantine(self, topic: str, partition: int, stamp: int) -> str:
        """Move a (closed) replica out of the way, keeping it; returns where it went."""
        self._quarantined += 1
        name = f"{partition}-{stamp}-{self._quarantined}"
        if self.root is None:
            self._memory[f"{QUARANTINE_DIR}:{topic}:{name}"] = self._memory.pop(
                _group(topic, partition)
            )
            return f"{QUARANTINE_DIR}/{topic}/{name}"
        target = self.root / QUARANTINE_DIR / topic / name
        target.parent.mkdir(parents=True, exist_ok=True)
        self._path(topic, partition).rename(target)
        return str(target)


def _group(topic: str | None, partition: int) -> str:
    return METADATA_GROUP if topic is None else f"{topic}/{partition}"


def _sync_path(path: Path) -> None:
    """fsync a directory: a name made in it is durable then."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
