"""One write-ahead journal per node: a round's log writes made durable by one fdatasync.

Without it, a group-commit round (`laminar.node.core`) fdatasyncs every log it wrote, and on
this machine the syncs of different files do not overlap: each pays about 0.2 ms in turn
(bench/RESULTS.md, `bench/disk_bench.py`). With it, the round writes each log without a sync
and the same entries into this one file, and fdatasyncs only that.

The file: two header slots of `SLOT_BYTES`, then a ring of records, written full of zeros when
it is made: a record's write goes in place, and ext4 commits no metadata with its fdatasync.

* A slot holds (magic, generation, start sequence, start position) and a checksum; the valid
  slot of the higher generation says where the live records begin.
* A record is a head (magic, kind, sequence, body length, body checksum, head checksum) and a
  body: for each log the round wrote, its key, its epoch and its entries (index, term, batch).
  Sequences follow each other; a record never spans the ring's end (a WRAP record, or no room
  for a head, sends the next one to the ring's start). The scan stops at the first record
  whose magic, sequence or checksums fail: that is the journal's end.
* Replay (`LogStorage.replay`) applies each entry by Raft's follower rule: skip it below the
  log's start or where the log holds that index with that term, cut the log where the term
  differs, append at the end. So it is idempotent, and gives the state of the last durable
  record whatever pages of the logs reached the disk. An entry of another epoch than the
  log's is skipped: a snapshot install or a repair cut starts a new epoch (after syncing what
  the cut keeps), and a replica made anew starts with a random one.
* A checkpoint, once the live records reach `CHECKPOINT_BYTES` or half the ring, syncs the
  logs written through the journal since its start beside the rounds; then a round writes the
  header that starts the journal where the next record was then (`mark`, `header_to`) with
  its record, and that space is free once the round is done (`moved`). A round whose record
  does not fit checkpoints first itself: every log synced, then the header that moves the
  start past every record (`begin_checkpoint`), and only then its record, which may reuse
  that space.
* A log that writes much in a round syncs itself instead, unless it was cut since the last
  checkpoint (`laminar.node.core`, `LogStorage.must_journal`).

A journal is one node's: the round that writes it is the node's, one at a time.
"""

from __future__ import annotations

import contextlib
import logging
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import xxhash

from .batch import Buffer
from .errors import StorageError
from .storage import Directory, DirectWrite, FileStorage, Storage

log = logging.getLogger(__name__)

JOURNAL_FILE = "ring"
SLOT_BYTES = 4096
RING_START = 2 * SLOT_BYTES
#: the smallest journal: its ring holds a few rounds of small records
MIN_JOURNAL_BYTES = RING_START + 64 * 1024
#: live records past which a checkpoint begins, whatever the ring's size: it fdatasyncs the
#: logs written since the last, one at a time (a few, when they are many), each writing its
#: bytes back in pieces first (`Broker._beside`). Every 4 MiB, the RF 3 p99 at 5,000 msg/s
#: was 19-24 ms against 11-19 without a journal; every 1 MiB, 15-18 (bench/RESULTS.md, issue
#: 22, twenty-eighth sitting)
CHECKPOINT_BYTES = 1 << 20
#: the largest a broker takes
MAX_JOURNAL_BYTES = 16 << 30
_ZEROS_BYTES = 1 << 20  # written a time, making the file
_SLOT_MAGIC = b"LMJRNL01"
_SLOT = struct.Struct("<8sQQQ")  # magic, generation, start sequence, start position
_RECORD_MAGIC = 0x4C4A5243
_HEAD = struct.Struct("<IIQQQ")  # magic, kind, sequence, body length, body checksum
HEAD_BYTES = _HEAD.size + 8  # and the head's own checksum
_KIND_ROUND, _KIND_WRAP = 1, 2
_SECTION = struct.Struct("<HQI")  # key length, epoch, entry count
_ENTRY = struct.Struct("<QQI")  # index, term, batch length


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One log entry as journaled: the batch at `index` of `term`."""

    index: int
    term: int
    data: bytes


@dataclass(slots=True)
class Section:
    """One log's part of the records scanned: its entries of one epoch, in order."""

    epoch: int
    entries: list[JournalEntry] = field(default_factory=list)


class Journal:
    """The journal file of one node (`open`), its records scanned once for replay (`take`)."""

    def __init__(self, directory: Directory, storage: Storage, size_bytes: int) -> None:
        self._directory = directory
        self._storage = storage
        self.size_bytes = size_bytes
        self._wanted_bytes = size_bytes  # the configured size (the file's may differ)
        self._generation = 0
        self._start_seq, self._start_pos = 0, RING_START
        self._next_seq, self._next_pos = 0, RING_START
        self._wrapped = False  # the live records run past the ring's end to its start
        #: from the scan: each key's sections, in the order written (`take`)
        self._found: dict[str, list[Section]] = {}

    # ---- opening ---------------------------------------------------------------------------

    @classmethod
    def open(cls, directory: Directory, size_bytes: int) -> Journal:
        """The journal in `directory`, its records scanned (`take` gives them out); made anew
        (`size_bytes` of zeros, synced) when there is none. A journal of another
        size is kept until `restart`, which makes it anew at this one."""
        if size_bytes < MIN_JOURNAL_BYTES:
            raise ValueError(f"a journal needs at least {MIN_JOURNAL_BYTES} bytes")
        if JOURNAL_FILE not in directory.names():
            return cls(directory, _made(directory, size_bytes), size_bytes)
        storage = directory.open(JOURNAL_FILE, create=False)
        journal = cls(directory, storage, storage.size)
        if not journal._read_header():
            storage.close()
            # (made whole before its name was given, and its two slots written in turn)
            raise StorageError(
                f"the journal {JOURNAL_FILE!r} has no valid header: it is damaged, and the "
                "log writes it holds are unknown"
            )
        journal._scan()
        journal._wanted_bytes = size_bytes
        return journal

    def _slot(self, generation: int, start: tuple[int, int] | None = None) -> bytes:
        seq, position = start or (self._start_seq, self._start_pos)
        head = _SLOT.pack(_SLOT_MAGIC, generation, seq, position)
        return head + xxhash.xxh3_64_intdigest(head).to_bytes(8, "little")

    def _read_header(self) -> bool:
        """Take the valid slot of the higher generation; False when neither is valid."""
        best: tuple[int, int, int] | None = None
        if self._storage.size < RING_START + HEAD_BYTES:
            return False
        for slot in range(2):
            raw = self._storage.read(slot * SLOT_BYTES, _SLOT.size + 8)
            magic, generation, seq, position = _SLOT.unpack_from(raw)
            checksum = int.from_bytes(raw[_SLOT.size :], "little")
            if magic != _SLOT_MAGIC or checksum != xxhash.xxh3_64_intdigest(raw[: _SLOT.size]):
                continue
            if not RING_START <= position < self.size_bytes:
                continue
            if best is None or generation > best[0]:
                best = (generation, seq, position)
        if best is None:
            return False
        self._generation, self._start_seq, self._start_pos = best
        return True

    def _scan(self) -> None:
        """Read the live records from the start, to the first that fails."""
        seq, position, wrapped = self._start_seq, self._start_pos, False
        scanned = 0
        while scanned <= self.size_bytes:
            if position + HEAD_BYTES > self.size_bytes:
                if wrapped:
                    break
                position, wrapped = RING_START, True
                continue
            raw = self._storage.read(position, HEAD_BYTES)
            magic, kind, found_seq, length, body_sum = _HEAD.unpack_from(raw)
            head_sum = int.from_bytes(raw[_HEAD.size :], "little")
            if (
                magic != _RECORD_MAGIC
                or found_seq != seq
                or head_sum != xxhash.xxh3_64_intdigest(raw[: _HEAD.size])
            ):
                break
            if kind == _KIND_WRAP:
                if wrapped:
                    break
                seq, position, wrapped = seq + 1, RING_START, True
                continue
            end = position + HEAD_BYTES + length
            if kind != _KIND_ROUND or end > self.size_bytes:
                break
            if wrapped and end > self._start_pos:
                break
            body = self._storage.read(position + HEAD_BYTES, length)
            if xxhash.xxh3_64_intdigest(body) != body_sum:
                break
            self._decode(body)
            scanned += end - position
            seq, position = seq + 1, end
        self._next_seq, self._next_pos, self._wrapped = seq, position, wrapped

    def _decode(self, body: bytes) -> None:
        view = memoryview(body)
        at = 0
        while at < len(view):
            key_bytes, epoch, count = _SECTION.unpack_from(view, at)
            at += _SECTION.size
            key = bytes(view[at : at + key_bytes]).decode()
            at += key_bytes
            sections = self._found.setdefault(key, [])
            if not sections or sections[-1].epoch != epoch:
                sections.append(Section(epoch))
            entries = sections[-1].entries
            for _ in range(count):
                index, term, length = _ENTRY.unpack_from(view, at)
                at += _ENTRY.size
                entries.append(JournalEntry(index, term, bytes(view[at : at + length])))
                at += length

    def take(self, key: str) -> list[Section]:
        """The scanned sections of log `key` (once: replaying them is its opener's)."""
        return self._found.pop(key, [])

    def untaken(self) -> list[str]:
        """Keys with scanned records no opener took."""
        return sorted(self._found)

    def restart(self) -> None:
        """After replay (every log named synced by its opener): start empty where the scan
        ended, durably, before any record is written over the old ones."""
        self._found.clear()
        if self._wanted_bytes != self.size_bytes:  # its size was changed: made anew
            self._storage.close()
            self._storage = _made(self._directory, self._wanted_bytes)
            self.size_bytes = self._wanted_bytes
            self._generation, self._wrapped = 0, False
            self._start_seq, self._start_pos = self._next_seq, RING_START
            self._next_pos = RING_START
        self._move_start()

    # ---- writing ---------------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        if self._wrapped:
            return (self.size_bytes - self._start_pos) + (self._next_pos - RING_START)
        return self._next_pos - self._start_pos

    @property
    def wants_checkpoint(self) -> bool:
        """The live records fill half the ring, or `CHECKPOINT_BYTES`: the next round should
        checkpoint."""
        used = self.used_bytes
        return used >= CHECKPOINT_BYTES or used * 2 >= self.size_bytes - RING_START

    @staticmethod
    def body_bytes(key: str, batch_sizes: Sequence[int]) -> int:
        """What a log's section adds to a record: its key, and batches of these sizes."""
        return _SECTION.size + len(key.encode()) + sum(_ENTRY.size + n for n in batch_sizes)

    def _place(self, length: int) -> tuple[int, bytes | None, bool] | None:
        """Where a record of `length` bytes goes (position, a WRAP record to write first,
        whether it wraps), or None if it would overwrite live records."""
        position, wrap, wrapped = self._next_pos, None, self._wrapped
        if position + length > self.size_bytes:
            if wrapped:
                return None
            if position + HEAD_BYTES <= self.size_bytes:
                wrap = self._head(_KIND_WRAP, self._next_seq, 0, 0)
            position, wrapped = RING_START, True
        if wrapped and position + length > self._start_pos:
            return None
        return position, wrap, wrapped

    def fits(self, body_bytes: int) -> bool:
        return self._place(HEAD_BYTES + body_bytes) is not None

    @staticmethod
    def _head(kind: int, seq: int, length: int, body_sum: int) -> bytes:
        head = _HEAD.pack(_RECORD_MAGIC, kind, seq, length, body_sum)
        return head + xxhash.xxh3_64_intdigest(head).to_bytes(8, "little")

    def write_round(
        self,
        sections: Sequence[tuple[str, int, Sequence[tuple[int, int, Buffer]]]],
        header: tuple[int, bytes] | None = None,
    ) -> JournalFlush:
        """The round's record of `sections` (key, epoch, entries as (index, term, batch)),
        to write and fdatasync off the event loop (`JournalFlush`), with `header` (a
        `header_to`'s) if given. The caller checked that it `fits`."""
        parts: list[Buffer] = []
        for key, epoch, entries in sections:
            key_bytes = key.encode()
            parts.append(_SECTION.pack(len(key_bytes), epoch, len(entries)) + key_bytes)
            for index, term, data in entries:
                parts.append(_ENTRY.pack(index, term, len(data)))
                parts.append(data)
        body = b"".join(parts)
        placed = self._place(HEAD_BYTES + len(body))
        if placed is None:
            raise StorageError("the journal's record does not fit: checkpoint first")
        position, wrap, wrapped = placed
        writes: list[tuple[int, Sequence[Buffer]]] = []
        if header is not None:
            writes.append((header[0], (header[1],)))
        seq = self._next_seq
        if wrap is not None:  # (with no room for its head, the scan wraps by itself)
            writes.append((self._next_pos, (wrap,)))
            seq += 1
        head = self._head(_KIND_ROUND, seq, len(body), xxhash.xxh3_64_intdigest(body))
        writes.append((position, (head, body)))
        self._next_seq, self._wrapped = seq + 1, wrapped
        self._next_pos = position + HEAD_BYTES + len(body)
        return JournalFlush(self._storage, writes)

    def begin_checkpoint(self) -> Callable[[], None]:
        """A checkpoint: the ring is empty from now on (for `fits` and `write_round`), and the
        returned job writes that header durably. Run it off the event loop once every log
        written through the journal since its start is synced, and before this round's
        record is written (which may go where the old records were)."""
        self._start_seq, self._start_pos, self._wrapped = self._next_seq, self._next_pos, False
        self._generation += 1
        slot = (self._generation % 2) * SLOT_BYTES
        header = self._slot(self._generation)

        def write_header() -> None:
            self._storage.write(slot, (header,))
            self._storage.sync()

        return write_header

    def mark(self) -> tuple[int, int]:
        """Where the next record goes: (sequence, position)."""
        return self._next_seq, self._next_pos

    def header_to(self, start: tuple[int, int]) -> tuple[int, bytes] | None:
        """The header (position, bytes) that starts the journal at `start` (a `mark`), to
        write with a round's record (`write_round`) or alone (`header_flush`): the space
        before it is free once that round's fdatasync is done (`moved`), not before. None if
        the start is there or past it already (a later checkpoint went first)."""
        if start[0] <= self._start_seq:
            return None
        self._generation += 1
        return (self._generation % 2) * SLOT_BYTES, self._slot(self._generation, start)

    def header_flush(self, header: tuple[int, bytes]) -> JournalFlush:
        return JournalFlush(self._storage, [(header[0], (header[1],))])

    def moved(self, start: tuple[int, int]) -> None:
        """The header starting the journal at `start` is durable: the space before is free."""
        seq, position = start
        if seq <= self._start_seq:
            return
        self._start_seq, self._start_pos = seq, position
        self._wrapped = position > self._next_pos

    def _move_start(self) -> None:
        self.begin_checkpoint()()

    def close(self) -> None:
        self._storage.close()

    def remove(self) -> None:
        """No journal from now on: remove its file (after replay, every log named synced)."""
        self._storage.close()
        self._directory.remove(JOURNAL_FILE)
        self._directory.sync()


class JournalFlush:
    """A round's record: written, then the journal fdatasync'd, in an I/O thread (as a log's
    `Flush`, whose interface it has: `write`, `sync`, `run`, `job`, `publish`)."""

    syncs = True
    writes = True

    def __init__(self, storage: Storage, writes: list[tuple[int, Sequence[Buffer]]]) -> None:
        self._storage = storage
        self._writes = writes

    def write(self) -> None:
        for position, parts in self._writes:
            self._storage.write(position, parts)

    def sync(self) -> None:
        self._storage.sync()

    def run(self) -> None:
        self.write()
        self.sync()

    def job(self) -> DirectWrite | Callable[[], None]:
        if isinstance(self._storage, FileStorage):
            direct = self._storage.direct(self._writes, sync=True)
            if direct is not None:
                return direct
        return self.run

    def publish(self) -> None:
        pass


def _made(directory: Directory, size_bytes: int) -> Storage:
    """A new journal file of `size_bytes`, zeros with an empty header, synced, then given its
    name (a crash leaves the old file, or none, or the new one whole: never one half made)."""
    temp = JOURNAL_FILE + ".tmp"
    directory.remove(temp)
    storage = directory.open(temp, create=True)
    try:
        zeros = bytes(_ZEROS_BYTES)
        for position in range(0, size_bytes, len(zeros)):
            storage.write(position, (zeros[: min(len(zeros), size_bytes - position)],))
        head = _SLOT.pack(_SLOT_MAGIC, 0, 0, RING_START)
        storage.write(0, (head + xxhash.xxh3_64_intdigest(head).to_bytes(8, "little"),))
        storage.sync()
    except BaseException:  # (a full disk: the space it took is given back)
        storage.close()
        with contextlib.suppress(StorageError):
            directory.remove(temp)
        raise
    storage.close()
    directory.rename(temp, JOURNAL_FILE)  # (over the old one at once, if any)
    directory.sync()
    return directory.open(JOURNAL_FILE, create=False)
