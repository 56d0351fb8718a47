"""Metadata barriers: "has this node applied every metadata entry committed before now?"

Raft's read index: a node asks the metadata group for the leader's commit index (confirmed by
a quorum); once it has applied up to that index, every barrier asked before the request
passes. Barriers are tickets: concurrent requests share one read index, a request lost on the
way is asked again after BARRIER_RETRY_MS. Pure: the node core drives it.
"""

from __future__ import annotations

import contextlib

from ..raft.raft import ProposalDropped, Raft

#: a metadata barrier (read index) not answered within this is asked again
BARRIER_RETRY_MS = 1_000


class Barriers:
    def __init__(self) -> None:
        self._next: list[int] = []  # tickets waiting to be asked
        self._asked: tuple[bytes, int, list[int]] | None = None  # (context, when, tickets)
        self._points: list[tuple[int, list[int]]] = []  # (read index to apply, tickets)
        self._seq = 0
        self.passed: list[int] = []  # tickets passed, for the next round to report
        self.passed_ms = -1  # when a barrier last passed

    def request(self) -> int:
        self._seq += 1
        self._next.append(self._seq)
        return self._seq

    def cancel(self, ticket: int) -> None:
        """The requester stopped waiting."""
        with contextlib.suppress(ValueError):
            self._next.remove(ticket)

    @property
    def waiting(self) -> bool:
        """Read indexes answered and not yet applied."""
        return bool(self._points)

    def ask(self, meta: Raft | None, now_ms: int) -> None:
        """Ask the metadata group for a read index for the tickets waiting."""
        asked = self._asked
        if asked is not None and now_ms - asked[1] >= BARRIER_RETRY_MS:
            self._next[:0] = asked[2]
            self._asked = asked = None
        if asked is not None or not self._next or meta is None:
            return
        context = f"barrier-{self._next[-1]}".encode()
        try:
            meta.read_index(context)
        except ProposalDropped:
            return  # no leader known (yet): the tickets wait, bounded by their timeouts
        self._asked = (context, now_ms, self._next)
        self._next = []

    def answered(self, read_states: list[tuple[bytes, int]]) -> None:
        asked = self._asked
        for context, index in read_states:
            if asked is not None and context == asked[0]:
                self._points.append((index, asked[2]))
                self._asked = None

    def release(self, applied_index: int, now_ms: int) -> None:
        """Pass the barriers whose read index this node has applied."""
        waiting = []
        for index, tickets in self._points:
            if index > applied_index:
                waiting.append((index, tickets))
                continue
            self.passed_ms = now_ms
            self.passed.extend(tickets)
        self._points = waiting
