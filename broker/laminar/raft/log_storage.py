"""Raft storage over the partition's segmented log: the Raft log *is* the partition log.

Each Raft entry is one stored batch (its term is the batch's term). Hard state (term, vote,
commit, configuration, repair floor) and the snapshot point (the index/term/configuration just
before the log's first index) live in `raft.state`, and the state machine's snapshot data (if
any) in `raft.snapshot`; both are replaced atomically: write a temporary file, fsync it, rename
it over the old one, fsync the directory.

The commit index alone is not worth two fsyncs per round (Raft never needs it back), but a
restart that knows it reopens where it was instead of rescanning the log after an old commit,
and can tell a log that lost committed entries. So it is also kept in `raft.commit`, a hint
written in place without fsync every `commit_save_indexes` and checked by its own checksum: a
torn or stale hint is ignored, a newer one wins over `raft.state`.

Off the event loop. The broker writes a round's entries in an I/O thread: `write_later`
plans them (a conflicting suffix is cut at once), `flush` hands the round's disk work for this
storage to the thread (`Flush`: write the entries, then fdatasync the log and the staged
files), and its `publish`, back on the loop, makes the entries part of the log. Until then
`last_index` and every read are as before the round: the Raft core keeps those entries in its
unstable log, and the node core applies committed entries only once they are published.

Damage. A batch that fails its checksum is never served: reads raise StorageUnavailable (the
log's `on_corrupt` hook tells the runtime, which repairs the replica). `begin_repair` cuts the
log at a damaged batch after durably recording the repair floor (see `HardState`), so a crash
in between leaves a node that still knows it must not campaign.
"""

from __future__ import annotations

import json
import logging
import random
import struct
from collections.abc import Callable, Sequence
from dataclasses import replace

import xxhash

from ..log.batch import BatchHeader, decode_batch, parse_header, split_batches
from ..log.errors import CorruptBatchError, IndexOutOfRangeError, StorageError
from ..log.journal import Section
from ..log.segmented_log import LogWrite, LostRecords, SegmentedLog
from ..log.storage import Directory, DirectWrite, Storage
from .messages import ConfState, Entry, EntryKind, HardState, Snapshot, up_to_date_order
from .storage import StorageUnavailable

STATE_FILE = "raft.state"
COMMIT_FILE = "raft.commit"  # the commit index hint: commit, its term, xxh3-64 of both
COMMIT_HINT = struct.Struct("<qqQ")
#: the commit index hint of a data partition is written every this many indexes
COMMIT_SAVE_INDEXES = 1 << 12
SNAPSHOT_FILE = "raft.snapshot"  # the state machine's snapshot data, if it has any
TEMP_SUFFIX = ".tmp"

log = logging.getLogger(__name__)
_EPOCHS = random.SystemRandom()


def new_epoch() -> int:
    """A log's journal epoch (see `laminar.log.journal`): its value only tells incarnations
    apart, so it comes from the system's randomness (the simulator's runs do not depend on
    it: nothing is sized or ordered by it)."""
    return _EPOCHS.getrandbits(63)


def entry_kind(batch: bytes | memoryview) -> EntryKind:
    if not parse_header(batch).is_control:
        return EntryKind.NORMAL
    (record,) = decode_batch(batch)
    return EntryKind.CONF if record.key == b"conf" else EntryKind.NOOP


class LogStorage:
    """RaftStorage reads for the core; `append` / `set_hard_state` / `apply_snapshot` /
    `sync` for the runtime draining a Ready."""

    def __init__(
        self,
        directory: Directory,
        log: SegmentedLog,
        *,
        conf: ConfState,
        joining: bool = False,
        commit_save_indexes: int = COMMIT_SAVE_INDEXES,
        replay: Sequence[Section] = (),
    ) -> None:
        """Open the Raft state in `directory` beside `log`; `conf` bootstraps a new group;
        `replay`: what the node's journal holds of this log (`replay`).
        The commit index hint is written once the commit moved `commit_save_indexes` past the
        last one: 1 keeps it exact, for a group whose state a restart replays up to its
        commit (the cluster metadata). `joining`: a new group's state starts as a joining
        member's (see `HardState.joining`)."""
        self.directory = directory
        self.log = log
        self.commit_save_indexes = commit_save_indexes
        self.commit_term = 0
        self._commit_unsaved = False
        self._hint: Storage | None = None
        self._staged: set[str] = set()  # files written by `stage_file`, made durable by `sync`
        self._planned: LogWrite | None = None  # entries `write_later` planned, for `flush`
        #: batches this node checked as they entered the cluster, by the index proposed at
        #: (`checked`): `write_later` does not check them again
        self._checked: dict[int, tuple[bytes, BatchHeader, int]] = {}
        #: called whenever `planned` or `needs_sync` may have become true (the node's round
        #: flushes only the storages that said so)
        self.on_pending: Callable[[], None] = _nothing
        #: the log's journal epoch, and whether the state file holds it: only then may its
        #: writes go through the node's journal (`journals`)
        self.journal_epoch = new_epoch()
        self._epoch_saved = False
        #: entries `write_later` planned, for the journal's record of the round
        self._planned_entries: list[Entry] = []
        self._unsynced = False  # written through the journal since the log's last sync
        #: conflicting suffixes cut so far, and how many of those cuts a journal checkpoint
        #: covered: while one is not, every write goes through the journal (`must_journal`)
        self.cuts = 0
        self._cuts_covered = 0
        if STATE_FILE in directory.names():
            self.hard_state, self.snap = self._load()
            if SNAPSHOT_FILE in directory.names():
                self.snap = replace(self.snap, data=self._read(SNAPSHOT_FILE))
            self._match_snapshot()
            self._replay(replay)
        else:
            self.hard_state = HardState(conf=conf, joining=joining)
            self.snap = Snapshot(log.start_index - 1, 0, conf)
            if conf.voters or conf.learners or joining:
                # durable before the group is used: a member that came back without its
                # bootstrap would have no voters, and when all did, no leader ever again
                self._save()
        self._load_commit_hint()
        self._saved_commit = self.hard_state.commit
        if STATE_FILE in directory.names() and not self._epoch_saved:
            self._save()  # a state from before the journal: its epoch, before any write

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

    def stage_file(self, name: str, data: bytes) -> None:
        """Write a file of the state machine's beside the log now; it replaces the old one,
        atomically and durably, at the next `sync` (the node's group-commit round, off the
        event loop). Until then a crash keeps the old one."""
        if name in (STATE_FILE, SNAPSHOT_FILE):
            raise ValueError(f"{name} belongs to the Raft storage")
        temp_name = name + TEMP_SUFFIX
        self.directory.remove(temp_name)
        temp = self.directory.open(temp_name, create=True)
        try:
            temp.write(0, (data,))
        finally:
            temp.close()
        self._staged.add(name)
        self.on_pending()

    @property
    def needs_sync(self) -> bool:
        """Files were staged since the last `sync`."""
        return bool(self._staged)

    def load_file(self, name: str) -> bytes | None:
        """A file written by `stage_file` (as of its last sync), or None."""
        return self._read(name) if name in self.directory.names() else None

    def _load(self) -> tuple[HardState, Snapshot]:
        document = json.loads(self._read(STATE_FILE))
        hs, snap = document["hard_state"], document["snapshot"]
        floor = hs.get("repair_floor")
        hard_state = HardState(
            hs["term"],
            hs["vote"],
            hs["commit"],
            ConfState(tuple(hs["voters"]), tuple(hs["learners"])),
            (floor[0], floor[1]) if floor is not None else None,
            bool(hs.get("joining", False)),
        )
        self.commit_term = hs.get("commit_term", hs["term"])
        if (epoch := document.get("journal_epoch")) is not None:
            self.journal_epoch, self._epoch_saved = int(epoch, 16), True
        snapshot = Snapshot(
            snap["index"],
            snap["term"],
            ConfState(tuple(snap["voters"]), tuple(snap["learners"])),
        )
        return hard_state, snapshot

    def _save(self, *, sync: bool = True) -> None:
        hs, snap = self.hard_state, self.snap
        self.commit_term = self.term_or(hs.commit, hs.term)
        document = {
            "hard_state": {
                "term": hs.term,
                "vote": hs.vote,
                "commit": hs.commit,
                # the commit entry's term: a log that comes back without that entry repairs
                # from a floor at it (see `HardState.repair_floor`)
                "commit_term": self.commit_term,
                "voters": list(hs.conf.voters),
                "learners": list(hs.conf.learners),
                "repair_floor": list(hs.repair_floor) if hs.repair_floor else None,
                "joining": hs.joining,
            },
            "snapshot": {
                "index": snap.index,
                "term": snap.term,
                "voters": list(snap.conf.voters),
                "learners": list(snap.conf.learners),
            },
            # (hex of a fixed width: the file's size does not depend on its value)
            "journal_epoch": f"{self.journal_epoch:016x}",
        }
        self._replace(STATE_FILE, json.dumps(document, sort_keys=True).encode(), sync=sync)
        if sync:
            self._epoch_saved = True
        self._commit_unsaved = False
        self._saved_commit = hs.commit
        if self._hint is not None or COMMIT_FILE in self.directory.names():
            self._write_commit_hint()  # never older than the state it would override

    def _load_commit_hint(self) -> None:
        if COMMIT_FILE not in self.directory.names():
            return
        data = self._read(COMMIT_FILE)
        if len(data) != COMMIT_HINT.size:
            return
        commit, term, checksum = COMMIT_HINT.unpack(data)
        if checksum != xxhash.xxh3_64_intdigest(data[:16]) or commit <= self.hard_state.commit:
            return
        self.hard_state = replace(self.hard_state, commit=commit)
        self.commit_term = term

    def _write_commit_hint(self) -> None:
        """Write the commit index hint in place (no fsync: losing it costs only time)."""
        commit = self.hard_state.commit
        self.commit_term = self.term_or(commit, self.hard_state.term)
        head = struct.pack("<qq", commit, self.commit_term)
        data = head + xxhash.xxh3_64_intdigest(head).to_bytes(8, "little")
        if self._hint is None:
            create = COMMIT_FILE not in self.directory.names()
            self._hint = self.directory.open(COMMIT_FILE, create=create)
        self._hint.write(0, (data,))
        self._saved_commit = commit

    def term_or(self, index: int, default: int) -> int:
        """The term of the entry at `index`, or `default` where the log cannot tell."""
        if index == self.snap.index:
            return self.snap.term
        try:
            term = self.log.term_at(index)
        except IndexOutOfRangeError:
            return default
        return term or default  # a damaged span's term reads 0

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
        except (IndexOutOfRangeError, CorruptBatchError) as e:
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
            # header and checksum only: a follower stores what its leader holds (the records
            # were checked where the batch entered the cluster, and one stored before appends
            # checked them must still replicate, or no replica could be added)
            result = self.log.append(entry.data, term=entry.term, check_records=False)
            if result.base_index != entry.index:
                raise StorageError(f"entry {entry.index} landed at {result.base_index}")

    def checked(self, index: int, batch: bytes, header: BatchHeader, digest: int) -> None:
        """A leader proposed `batch` at `index` after `verify_batch` gave `header` and
        `digest` for it: `write_later` uses them, for an entry at `index` whose data is this
        very object, instead of checking the batch again. Forgotten by the next `write_later`
        (a proposal is written by the round after it)."""
        self._checked[index] = (batch, header, digest)

    def write_later(self, entries: list[Entry]) -> None:
        """Plan writing entries, replacing any overlapping suffix (cut now): `flush` writes
        them off the event loop, and they are part of the log once its `publish` ran."""
        checked, self._checked = self._checked, {}
        if not entries:
            return
        if self._planned is not None:
            # planned by a round that failed before its flush: nothing of it was written
            self._planned.discard()
            self._planned = None
        first = entries[0].index
        if first <= self.last_index():
            self.log.truncate(first)
            self.cuts += 1
        # header and checksum only, as `append`; not again for what this node checked (the
        # very bytes: an entry that replaced a proposal is checked)
        known = [
            None if (c := checked.get(e.index)) is None or c[0] is not e.data else c[1:]
            for e in entries
        ]
        write = self.log.begin_write(
            [(e.data, e.term) for e in entries], check_records=False, checked=known
        )
        for entry, result in zip(entries, write.results, strict=True):
            if result.base_index != entry.index:
                write.discard()
                raise StorageError(f"entry {entry.index} would land at {result.base_index}")
        self._planned = write
        self._planned_entries = entries
        self.on_pending()

    @property
    def planned(self) -> bool:
        """`write_later` planned entries that no `flush` took yet."""
        return self._planned is not None

    def flush(self, *, sync: bool) -> Flush:
        """This storage's disk work of a round, to run off the event loop: write the planned
        entries, then (`sync`) make the log durable and each staged file (`Flush`)."""
        staged: list[str] = []
        if sync:
            staged, self._staged = sorted(self._staged), set()
        planned, self._planned = self._planned, None
        self._planned_entries = []  # (`flush_journaled` took them first)
        if sync:
            self._unsynced = False
        return Flush(self, planned, sync, staged)

    def sync(self) -> None:
        """Make the log durable, then each staged file (fsync it, rename it over the old
        one, fsync the directory)."""
        self.log.sync()
        self._unsynced = False
        self._flush_staged()

    def _flush_staged(self, staged: list[str] | None = None) -> None:
        """Make the files staged (`staged`: those a `Flush` took) durable and current."""
        if staged is None:
            staged, self._staged = sorted(self._staged), set()
        for name in staged:
            temp = self.directory.open(name + TEMP_SUFFIX, create=False)
            try:
                temp.sync()
            finally:
                temp.close()
            self.directory.rename(name + TEMP_SUFFIX, name)
        if staged:
            self.directory.sync()

    def saves_durably(self, hard_state: HardState) -> bool:
        """Whether `set_hard_state(hard_state)` writes and fsyncs the state file (term, vote,
        configuration or repair floor changed), rather than only memory or the hint."""
        old = self.hard_state
        return _durable(hard_state) != _durable(old)

    def set_hard_state(self, hard_state: HardState) -> None:
        """Persist term, vote, configuration and repair floor durably before returning. A
        change of the commit index alone goes to the commit hint every `commit_save_indexes`
        and into the state at the next durable save or `close`."""
        old = self.hard_state
        self.hard_state = hard_state
        if _durable(hard_state) != _durable(old):
            self._save()
        elif hard_state.commit - self._saved_commit >= self.commit_save_indexes:
            self._write_commit_hint()
            self._commit_unsaved = True
        elif hard_state.commit != old.commit:
            self._commit_unsaved = True

    def close(self) -> None:
        """Sync the log (what it wrote through the journal is its own then), save a
        remembered commit index durably (a clean close); release the hint file."""
        if self._unsynced and not self.log.closed:
            self.log.sync()
            self._unsynced = False
        if self._commit_unsaved:
            self._save()
        self._flush_staged()
        if self._hint is not None:
            self._hint.close()
            self._hint = None

    def lost_floor(self) -> tuple[int, int] | None:
        """(index, term) of the saved commit if the log no longer reaches it (it lost records
        a majority holds, perhaps with this node's acknowledgement), else None."""
        commit = self.hard_state.commit
        if commit <= self.last_index():
            return None
        return commit, self.commit_term

    def begin_repair(self, index: int, floor: tuple[int, int] | None) -> None:
        """The log is damaged from `index` on (a batch boundary, or past the end): record
        `floor` (the (index, term) the log ended at before the damage; None: no floor, for a
        group with no other voter to repair from) durably as the repair floor, then cut the
        log there (at the snapshot point at the lowest); the commit index follows the cut."""
        old = self.hard_state.repair_floor
        if old is not None and floor is not None:
            floor = max(old, floor, key=up_to_date_order)
        # Damage at or below the snapshot point lies in records kept only because retention
        # removes whole segments: the log restarts right after the snapshot point instead.
        cut = max(index, self.first_index())
        if cut <= self.last_index():
            cut = self.log.batch_range(cut)[0]  # the whole batch holding it
        commit = max(min(self.hard_state.commit, cut - 1, self.last_index()), self.snap.index)
        self.hard_state = replace(self.hard_state, commit=commit, repair_floor=floor)
        self.log.sync()  # what the cut keeps, durable without the journal's records
        self.new_journal_epoch()
        self._save()
        if index <= self.snap.index:
            self.log.reset(cut)
        elif cut <= self.last_index():
            self.log.truncate(cut)

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        """Install a snapshot (its data too): the log restarts empty right after it. The
        state file names the snapshot before the log is emptied: a crash in between leaves
        a log that `_match_snapshot` empties at the next open."""
        self._replace(SNAPSHOT_FILE, snapshot.data)
        self.snap = snapshot
        self.new_journal_epoch()  # (the log restarts empty: nothing of it to keep)
        self._save()
        self.log.reset(snapshot.index + 1)

    def _match_snapshot(self) -> None:
        """Keep the log only if it holds the snapshot's last entry (with its term) or starts
        right after it, as Raft's snapshot install does; otherwise start it empty after the
        snapshot (what an install interrupted by a crash left undone)."""
        snap, log = self.snap, self.log
        if log.start_index == snap.index + 1 or snap.index < log.start_index:
            return
        # (a damaged batch's term reads 0: unknown, left to the repair of damage)
        if snap.index < log.next_index and log.term_at(snap.index) in (snap.term, 0):
            return
        log.reset(snap.index + 1)

    def _replay(self, sections: Sequence[Section]) -> None:
        """Redo what the node's journal holds of this log (of its epoch), entry by entry, by
        Raft's follower rule: skip an entry below the log's start or one it holds with that
        term, cut where the term differs, append at the end. Then sync the log (what it
        holds may be only in the page cache), and forget the damage the log's recovery found
        past its torn end if the journal made it whole again. An entry past the end, or on a
        damaged span, stops the replay: repair takes over from there."""
        log_ = self.log
        ours = [s for s in sections if s.epoch == self.journal_epoch]
        if not ours:
            return
        redone = 0
        for entry in (e for section in ours for e in section.entries):
            if entry.index < log_.start_index:
                continue
            if entry.index < log_.next_index:
                base, _ = log_.batch_range(entry.index)
                term = log_.term_at(entry.index)
                if base == entry.index and term == entry.term:
                    continue
                if base != entry.index or term == 0:
                    log.warning(
                        "%s: the journal's entry %d meets %s: replay stops there",
                        self.directory,
                        entry.index,
                        "a damaged span" if term == 0 else f"a batch from {base}",
                    )
                    break
                log_.truncate(entry.index)
            if entry.index != log_.next_index:
                log.warning(
                    "%s: the journal's entry %d is past the log's end %d: replay stops there",
                    self.directory,
                    entry.index,
                    log_.next_index,
                )
                break
            log_.append(entry.data, term=entry.term, check_records=False)
            redone += 1
        log_.sync()
        held = None
        if ours[-1].entries:  # the last entry written: the log as of the last record ends there
            last = ours[-1].entries[-1]
            held = (last.index + parse_header(last.data).record_count - 1, last.term)
        self._settle_recovery(held)
        if redone:
            log.info("%s: %d entries redone from the journal", self.directory, redone)

    def _settle_recovery(self, held: tuple[int, int] | None) -> None:
        """After a replay: the damage the log's recovery found is no damage if the journal
        made the log whole again; and what the journal held durably (its last record of the
        log, `held`: (index, term) of its last record) and the log does not hold now is lost,
        with that as the floor a repair must reach (this node may have acknowledged it)."""
        log_ = self.log
        report = log_.recovery
        lost = report.lost
        if lost is not None and lost.last is not None:
            index, term = lost.last
            if log_.start_index <= index < log_.next_index and log_.term_at(index) == term:
                lost = None  # made whole again
        if held is not None:
            index, term = held
            holds = log_.start_index <= index < log_.next_index and log_.term_at(index) == term
            if not holds and index >= log_.start_index:
                first = log_.next_index if lost is None else min(lost.first_index, log_.next_index)
                lost = LostRecords(first, held if lost is None else lost.last)
            if lost is not None:
                floors = [held] + ([lost.last] if lost.last is not None else [])
                lost = LostRecords(lost.first_index, max(floors, key=up_to_date_order))
        if lost != report.lost:
            log_.recovery = replace(report, lost=lost)

    # ---- the journal -----------------------------------------------------------------------

    @property
    def journals(self) -> bool:
        """Its writes may go through the node's journal: its epoch is saved."""
        return self._epoch_saved

    def flush_journaled(self) -> tuple[Flush, list[Entry]]:
        """`flush` for a round that makes the planned entries durable through the journal:
        the log is written without a sync (unless files are staged, which sync it too);
        returns the entries for the journal's record."""
        entries, self._planned_entries = self._planned_entries, []
        flush = self.flush(sync=self.needs_sync)
        self._unsynced = not flush.syncs
        return flush, entries

    @property
    def must_journal(self) -> bool:
        """Its planned entries must go through the journal, however large: its log was cut
        since the journal's last checkpoint, and a replay of the records from before the cut
        would cut it again (the newer records redo what follows, so they must hold it all)."""
        return self.cuts > self._cuts_covered

    def covered(self, cuts: int) -> None:
        """A checkpoint made the journal's records of this log from before its `cuts`-th cut
        dead (`cuts`: what `cuts` was when the checkpoint took its log to sync)."""
        self._cuts_covered = max(self._cuts_covered, cuts)

    @property
    def planned_bytes(self) -> int:
        return sum(len(e.data) for e in self._planned_entries)

    @property
    def planned_entries(self) -> list[Entry]:
        """The entries `write_later` planned (for the size of the journal's record)."""
        return self._planned_entries

    def sync_job(self, *, writeback: bool) -> DirectWrite | Callable[[], None] | None:
        """A journal checkpoint's part for this log: its fdatasync (what it wrote through
        the journal is its own then), off the event loop, with `writeback` the bytes written
        since the last one written back in pieces first (beside the rounds: `FileStorage.direct`);
        None if it is closed (a close synced it). The checkpoint says what it covered
        (`covered`) once it is done."""
        if self.log.closed:
            return None
        return self.log.direct_sync(writeback=writeback) or self._sync_log

    def _sync_log(self) -> None:
        if not self.log.closed:  # (closed since: its close synced it)
            self.log.sync()

    def new_journal_epoch(self) -> None:
        """A change that is not an append (a snapshot install, a repair cut) is coming: the
        journal's records of this log so far are not to be replayed over what follows. The
        caller has synced what the log keeps; saved by the caller's `_save`."""
        self.journal_epoch = new_epoch()
        self._epoch_saved = False
        self._cuts_covered = self.cuts

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


class Flush:
    """One storage's disk work of a round (`LogStorage.flush`): `run` it in an I/O thread,
    then `publish` on the event loop. Nothing in `run` changes what the loop reads: the
    entries become part of the log (its end, its reads) at `publish` only. A storage error
    in `run` leaves the log unpublished and unwritable: the caller stops (fail-stop)."""

    def __init__(
        self, storage: LogStorage, write: LogWrite | None, sync: bool, staged: list[str]
    ) -> None:
        self.storage = storage
        self._write = write
        #: fdatasync the log and the staged files (the fsync policy, or files staged)
        self.syncs = sync
        self._staged = staged

    @property
    def writes(self) -> bool:
        """It writes entries (else it only syncs)."""
        return self._write is not None

    def write(self) -> None:
        """The first half of `run`: write the entries (not durable yet)."""
        if self._write is not None:
            self._write.write()

    def sync(self) -> None:
        """The second half of `run`: fdatasync the log, then each staged file (fsync, rename,
        directory fsync), if this flush syncs."""
        if not self.syncs:
            return
        if self._write is not None:
            self._write.sync()
        else:
            self.storage.log.sync()
        self.storage._flush_staged(self._staged)

    def run(self) -> None:
        """`write` then `sync`: what an I/O thread runs."""
        self.write()
        self.sync()

    def job(self) -> DirectWrite | Callable[[], None]:
        """`run` as a DirectWrite for threads without the GIL when it can be one (no staged
        files, no segment rolled on the way, real files), else `run` itself."""
        direct: DirectWrite | None = None
        if not self._staged:
            if self._write is not None:
                direct = self._write.direct(sync=self.syncs)
            elif self.syncs:
                direct = self.storage.log.direct_sync()
        return self.run if direct is None else direct

    def publish(self) -> None:
        """On the event loop once `run` returned: the entries are part of the log."""
        if self._write is not None:
            self._write.publish()


def _durable(hs: HardState) -> tuple[object, ...]:
    """What of a hard state must be on disk before anything that depends on it is sent."""
    return hs.term, hs.vote, hs.conf, hs.repair_floor, hs.joining


def _nothing() -> None:
    pass
