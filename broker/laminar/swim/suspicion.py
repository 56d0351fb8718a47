"""Lifeguard's dynamic suspicion timeout (memberlist's suspicion.go), on the caller's clock.

A suspicion starts at the maximum timeout and shrinks towards the minimum as independent
members confirm it: timeout(n) = max(min, max - (max - min) * log(1 + n) / log(1 + k)) after
n confirmations, where k confirmations drive it to the minimum.
"""

from __future__ import annotations

import math


def suspicion_timeout_ms(confirmations: int, expected: int, min_ms: int, max_ms: int) -> int:
    """Total timeout (measured from the start of the suspicion) after `confirmations`."""
    if expected < 1:
        return min_ms
    fraction = math.log(confirmations + 1) / math.log(expected + 1)
    raw = max_ms - fraction * (max_ms - min_ms)
    return max(min_ms, math.floor(raw))


class Suspicion:
    """The suspicion timer of one member: who has accused it, and when it is declared dead."""

    __slots__ = ("_accusers", "confirmations", "expected", "max_ms", "min_ms", "start_ms")

    def __init__(
        self, accuser: str, expected: int, min_ms: int, max_ms: int, start_ms: int
    ) -> None:
        if not 0 < min_ms <= max_ms:
            raise ValueError("need 0 < min_ms <= max_ms")
        self.expected = expected
        self.min_ms = min_ms
        self.max_ms = max_ms
        self.start_ms = start_ms
        self.confirmations = 0
        # The first accuser is not a confirmation: our own suspicion may gossip back to us.
        self._accusers = {accuser}

    @property
    def deadline_ms(self) -> int:
        timeout = suspicion_timeout_ms(self.confirmations, self.expected, self.min_ms, self.max_ms)
        return self.start_ms + timeout

    def confirm(self, accuser: str) -> bool:
        """Count an accusation from `accuser`; True if it was new and shortened the timeout
        (worth re-gossiping), False for a repeat or once `expected` confirmations are in."""
        if self.confirmations >= self.expected or accuser in self._accusers:
            return False
        self._accusers.add(accuser)
        self.confirmations += 1
        return True
