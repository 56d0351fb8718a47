"""The transmit-limited queue of membership updates waiting to be piggybacked (memberlist's
TransmitLimitedQueue): one update per member, least-transmitted first, each sent at most
`limit` times."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Queued:
    encoded: bytes
    order: int  # larger is newer
    transmits: int = 0


class BroadcastQueue:
    """Bounded by construction: at most one queued update per member id."""

    def __init__(self) -> None:
        self._queued: dict[str, _Queued] = {}
        self._next_order = 0

    def __len__(self) -> int:
        return len(self._queued)

    def push(self, member_id: str, encoded: bytes) -> None:
        """Queue an update about `member_id`, replacing any older one about the same member."""
        self._queued[member_id] = _Queued(encoded, self._next_order)
        self._next_order += 1

    def discard(self, member_id: str) -> None:
        self._queued.pop(member_id, None)

    def transmits(self, member_id: str) -> int | None:
        queued = self._queued.get(member_id)
        return None if queued is None else queued.transmits

    def take(
        self, budget_bytes: int, max_count: int, limit: int, exclude: str | None = None
    ) -> list[bytes]:
        """Updates to piggyback within `budget_bytes`: fewest transmits first, then newest.
        Each taken update counts one transmit and leaves the queue at `limit`."""
        if not self._queued or budget_bytes <= 0 or max_count <= 0:
            return []
        ranked = sorted(
            (item for item in self._queued.items() if item[0] != exclude),
            key=lambda item: (item[1].transmits, -item[1].order),
        )
        taken: list[bytes] = []
        for member_id, queued in ranked:
            if len(taken) == max_count:
                break
            if len(queued.encoded) > budget_bytes:
                continue
            taken.append(queued.encoded)
            budget_bytes -= len(queued.encoded)
            queued.transmits += 1
            if queued.transmits >= limit:
                del self._queued[member_id]
        return taken
