"""The leader's view of one follower's log: match and next index, and the send window."""

from __future__ import annotations

from collections import deque
from enum import IntEnum


class ProgressState(IntEnum):
    PROBE = 0  # one append at a time until the follower's position is known
    REPLICATE = 1  # pipelined appends, up to max_inflight_appends unacknowledged
    SNAPSHOT = 2  # a snapshot is on its way; no appends until it is acknowledged


class Progress:
    __slots__ = (
        "commit_notices",
        "inflight",
        "is_learner",
        "match",
        "next",
        "pending_snapshot",
        "probe_sent",
        "recent_active",
        "snapshot_ticks",
        "state",
    )

    def __init__(self, next_index: int, *, is_learner: bool = False) -> None:
        self.match = -1  # highest index known replicated (durable) on the follower
        self.next = next_index  # base index of the next entry to send
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflight: deque[int] = deque()  # last index of each unacknowledged append
        self.recent_active = False
        self.pending_snapshot = -1
        self.snapshot_ticks = 0  # heartbeats since the snapshot was sent
        self.is_learner = is_learner
        #: whether the follower wants to be told of each commit at once (its answers say:
        #: `laminar.raft.raft`, "Commit notices on demand"); until it answers, it does
        self.commit_notices = True

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self.state = ProgressState.PROBE
        self.probe_sent = False
        self.inflight.clear()
        self.pending_snapshot = -1

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflight.clear()

    def become_snapshot(self, snapshot_index: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = snapshot_index
        self.snapshot_ticks = 0
        self.probe_sent = False
        self.inflight.clear()

    def maybe_update(self, index: int) -> bool:
        """The follower has everything up to `index`. True if that is news."""
        updated = index > self.match
        if updated:
            self.match = index
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        while self.inflight and self.inflight[0] <= index:
            self.inflight.popleft()
        return updated

    def sent(self, last_index: int) -> None:
        """An append ending at `last_index` went out."""
        if self.state is ProgressState.REPLICATE:
            self.next = last_index + 1
            self.inflight.append(last_index)
        else:
            self.probe_sent = True

    def maybe_decrease_to(self, rejected: int, hint_next: int) -> bool:
        """An append whose previous index was `rejected` failed; retry from `hint_next`.
        False if the rejection is stale."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False
        next_index = max(min(rejected, hint_next), self.match + 1)
        if next_index == self.next:
            # it lacks the entry it acknowledged last: damage cost it entries, which its log
            # repair fetches again (`laminar.raft.raft`, "Log repair"); probe again at the next
            # heartbeat, not at once (that went back and forth as fast as the network allows)
            return False
        self.next = next_index
        self.probe_sent = False
        return True

    def is_paused(self, max_inflight: int) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return len(self.inflight) >= max_inflight
        return True
