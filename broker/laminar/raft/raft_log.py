"""The Raft log as the core sees it: stable storage plus the unstable tail not yet persisted.

Entries are whole batches; `index` arguments that start entries are batch bases. Lookups at
or after `offset` use the unstable tail (which may have replaced a stable suffix after a
conflict, until the caller persists it); lookups before it use storage.
"""

from __future__ import annotations

from bisect import bisect_right

from .messages import Entry, Snapshot
from .storage import RaftStorage, StorageUnavailable


class RaftLog:
    def __init__(self, storage: RaftStorage, committed: int) -> None:
        self.storage = storage
        self.unstable: list[Entry] = []
        self.unstable_snapshot: Snapshot | None = None
        self.offset = storage.last_index() + 1  # first index the unstable tail covers
        self.committed = committed

    # ---- reads -----------------------------------------------------------------------------

    def first_index(self) -> int:
        if self.unstable_snapshot is not None:
            return self.unstable_snapshot.index + 1
        return self.storage.first_index()

    def last_index(self) -> int:
        if self.unstable:
            return self.unstable[-1].last_index
        if self.unstable_snapshot is not None:
            return self.unstable_snapshot.index
        return self.offset - 1

    def last_term(self) -> int:
        term = self.term(self.last_index())
        assert term is not None
        return term

    def _unstable_slot(self, index: int) -> int:
        return bisect_right(self.unstable, index, key=_entry_index) - 1

    def term(self, index: int) -> int | None:
        """Term at `index`, None if compacted away or beyond the end."""
        snapshot = self.unstable_snapshot
        if snapshot is not None:
            if index == snapshot.index:
                return snapshot.term
            if index < snapshot.index:
                return None
        if index >= self.offset:
            if not self.unstable or index > self.unstable[-1].last_index:
                return None
            return self.unstable[self._unstable_slot(index)].term
        try:
            return self.storage.term(index)
        except StorageUnavailable:
            return None

    def match_term(self, index: int, term: int) -> bool:
        return self.term(index) == term

    def batch_start(self, index: int) -> int:
        """Base index of the entry holding `index` (itself for the snapshot's index)."""
        if index >= self.offset and self.unstable:
            return self.unstable[self._unstable_slot(index)].index
        if self.unstable_snapshot is not None and index == self.unstable_snapshot.index:
            return index
        return self.storage.batch_start(index)

    def entries(self, lo: int, max_bytes: int) -> list[Entry]:
        """Whole entries from the one starting at `lo`, at most `max_bytes` (at least one)."""
        out: list[Entry] = []
        size = 0
        if lo < self.offset:
            for entry in self.storage.entries(lo, max_bytes):
                if entry.index >= self.offset:
                    break
                out.append(entry)
                size += len(entry.data)
            if size >= max_bytes or (out and out[-1].last_index + 1 < self.offset):
                return out
        start = self._unstable_slot(max(lo, self.offset)) if self.unstable else 0
        for entry in self.unstable[start:]:
            if out and size + len(entry.data) > max_bytes:
                break
            out.append(entry)
            size += len(entry.data)
        return out

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Is a log ending at (last_index, last_term) at least as up to date as ours (§5.4.1)?"""
        our_term = self.last_term()
        return last_term > our_term or (last_term == our_term and last_index >= self.last_index())

    def find_conflict(self, entries: tuple[Entry, ...]) -> int | None:
        """Position in `entries` of the first one our log lacks or holds with another term."""
        for position, entry in enumerate(entries):
            if not self.match_term(entry.index, entry.term):
                return position
        return None

    def conflict_hint(self, index: int, term: int) -> int:
        """For a rejected append at `index`: the largest index <= it whose term is <= `term`
        (the leader's term there), so the leader skips whole terms at a time (§5.3)."""
        index = min(index, self.last_index())
        while index >= self.first_index():
            our_term = self.term(index)
            if our_term is None or our_term <= term:
                break
            index = self.batch_start(index) - 1
        return index

    # ---- writes ----------------------------------------------------------------------------

    def append(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """Append entries that start at an entry boundary <= last_index + 1, replacing any
        suffix from there."""
        if not entries:
            return
        first = entries[0].index
        assert first <= self.last_index() + 1, (first, self.last_index())
        assert first > self.committed, "committed entries are never replaced"
        if first >= self.offset:
            del self.unstable[self._unstable_slot(first - 1) + 1 if self.unstable else 0 :]
            if self.unstable:
                assert self.unstable[-1].last_index + 1 == first
        else:
            self.unstable = []
            self.offset = first
        self.unstable.extend(entries)

    def stable_to(self, index: int, term: int) -> None:
        """The caller persisted the unstable tail up to the entry ending at `index`."""
        if not self.unstable or self.term(index) != term or index < self.offset:
            return
        keep = self._unstable_slot(index) + 1
        del self.unstable[:keep]
        self.offset = index + 1

    def restore(self, snapshot: Snapshot) -> None:
        self.unstable = []
        self.unstable_snapshot = snapshot
        self.offset = snapshot.index + 1
        self.committed = snapshot.index

    def snapshot_persisted(self, snapshot: Snapshot) -> None:
        if self.unstable_snapshot == snapshot:
            self.unstable_snapshot = None

    def commit_to(self, index: int) -> bool:
        if index > self.committed:
            assert index <= self.last_index(), (index, self.last_index())
            self.committed = index
            return True
        return False


def _entry_index(entry: Entry) -> int:
    return entry.index
