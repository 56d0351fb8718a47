"""Raft knobs in one place; time is counted in ticks of the caller's clock."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RaftConfig:
    #: A follower that hears nothing from a leader for a randomized
    #: [election_ticks, 2 * election_ticks) ticks starts an election.
    election_ticks: int = 10
    #: A leader sends heartbeats every heartbeat_ticks.
    heartbeat_ticks: int = 1
    #: Ask for votes first without raising the term, so a node that was cut off cannot
    #: depose a healthy leader when it comes back.
    pre_vote: bool = True
    #: A leader that has not heard from a majority in an election timeout steps down, and
    #: followers that hear from a leader ignore vote requests (vote stickiness).
    check_quorum: bool = True
    #: Appends in flight to one follower at a time (pipelining bound).
    max_inflight_appends: int = 8
    #: Bytes of entries in one append message (at least one entry is always sent).
    max_append_bytes: int = 1 << 20
    #: A learner is promoted only once its match index is within this many indexes of the
    #: leader's last index.
    promote_lag_indexes: int = 0

    def __post_init__(self) -> None:
        if self.heartbeat_ticks < 1 or self.election_ticks <= self.heartbeat_ticks:
            raise ValueError("need 1 <= heartbeat_ticks < election_ticks")
        if self.max_inflight_appends < 1 or self.max_append_bytes < 1:
            raise ValueError("max_inflight_appends and max_append_bytes must be positive")
