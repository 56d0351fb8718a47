"""What the Raft core reads from stable storage, and an in-memory implementation.

The core only reads storage; the caller writes it when draining a Ready (entries, hard
state, snapshot) and then calls `advance()`. Index -1 stands before the first record (term 0).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from typing import Protocol

from .messages import ConfState, Entry, HardState, Snapshot


class StorageUnavailable(Exception):
    """The requested index is compacted away (below first_index) or not yet persisted."""


class RaftStorage(Protocol):
    def initial_state(self) -> tuple[HardState, Snapshot]: ...
    def first_index(self) -> int: ...
    def last_index(self) -> int: ...
    def term(self, index: int) -> int: ...
    def entries(self, lo: int, max_bytes: int) -> list[Entry]: ...
    def batch_start(self, index: int) -> int: ...
    def snapshot(self) -> Snapshot: ...


READ_CHUNK_BYTES = 1 << 20


def stored_entries(storage: RaftStorage, first: int, last: int) -> Iterator[Entry]:
    """The stored entries holding indexes [first, last], clipped to the stored log, in order
    (read in chunks of READ_CHUNK_BYTES)."""
    index = max(first, storage.first_index())
    last = min(last, storage.last_index())
    while index <= last:
        entries = storage.entries(storage.batch_start(index), READ_CHUNK_BYTES)
        for entry in entries:
            if entry.index > last:
                return
            yield entry
        index = entries[-1].last_index + 1


class MemoryRaftStorage:
    """Entries in a list: for unit tests of the core."""

    def __init__(self, conf: ConfState | None = None) -> None:
        self.hard_state = HardState(conf=conf or ConfState(()))
        self.snap = Snapshot(-1, 0, self.hard_state.conf)
        self.log: list[Entry] = []

    # ---- reads (the core) -----------------------------------------------------------------

    def initial_state(self) -> tuple[HardState, Snapshot]:
        return self.hard_state, self.snap

    def first_index(self) -> int:
        return self.snap.index + 1

    def last_index(self) -> int:
        return self.log[-1].last_index if self.log else self.snap.index

    def _slot(self, index: int) -> int:
        slot = bisect_right(self.log, index, key=_entry_index) - 1
        if slot < 0 or index > self.log[slot].last_index:
            raise StorageUnavailable(
                f"index {index} is not in [{self.first_index()}, {self.last_index()}]"
            )
        return slot

    def term(self, index: int) -> int:
        if index == self.snap.index:
            return self.snap.term
        return self.log[self._slot(index)].term

    def entries(self, lo: int, max_bytes: int) -> list[Entry]:
        slot = self._slot(lo)
        out: list[Entry] = []
        size = 0
        for entry in self.log[slot:]:
            if out and size + len(entry.data) > max_bytes:
                break
            out.append(entry)
            size += len(entry.data)
        return out

    def batch_start(self, index: int) -> int:
        if index == self.snap.index:
            return index
        return self.log[self._slot(index)].index

    def snapshot(self) -> Snapshot:
        return self.snap

    # ---- writes (the caller, draining a Ready) --------------------------------------------

    def append(self, entries: list[Entry]) -> None:
        if not entries:
            return
        first = entries[0].index
        if first <= self.last_index():
            self.log = [e for e in self.log if e.index < first]
        assert first == self.last_index() + 1, (first, self.last_index())
        self.log.extend(entries)

    def set_hard_state(self, hard_state: HardState) -> None:
        self.hard_state = hard_state

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        """The log restarts empty after the snapshot (entries after it may conflict)."""
        self.snap = snapshot
        self.log = []

    def compact(self, index: int) -> None:
        """Drop entries up to the entry ending at `index` (retention); `index` must end one.
        The snapshot records the configuration as of the last commit: compact at the commit
        index for it to be exact."""
        slot = self._slot(index)
        entry = self.log[slot]
        assert entry.last_index == index
        self.snap = Snapshot(index, entry.term, self.hard_state.conf)
        del self.log[: slot + 1]


def _entry_index(entry: Entry) -> int:
    return entry.index
