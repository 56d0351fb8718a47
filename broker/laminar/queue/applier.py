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
"""

from __future__ import annotations

from dataclasses import dataclass

from ..raft.log_storage import LogStorage
from .entries import apply_entry
from .state import QueueCommand, QueueConfig, QueueState, Result


@dataclass(frozen=True, slots=True)
class Applied:
    index: int
    command: QueueCommand
    result: Result


class QueueApplier:
    def __init__(self, storage: LogStorage, config: QueueConfig | None = None) -> None:
        self.storage = storage
        self.config = config or QueueConfig()
        self.state = self._initial_state()
        self.catch_up(storage.hard_state.commit)

    def _initial_state(self) -> QueueState:
        data = self.storage.snap.data
        if data:
            return QueueState.restore(data, self.config)
        return QueueState(self.config, start_index=self.storage.first_index())

    @property
    def applied_index(self) -> int:
        return self.state.end_index - 1

    def catch_up(self, last: int) -> list[Applied]:
        """Apply the committed entries up to `last` not applied yet, in order."""
        log = self.storage.log
        queue = self.state
        first = self.storage.first_index()
        if queue.end_index < first:
            # the log starts later than our state ends: what lay between is gone
            queue.on_other(queue.end_index, first - queue.end_index)
            queue.trim(first)
        last = min(last, self.storage.last_index())
        applied: list[Applied] = []
        if queue.end_index > last:
            return applied
        for header in log.batch_headers(queue.end_index):
            if header.base_index > last:
                break
            batch = log.read(header.base_index).data if header.is_control else None
            done = apply_entry(queue, header.base_index, header.record_count, batch)
            if done is not None:
                applied.append(Applied(header.base_index, *done))
        return applied

    def snapshot_data(self) -> bytes:
        return self.state.snapshot()

    def reset(self) -> None:
        """A snapshot was installed: start over from its data."""
        self.state = self._initial_state()

    def trim(self) -> None:
        """Retention moved the log start: those messages are gone for every group."""
        self.state.trim(self.storage.first_index())
