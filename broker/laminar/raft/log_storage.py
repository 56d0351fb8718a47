"""Raft storage over the partition's segmented log: the Raft log *is* the partition log.

Each Raft entry is one stored batch (its term is the batch's term). Hard state (term, vote,
commit, configuration) and the snapshot point (the index/term/configuration just before the
log's first index) live in `raft.state`, and the state machine's snapshot data (if any) in
`raft.snapshot`; both are replaced atomically: write a temporary file, fsync it, rename it
over the old one, fsync the directory.
"""

from __future__ import annotations

import json
from dataclasses import replace

from ..log.batch import decode_batch, parse_header, split_batches
from ..log.errors import IndexOutOfRangeError, StorageError
from ..log.segmented_log import SegmentedLog
from ..log.storage import Directory
from .messages import ConfState, Entry, EntryKind, HardState, Snapshot
from .storage import StorageUnavailable

STATE_FILE = "raft.state"
SNAPSHOT_FILE = "raft.snapshot"  # the state machine's snapshot data, if it has any
TEMP_SUFFIX = ".tmp"


def entry_kind(batch: bytes | memoryview) -> EntryKind:
    if not parse_header(batch).is_control:
        return EntryKind.NORMAL
    (record,) = decode_batch(batch)
    return EntryKind.CONF if record.key == b"conf" else EntryKind.NOOP


class LogStorage:
    """RaftStorage reads for the core; `append` / `set_hard_state` / `apply_snapshot` /
    `sync` for the runtime draining a Ready."""

    def __init__(self, directory: Directory, log: SegmentedLog, *, conf: ConfState) -> None:
        """Open the Raft state in `directory` beside `log`; `conf` bootstraps a new group."""
        self.directory = directory
        self.log = log
        self._commit_unsaved = False
        if STATE_FILE in directory.names():
            self.hard_state, self.snap = self._load()
            if SNAPSHOT_FILE in directory.names():
                self.snap = replace(self.snap, data=self._read(SNAPSHOT_FILE))
        else:
            self.hard_state = HardState(conf=conf)
            self.snap = Snapshot(log.start_index - 1, 0, conf)

    # ---- the state file --------------------------------------------------------------------

    def _read(self, name: str) -> bytes:
        storage = self.directory.open(name, create=False)
        try:
            return storage.read(0, storage.size)
        finally:
            storage.close()

    def _replace(self, name: str, data: bytes, *, sync: bool = True) -> None:
        """Atomically replace file `name` with `data`."""
        temp_name = name + TEMP_SUFFIX
        self.directory.remove(temp_name)
        temp = self.directory.open(temp_name, create=True)
        try:
            temp.write(0, (data,))
            if sync:
                temp.sync()
        finally:
            temp.close()
        self.directory.rename(temp_name, name)
        if sync:
            self.directory.sync()

    def save_file(self, name: str, data: bytes) -> None:
        """Atomically and durably replace a file of the state machine's beside the log."""
        if name in (STATE_FILE, SNAPSHOT_FILE):
            raise ValueError(f"{name} belongs to the Raft storage")
        self._replace(name, data)

    def load_file(self, name: str) -> bytes | None:
        """A file written by `save_file`, or None."""
        return self._read(name) if name in self.directory.names() else None

    def _load(self) -> tuple[HardState, Snapshot]:
        document = json.loads(self._read(STATE_FILE))
        hs, snap = document["hard_state"], document["snapshot"]
        hard_state = HardState(
            hs["term"],
            hs["vote"],
            hs["commit"],
            ConfState(tuple(hs["voters"]), tuple(hs["learners"])),
        )
        snapshot = Snapshot(
            snap["index"],
            snap["term"],
            ConfState(tuple(snap["voters"]), tuple(snap["learners"])),
        )
        return hard_state, snapshot

    def _save(self, *, sync: bool = True) -> None:
        hs, snap = self.hard_state, self.snap
        document = {
            "hard_state": {
                "term": hs.term,
                "vote": hs.vote,
                "commit": hs.commit,
                "voters": list(hs.conf.voters),
                "learners": list(hs.conf.learners),
            },
            "snapshot": {
                "index": snap.index,
                "term": snap.term,
                "voters": list(snap.conf.voters),
                "learners": list(snap.conf.learners),
            },
        }
        self._replace(STATE_FILE, json.dumps(document, sort_keys=True).encode(), sync=sync)
        self._commit_unsaved = False

    # ---- reads -----------------------------------------------------------------------------

    def initial_state(self) -> tuple[HardState, Snapshot]:
        return self.hard_state, self.snap

    def first_index(self) -> int:
        return self.snap.index + 1

    def last_index(self) -> int:
        return self.log.next_index - 1

    def term(self, index: int) -> int:
        if index == self.snap.index:
            return self.snap.term
        try:
            return self.log.term_at(index)
        except IndexOutOfRangeError as e:
            raise StorageUnavailable(str(e)) from e

    def entries(self, lo: int, max_bytes: int) -> list[Entry]:
        try:
            result = self.log.read_range(lo, max_bytes)
        except IndexOutOfRangeError as e:
            raise StorageUnavailable(str(e)) from e
        out = []
        for batch in split_batches(result.data):
            header = parse_header(batch)
            data = bytes(batch)
            out.append(
                Entry(header.base_index, header.record_count, header.term, data, entry_kind(data))
            )
        return out

    def batch_start(self, index: int) -> int:
        if index == self.snap.index:
            return index
        try:
            return self.log.batch_range(index)[0]
        except IndexOutOfRangeError as e:
            raise StorageUnavailable(str(e)) from e

    def snapshot(self) -> Snapshot:
        return self.snap

    # ---- writes ----------------------------------------------------------------------------

    def append(self, entries: list[Entry]) -> None:
        """Write entries (not yet durable: call `sync`), replacing any overlapping suffix."""
        if not entries:
            return
        first = entries[0].index
        if first <= self.last_index():
            self.log.truncate(first)
        for entry in entries:
            result = self.log.append(entry.data, term=entry.term)
            if result.base_index != entry.index:
                raise StorageError(f"entry {entry.index} landed at {result.base_index}")

    def sync(self) -> None:
        self.log.sync()

    def set_hard_state(self, hard_state: HardState) -> None:
        """Persist term, vote and configuration durably before returning. A change of the
        commit index alone is only remembered (written by the next durable save or `flush`):
        Raft never needs it back after a crash, and saving it would cost two fsyncs per Ready.
        """
        old = self.hard_state
        self.hard_state = hard_state
        if (hard_state.term, hard_state.vote, hard_state.conf) != (old.term, old.vote, old.conf):
            self._save()
        elif hard_state.commit != old.commit:
            self._commit_unsaved = True

    def flush(self) -> None:
        """Write a remembered commit index (on a clean close)."""
        if self._commit_unsaved:
            self._save()

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        """Install a snapshot (its data too): the log restarts empty right after it."""
        self._replace(SNAPSHOT_FILE, snapshot.data)
        self.snap = snapshot
        self.log.reset(snapshot.index + 1)
        self._save()

    def compact(self, through_index: int, data: bytes = b"") -> None:
        """Retention: record the snapshot point at `through_index` (which must end a stored
        batch) before the segments holding it may be removed. The snapshot records the
        configuration as of the last commit: compact at the commit index for it to be exact.
        `data` is the state machine's snapshot as of `through_index` (sent to replicas that
        need entries from before the log's new start)."""
        _, end = self.log.batch_range(through_index)
        if end - 1 != through_index:
            raise StorageUnavailable(f"{through_index} does not end a batch")
        self._replace(SNAPSHOT_FILE, data)
        self.snap = Snapshot(
            through_index, self.log.term_at(through_index), self.hard_state.conf, data
        )
        self._save()
