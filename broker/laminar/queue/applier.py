"""A partition replica's consumer groups, kept in step with its committed log.

`QueueApplier` owns the replica's `QueueState`. It is rebuilt from the Raft snapshot data
(the queue state as of some index at or after the snapshot point) plus the committed entries
after it, so it survives restarts, and it is replaced when a snapshot is installed. Only
batch headers are read for record batches; control batches (queue commands) are read whole.
The broker and the simulator drive it the same way:

* `catch_up(last)` after entries up to `last` are committed (and written here);
* `snapshot_data()` when the log is compacted (the snapshot point must be at or below the
  applied index, which it is when compacting at or below the commit);
* `reset()` after installing a snapshot; `trim()` after retention removed segments.

So that a restart does not replay the whole log when retention rarely (or never) compacts
it, the state is also checkpointed to `queue.checkpoint` beside the log every
CHECKPOINT_INDEXES applied indexes; a restart starts from the newer of that and the snapshot.
A checkpoint may be ahead of what survived of the local log after a crash: it only ever
holds committed entries, which the leader sends again and `apply_entry` skips.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..log.batch import parse_header
from ..raft.log_storage import LogStorage
from ..raft.messages import Entry
from .entries import apply_entry
from .state import QueueCommand, QueueConfig, QueueState, Result

CHECKPOINT_FILE = "queue.checkpoint"
CHECKPOINT_INDEXES = 100_000


@dataclass(frozen=True, slots=True)
class Applied:
    index: int
    command: QueueCommand
    result: Result


class QueueApplier:
    def __init__(
        self,
        storage: LogStorage,
        config: QueueConfig | None = None,
        *,
        checkpoint_indexes: int = CHECKPOINT_INDEXES,
    ) -> None:
        self.storage = storage
        self.config = config or QueueConfig()
        self.checkpoint_indexes = checkpoint_indexes
        self.state = self._initial_state()
        self._checkpointed = self.state.end_index
        #: entries written but not applied yet: index -> (count, the batch if control, the
        #: producer id if a transaction's records)
        self._written: dict[int, tuple[int, bytes | None, int]] = {}
        self.catch_up(storage.hard_state.commit)

    def _initial_state(self) -> QueueState:
        states = [
            QueueState.restore(data, self.config)
            for data in (self.storage.snap.data, self.storage.load_file(CHECKPOINT_FILE))
            if data
        ]
        if not states:
            return QueueState(self.config, start_index=self.storage.first_index())
        return max(states, key=lambda state: state.end_index)

    @property
    def applied_index(self) -> int:
        return self.state.end_index - 1

    def written(self, entries: list[Entry]) -> None:
        """Entries just written to the log (replacing any from the first one's index on):
        applying them later needs no read (a restart or a snapshot reads the log instead)."""
        if not entries:
            return
        first = entries[0].index
        if self._written and max(self._written) >= first:
            self._written = {i: e for i, e in self._written.items() if i < first}
        for entry in entries:
            header = parse_header(entry.data)  # (a leader's kinds say NORMAL)
            control = header.is_control
            producer_id = header.producer_id if header.is_transactional else 0
            self._written[entry.index] = (entry.count, entry.data if control else None, producer_id)

    def catch_up(self, last: int) -> list[Applied]:
        """Apply the committed entries up to `last` not applied yet, in order."""
        queue = self.state
        first = self.storage.first_index()
        if queue.end_index < first:
            # the log starts later than our state ends: what lay between is gone
            queue.on_other(queue.end_index, first - queue.end_index)
            queue.trim(first)
        last = min(last, self.storage.last_index())
        applied: list[Applied] = []
        written = self._written
        while queue.end_index <= last:
            index = queue.end_index
            known = written.pop(index, None)
            if known is None:
                self._read_through(last, applied)
                break
            done = apply_entry(queue, index, *known)
            if done is not None:
                applied.append(Applied(index, *done))
        if written and min(written) <= queue.end_index - 1:
            self._written = {i: e for i, e in written.items() if i >= queue.end_index}
        if queue.groups and queue.end_index - self._checkpointed >= self.checkpoint_indexes:
            self.checkpoint()
        return applied

    def _read_through(self, last: int, applied: list[Applied]) -> None:
        """Apply up to `last` from the log itself (headers; control batches whole)."""
        log = self.storage.log
        queue = self.state
        for header in log.batch_headers(queue.end_index):
            if header.base_index > last:
                break
            batch = log.read(header.base_index).data if header.is_control else None
            producer_id = header.producer_id if header.is_transactional else 0
            done = apply_entry(queue, header.base_index, header.record_count, batch, producer_id)
            if done is not None:
                applied.append(Applied(header.base_index, *done))

    def checkpoint(self) -> None:
        """Save the state beside the log (a restart replays only what follows); durable at
        the storage's next sync, the node's group-commit round."""
        self.storage.stage_file(CHECKPOINT_FILE, self.state.snapshot())
        self._checkpointed = self.state.end_index

    def snapshot_data(self) -> bytes:
        return self.state.snapshot()

    def reset(self) -> None:
        """A snapshot was installed: start over from its data."""
        self.state = self._initial_state()
        self._checkpointed = self.state.end_index
        self._written.clear()

    def trim(self) -> None:
        """Retention moved the log start: those messages are gone for every group."""
        self.state.trim(self.storage.first_index())
